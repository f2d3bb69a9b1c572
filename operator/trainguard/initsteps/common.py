"""What the init steps share that is not the pod contract: log lines and page-cache hints."""

from __future__ import annotations

import os
import time


def drop_page_cache(fd: int) -> bool:
    """Ask the kernel to forget a file's cached pages, so the next read comes from the disk.

    Only clean pages go, so call it after fsync. False where the hint is not available; on
    tmpfs it is accepted but has no effect (the pages are the storage).
    """
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (AttributeError, OSError):
        return False
    return True


def log(step: str, message: str) -> None:
    """One line to the step's log (stdout, which `kubectl logs` shows), with a wall-clock time."""
    print(f"{time.strftime('%H:%M:%S')} trainguard {step}: {message}", flush=True)
