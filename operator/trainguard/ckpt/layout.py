"""Names inside a checkpoint root, and the fsync and O_DIRECT helpers every writer uses.

A checkpoint root (an L1 directory, or a remote layer mounted as a directory) holds:

| entry | meaning |
|---|---|
| `step-<8 digits>/` | a checkpoint; valid only if its manifest verifies |
| `step-<8 digits>/rank-<5 digits>/` | in a sharded checkpoint (written by several ranks): the |
| | files of one rank, listed with that rank in the one global manifest |
| `.tmp-step-<8 digits>-<unique>/` | a checkpoint being written; never read, removable |
| `.deleting-step-<8 digits>-<unique>/` | a checkpoint being removed; never read, removable |
| `.invalid-step-<8 digits>-<unique>/` | an invalid checkpoint moved aside by a newer save of |
| | the same step; kept for inspection, never read |
| `.pin-step-<8 digits>-<unique>/step-<8 digits>/` | a checkpoint pinned while a remote |
| | layer ships it (hard links to its files, `pin`): keep-last-N may remove the checkpoint |
| | meanwhile; never read as a checkpoint, removed only by the shipper that made it |

Hidden names are never checkpoints, so nothing reading a root ever mistakes a half-written or
half-deleted directory for one.
"""

from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path

STEP_PREFIX = "step-"
STEP_DIGITS = 8
MAX_STEP = 10**STEP_DIGITS - 1
TMP_PREFIX = ".tmp-"
DELETING_PREFIX = ".deleting-"
INVALID_PREFIX = ".invalid-"
PIN_PREFIX = ".pin-"
RANK_PREFIX = "rank-"
RANK_DIGITS = 5
MAX_RANK = 10**RANK_DIGITS - 1
# O_DIRECT transfers must be aligned (memory, offset, length) to the device's logical block
# size; 4096 satisfies every common device. O_DIRECT is 0 where the platform lacks it.
DIRECT_IO_ALIGN = 4096
O_DIRECT: int = getattr(os, "O_DIRECT", 0)

_STEP_RE = re.compile(rf"^{STEP_PREFIX}(\d{{{STEP_DIGITS}}})$")
_RANK_RE = re.compile(rf"^{RANK_PREFIX}(\d{{{RANK_DIGITS}}})$")


def step_dirname(step: int) -> str:
    """The directory name of the checkpoint of `step`."""
    if not 0 <= step <= MAX_STEP:
        raise ValueError(f"step must be within 0..{MAX_STEP}, got {step}")
    return f"{STEP_PREFIX}{step:0{STEP_DIGITS}d}"


def parse_step_dirname(name: str) -> int | None:
    """The step of a checkpoint directory name, or None when the name is not one."""
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def rank_dirname(rank: int) -> str:
    """The directory of rank `rank`'s files inside a sharded checkpoint."""
    if not 0 <= rank <= MAX_RANK:
        raise ValueError(f"rank must be within 0..{MAX_RANK}, got {rank}")
    return f"{RANK_PREFIX}{rank:0{RANK_DIGITS}d}"


def parse_rank_dirname(name: str) -> int | None:
    """The rank of a rank directory name, or None when the name is not one."""
    match = _RANK_RE.match(name)
    return int(match.group(1)) if match else None


def hidden_name(prefix: str, step: int) -> str:
    """A unique hidden name (`prefix` + step dirname + pid and clock) for a temporary directory."""
    return f"{prefix}{step_dirname(step)}-{os.getpid()}-{time.time_ns()}"


def open_direct(path: str | os.PathLike[str], flags: int) -> int | None:
    """Open with O_DIRECT added; None where the platform or the filesystem does not support it."""
    if not O_DIRECT:
        return None
    try:
        return os.open(path, flags | os.O_CLOEXEC | O_DIRECT)
    except OSError as error:
        if error.errno == errno.EINVAL:  # this filesystem has no O_DIRECT
            return None
        raise


def fsync_path(path: Path) -> None:
    """Make a file or directory durable by path (for a directory: its entries become durable)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
