"""What another thread could do with a GPU lock right now: the tests' view of who holds it."""

from __future__ import annotations

import threading
import time

from core.verification.devicelock import DeviceLock, DeviceLockTimeout


def could_take(lock: DeviceLock, exclusive: bool, wait_s: float) -> bool:
    """Whether another thread could take ``lock`` (alone, or shared) within ``wait_s``."""
    got: list[bool] = []

    def ask() -> None:
        try:
            with (lock.exclusive if exclusive else lock.shared)(time.monotonic() + wait_s):
                got.append(True)
        except DeviceLockTimeout:
            got.append(False)

    thread = threading.Thread(target=ask)
    thread.start()
    thread.join()
    return got[0]
