"""Waking the agent between its looks when the supervisor's state changes.

The agent looks every `monitor.intervalSeconds`. A death must not wait for the next look: the
supervisor sees its child end at once and rewrites `supervisor.json` (state `backoff`, no child),
so the agent sleeps on that file instead of on a clock. `StateFileWake.wait(timeout)` returns
as soon as the file is replaced (or after `timeout`), through Linux inotify on the state
directory: no polling, no cost while nothing happens. Only the named file wakes it; the
heartbeat, rewritten every step, does not.

Where inotify is not available (another OS, a kernel without it, a limit of watches reached)
the wait is a plain sleep: the agent then sees the change at its next look, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import struct
import time
from pathlib import Path

# <sys/inotify.h>: the events of a file written in place and of one renamed into the directory
# (`write_atomic` replaces a state file by a rename).
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (then the name, NUL-padded)
READ_BYTES = 64 * 1024


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


def names_in(events: bytes) -> list[str]:
    """The file names of a buffer of inotify events, in order."""
    names = []
    offset = 0
    while offset + EVENT_HEADER.size <= len(events):
        _wd, _mask, _cookie, length = EVENT_HEADER.unpack_from(events, offset)
        start = offset + EVENT_HEADER.size
        names.append(events[start : start + length].rstrip(b"\0").decode(errors="replace"))
        offset = start + length
    return names


class StateFileWake:
    """Sleeps until `path` is replaced or written, or a timeout passes (see the module)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        libc = _libc()
        if libc is None or not hasattr(libc, "inotify_init1"):
            return
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return
        directory = os.fsencode(path.parent)
        if libc.inotify_add_watch(fd, directory, IN_CLOSE_WRITE | IN_MOVED_TO) < 0:
            os.close(fd)
            return
        self._fd = fd

    @property
    def watching(self) -> bool:
        """Whether changes wake the wait (inotify works here), not only the timeout."""
        return self._fd is not None

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` s; True when the file changed meanwhile (the wait was cut)."""
        deadline = time.monotonic() + max(0.0, timeout)
        if self._fd is None:
            time.sleep(max(0.0, timeout))
            return False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self._fd], [], [], left)
            if ready and self._drain():
                return True

    def _drain(self) -> bool:
        """Read the pending events; whether one was about the watched file."""
        assert self._fd is not None
        hit = False
        with contextlib.suppress(BlockingIOError):
            while True:
                events = os.read(self._fd, READ_BYTES)
                if not events:
                    break
                hit = hit or self.path.name in names_in(events)
        return hit

    def close(self) -> None:
        """Stop watching."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
