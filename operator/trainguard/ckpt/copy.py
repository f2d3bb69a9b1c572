"""Copying a checkpoint between roots (shipping to a directory layer, restoring into L1).

The source is verified while it is copied: each file is hashed as it is read, and the copy is
committed only if every hash matches the source manifest. The destination is written with the
same transaction as any other checkpoint, so a copy interrupted at any point leaves nothing
that could be read as a checkpoint. A sharded checkpoint stays sharded: each rank's files are
copied into that rank's shard and reported (`CheckpointTransaction.create_as`), so the copy's
manifest records the same world size and the same rank for every file.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from trainguard.ckpt.hashing import CHUNK_BYTES, new_hasher
from trainguard.ckpt.manifest import Contents
from trainguard.ckpt.txn import CheckpointTransaction, Committed
from trainguard.ckpt.verify import Problem, verify


class CheckpointInvalidError(RuntimeError):
    """The source checkpoint does not verify (before or during the copy): its problems."""

    def __init__(self, source: str | os.PathLike[str], problems: tuple[Problem, ...]) -> None:
        super().__init__(f"{source}: " + "; ".join(str(problem) for problem in problems))
        self.source = source
        self.problems = problems

    def __reduce__(self) -> tuple[type[CheckpointInvalidError], tuple[object, ...]]:
        # Picklable whole: a distributed reader sends it from the rank that found it to all.
        return (type(self), (self.source, self.problems))


def copy_checkpoint(
    source: str | os.PathLike[str],
    dest_root: str | os.PathLike[str],
    *,
    paths: Collection[str] | None = None,
    contents: Contents | None = None,
) -> Committed:
    """Copy the checkpoint directory `source` into `dest_root` as `step-<N>/`.

    `paths` selects a subset of the files (for example only the weights); `contents` then says
    what the subset is (it defaults to the source's contents when every file is copied).
    """
    quick = verify(source, check_hashes=False)
    if quick.manifest is None or not quick.ok:
        raise CheckpointInvalidError(source, quick.problems)
    manifest = quick.manifest
    entries = [entry for entry in manifest.files if paths is None or entry.path in paths]
    missing = set(paths or ()) - {entry.path for entry in entries}
    if missing:
        raise ValueError(f"{source}: no such files in the checkpoint: {sorted(missing)}")
    if contents is None:
        if len(entries) != len(manifest.files):
            raise ValueError("a partial copy must say what it contains (contents=...)")
        contents = manifest.contents
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    with CheckpointTransaction(
        dest_root,
        manifest.step,
        contents=contents,
        algorithm=manifest.hash_algorithm,
        metadata=manifest.metadata,
        world_size=manifest.world_size,
    ) as txn:
        for entry in entries:
            source_hasher = new_hasher(manifest.hash_algorithm)
            with (
                Path(source, entry.path).open("rb", buffering=0) as reader,
                txn.create_as(entry) as writer,
            ):
                while count := reader.readinto(view):
                    source_hasher.update(view[:count])
                    writer.write(view[:count])
            if source_hasher.hexdigest() != entry.hash:
                corrupt = Problem(entry.path, f"{manifest.hash_algorithm} hash mismatch")
                raise CheckpointInvalidError(source, (corrupt,))
        # Every rank reports, those without a selected file too (a weights-only copy).
        txn.report_copied_shards()
        return txn.commit(timestamp=manifest.time)
