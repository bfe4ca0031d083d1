"""What the red-team tests share: the file a sandbox escape would write, and a lock around it.

The naive judge runs candidates without a sandbox, so its run of ``write_outside_scratch`` really
writes ``ESCAPE``; under ``pytest -n`` that would make another worker's "nothing escaped" check see
a file our verifier never let through. The naive run of a writing candidate holds the lock
exclusively and removes the file before letting go; each verdict's check holds it shared."""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ESCAPE = Path("/tmp/kz_redteam_escape.pt")
_LOCK = Path("/tmp/kz_redteam_escape.lock")


@contextmanager
def escape_lock(exclusive: bool) -> Iterator[None]:
    with open(_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            if exclusive:
                ESCAPE.unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)
