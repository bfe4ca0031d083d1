"""Moved to :mod:`core.verification.evidence`; this path is kept for one release (check plugins import it)."""

import warnings

from core.verification.evidence import *  # noqa: F403
from core.verification.evidence import Evidence, compare_outputs, tolerance  # noqa: F401
from core.verification.outliers import *  # noqa: F403

warnings.warn("core.evidence moved to core.verification.evidence; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
