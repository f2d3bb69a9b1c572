"""What the init steps share that is not the pod contract: log lines, byte counts, page cache."""

from __future__ import annotations

import os
import time

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


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


def human_bytes(count: float) -> str:
    """A byte count for a log line: 1.5 GiB, 340.0 MiB, 12 B."""
    value, unit = float(count), 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{value:.0f} B" if unit == 0 else f"{value:.1f} {_UNITS[unit]}"
