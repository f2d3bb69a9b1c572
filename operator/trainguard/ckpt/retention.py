"""Keep-last-N retention for a checkpoint root.

Rules (DESIGN.md "Checkpoints"): the newest N checkpoints that verify are kept; older valid
ones are removed; invalid ones are never removed here, only reported; and because only
checkpoints older than N fully verified ones are candidates, the newest verified checkpoint is
never removed before a newer one has verified. An older one is checked by its manifest and
sizes only (reading it whole before removing it would cost a full read of every checkpoint):
one whose hashes a reader found wrong is named by the caller (`known_invalid`) and kept too.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.ckpt.layout import DELETING_PREFIX, TMP_PREFIX, fsync_path, hidden_name
from trainguard.ckpt.verify import Verification, list_checkpoint_dirs, verify


@dataclass(frozen=True)
class PruneResult:
    """What `prune()` did: kept (newest first), deleted, and invalid checkpoints left in place."""

    kept: tuple[Path, ...]
    deleted: tuple[Path, ...]
    invalid: tuple[Verification, ...]


def remove_checkpoint_dir(path: Path, step: int) -> None:
    """Remove a checkpoint directory so that no half-removed state is ever read.

    It is first renamed to a hidden name (atomic, made durable), then its files are removed.
    """
    doomed = path.parent / hidden_name(DELETING_PREFIX, step)
    os.rename(path, doomed)
    fsync_path(path.parent)
    shutil.rmtree(doomed)


def prune(
    root: str | os.PathLike[str],
    keep_last: int,
    *,
    verified: Collection[Path] = (),
    known_invalid: Collection[Path] = (),
) -> PruneResult:
    """Apply keep-last-N to `root` (see the module docstring for the rules).

    `verified` names checkpoints the caller has just verified in full (a writer reading back
    what it wrote): their hashes are not read again. `known_invalid` names checkpoints the
    caller found invalid (a reader's hash mismatch, already reported): never removed nor counted.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last}")
    kept: list[Path] = []
    deleted: list[Path] = []
    invalid: list[Verification] = []
    for step, path in list_checkpoint_dirs(root):
        if path in known_invalid:
            continue
        # Only the N kept ones need their hashes checked; an older one just needs to look
        # complete (manifest and sizes) to be recognised as a superseded checkpoint.
        result = verify(path, check_hashes=len(kept) < keep_last and path not in verified)
        if not result.ok:
            invalid.append(result)
        elif len(kept) < keep_last:
            kept.append(path)
        else:
            remove_checkpoint_dir(path, step)
            deleted.append(path)
    return PruneResult(kept=tuple(kept), deleted=tuple(deleted), invalid=tuple(invalid))


def remove_partials(root: str | os.PathLike[str]) -> tuple[Path, ...]:
    """Remove the hidden leftovers of interrupted saves and removals; return what was removed.

    Only for the writers of a root at their start, before any of them saves: a leftover of a
    writer still running would be removed under its feet. The ranks of one launch, each with a
    writer on the same root, may remove the same leftovers at once: a file or directory another
    removed first is gone already, which is what was wanted. Quarantined `.invalid-` directories
    are not touched, nor are pins (`.pin-`): they belong to the shipper, which may be uploading
    one (`pin`).
    """
    base = Path(root)
    if not base.is_dir():
        return ()
    removed = []
    for child in sorted(base.iterdir()):
        if child.name.startswith((TMP_PREFIX, DELETING_PREFIX)) and child.is_dir():
            shutil.rmtree(child, onerror=_unless_gone_already)
            removed.append(child)
    return tuple(removed)


def _unless_gone_already(function: object, path: str, excinfo: Any) -> None:
    """`shutil.rmtree`'s error handler: re-raise, unless another process removed it first."""
    del function, path
    if not isinstance(excinfo[1], FileNotFoundError):
        raise excinfo[1]
