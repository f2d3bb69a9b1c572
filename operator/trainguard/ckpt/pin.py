"""Pinning a checkpoint while it is read, so that keep-last-N can remove it meanwhile.

The agent's shipper uploads from L1 while the trainer's writer applies keep-last-N there; an
upload slower than the checkpoint cadence would otherwise find the files of its checkpoint
removed under it. A pin is a hidden directory of the same root,
`.pin-step-<8 digits>-<unique>/step-<8 digits>/`, holding hard links to the checkpoint's
files: removing the checkpoint then removes names, not the data, and the pinned copy stays
whole until its reader unpins it. Where a link is refused (the kernel's protected hard links
refuse a user who may not write the file; another filesystem), the files are copied instead,
every byte checked against the manifest. A pinned checkpoint costs disk space only once
keep-last-N has removed the original, which the pod's disk sizing allows for.

Only the pin's maker removes it (`unpin_checkpoint`), and its leftovers of an earlier run
(`remove_pins`, at its start); the writer's `remove_partials` leaves pins alone.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from pydantic import ValidationError

from trainguard.ckpt.copy import CheckpointInvalidError, copy_checkpoint
from trainguard.ckpt.layout import PIN_PREFIX, hidden_name, parse_step_dirname
from trainguard.ckpt.manifest import MANIFEST_FILENAME, Manifest
from trainguard.ckpt.verify import Problem, verify

# Checkpoints one shipper pins at most at once: it uploads at most this many at a time, one pin
# each (layers shipping the same checkpoint share its pin).
MAX_PINNED = 2
# A hard link refused for these reasons is replaced by a copy: not permitted (protected hard
# links, a filesystem without links), another filesystem, too many links to one file.
LINK_REFUSED = frozenset({errno.EPERM, errno.EACCES, errno.EXDEV, errno.EMLINK, errno.ENOTSUP})


def room_in_checkpoints(keep_last: int, remote_layers: int) -> int:
    """How many checkpoints an L1 root must have room for.

    The kept ones, the one being written, and one per checkpoint pinned while remote layers
    ship it (each may outlive its removal by keep-last-N until its upload ends).
    """
    return keep_last + 1 + min(remote_layers, MAX_PINNED)


def pin_checkpoint(checkpoint: Path) -> Path:
    """Pin the checkpoint directory `checkpoint` (`step-<8 digits>/`); return the pinned copy.

    The pinned copy verifies (manifest and sizes; a copy also by every hash). Raises
    FileNotFoundError when the checkpoint is gone (removed since its caller found it),
    CheckpointInvalidError when it does not verify, OSError on any other failure; a failed
    pin leaves nothing behind.
    """
    step = parse_step_dirname(checkpoint.name)
    if step is None:
        raise ValueError(f"{checkpoint}: not a checkpoint directory name")
    holder = checkpoint.parent / hidden_name(PIN_PREFIX, step)
    pinned = holder / checkpoint.name
    try:
        holder.mkdir()
        try:
            _link_files(checkpoint, pinned)
        except OSError as error:
            if error.errno not in LINK_REFUSED:
                raise
            shutil.rmtree(pinned, ignore_errors=True)
            copy_checkpoint(checkpoint, holder)
        result = verify(pinned, check_hashes=False)
        if not result.ok:
            raise CheckpointInvalidError(checkpoint, result.problems)
    except BaseException:
        shutil.rmtree(holder, ignore_errors=True)
        raise
    return pinned


def _link_files(checkpoint: Path, pinned: Path) -> None:
    """Hard-link the manifest, then every file it lists, into `pinned`."""
    pinned.mkdir()
    os.link(checkpoint / MANIFEST_FILENAME, pinned / MANIFEST_FILENAME)
    # The linked manifest is the one whose files are pinned, whatever happens to the original.
    try:
        manifest = Manifest.from_json_bytes((pinned / MANIFEST_FILENAME).read_bytes())
    except ValidationError as error:
        malformed = Problem(None, f"malformed {MANIFEST_FILENAME}")
        raise CheckpointInvalidError(checkpoint, (malformed,)) from error
    for entry in manifest.files:
        target = pinned / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(checkpoint / entry.path, target)


def unpin_checkpoint(pinned: Path) -> None:
    """Remove a pin made by `pin_checkpoint` (the original checkpoint is not touched)."""
    holder = pinned.parent
    if not holder.name.startswith(PIN_PREFIX):
        raise ValueError(f"{pinned}: not a pinned checkpoint")
    shutil.rmtree(holder)


def remove_pins(root: str | os.PathLike[str]) -> tuple[Path, ...]:
    """Remove every pin in `root`; return what was removed.

    Only for the one maker of pins in a root, at its start: a pin of a reader still running
    would be removed under its feet.
    """
    base = Path(root)
    if not base.is_dir():
        return ()
    removed = []
    for child in sorted(base.iterdir()):
        if child.name.startswith(PIN_PREFIX) and child.is_dir():
            shutil.rmtree(child)
            removed.append(child)
    return tuple(removed)
