"""Moved to :mod:`core.verification.executor`; this path is kept for one release."""

import warnings

from core.verification.executor import *  # noqa: F403
from core.verification.executor import BaseExecutor, executor_for_run, make_executor  # noqa: F401

warnings.warn("core.executor moved to core.verification.executor; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
