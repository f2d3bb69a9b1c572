"""Stack dumps on demand: SIGUSR1 writes every thread's Python stack to a file in the state dir.

The pod agent sends SIGUSR1 to a trainer it finds hung and reads the file (`stacks-<pid>.txt`,
appended to on each signal) before any kill, without needing ptrace. The same file receives
faulthandler's report of a fatal signal (SIGSEGV, SIGABRT, ...), so a silent death leaves a
stack behind.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from pathlib import Path
from typing import TextIO

from trainguard.contract.env import PodEnv

DUMP_SIGNAL = signal.SIGUSR1

# faulthandler writes to the file descriptor: the file object must stay open for the process.
_dump_file: TextIO | None = None


def stacks_path(state_dir: str | os.PathLike[str], pid: int) -> Path:
    """Where process `pid` dumps its stacks."""
    return PodEnv(state_dir=Path(state_dir)).stacks_file(pid)


def install_stack_dumps(state_dir: str | os.PathLike[str]) -> Path:
    """Register the SIGUSR1 dump (and fatal-signal reports) for this process; return the file."""
    global _dump_file
    path = stacks_path(state_dir, os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    if _dump_file is not None and Path(_dump_file.name) == path:
        return path
    dump_file = path.open("a")
    faulthandler.register(DUMP_SIGNAL, file=dump_file, all_threads=True, chain=False)
    faulthandler.enable(file=dump_file, all_threads=True)
    if _dump_file is not None:
        _dump_file.close()
    _dump_file = dump_file
    return path
