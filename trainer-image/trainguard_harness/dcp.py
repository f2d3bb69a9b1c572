"""`torch.distributed.checkpoint` (DCP) in trainguard's verified checkpoint format.

One line of user code saves an FSDP2 or DTensor state dict as a sharded trainguard checkpoint
(`trainguard.ckpt`: one global manifest written last, every file hashed)::

    dcp.save(state_dict, storage_writer=trainguard_writer(l1_dir, step))
    dcp.async_save(state_dict, storage_writer=trainguard_writer(l1_dir, step))
    dcp.load(state_dict, storage_reader=trainguard_reader(l1_dir / step_dirname(step)))

How a save maps onto DCP's steps (every rank runs one writer; rank 0 coordinates):

- global plan (coordinator): opens the `CheckpointTransaction` (a hidden temporary directory
  in `l1_dir`) with the world size, and tells every rank where it is through its plan;
- write_data (every rank): DCP's own file writer, with every file it creates going through the
  rank's `ShardWriter` into `rank-<k>/` of that directory (hashed with the project's default
  algorithm as it is written, fsynced); the rank's WriteResults carry each file's size and hash;
- finish (coordinator): records every rank's files (`add_shard`: each exists with its reported
  size), writes DCP's `.metadata` as a global file, then the manifest last, and renames the
  directory to `step-<8 digits>/`. A save killed before that leaves only the hidden directory:
  not a checkpoint, and removable once no save is under way (`remove_partials`; not done
  here, so that a save never removes another one still in flight).

`async_save` stages the state into CPU memory with DCP's own stager (the writer is a
`FileSystemWriter`), then the same writer persists it in DCP's background thread.

The reader verifies before DCP reads anything: on every rank the manifest, the sizes and the
hash of `.metadata` (read once, checked, then unpickled); on the coordinator every file's hash,
before the read plan goes out. An invalid checkpoint is refused (`CheckpointInvalidError`,
naming each bad file and the rank that wrote it), on every rank through DCP's own error path.
The DCP metadata holds DCP's ordinary storage records, so `FileSystemReader` reads the
directory too (without the verification).
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import JsonValue
from torch.distributed.checkpoint.filesystem import (
    CURRENT_DCP_VERSION,
    FileSystem,
    FileSystemReader,
    FileSystemWriter,
)
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from trainguard.ckpt import (
    DEFAULT_ALGORITHM,
    CheckpointInvalidError,
    CheckpointTransaction,
    Committed,
    Contents,
    FileEntry,
    Problem,
    ShardWriter,
    Verification,
    new_hasher,
    rank_dirname,
    step_dirname,
    verify,
)
from trainguard.ckpt.hashing import canonical_algorithm
from trainguard.ckpt.txn import HashedFileWriter
from trainguard_harness.writer import META_PRODUCER

PRODUCER = "trainguard-dcp"
META_DCP_VERSION = "dcp_version"
# The name DCP's FileSystemReader reads its metadata from (torch.distributed.checkpoint.filesystem).
DCP_METADATA_FILENAME = ".metadata"


@dataclass(frozen=True)
class ShardPlan:
    """What the coordinator tells each rank in its plan: where and under which names to write."""

    rank: int
    tmp_dir: str
    # DCP's file name prefix (FileSystemWriter names files `<prefix><n>.distcp`).
    prefix: str


@dataclass(frozen=True)
class HashedItem:
    """One written item: DCP's own storage record, and the file holding it as its rank wrote it."""

    info: Any  # DCP's per-item storage record (relative path, offset, length)
    file: FileEntry


class ShardStream(io.RawIOBase):
    """A file DCP writes, through the rank's `ShardWriter`: hashed as written, fsynced on close.

    The file is created on the first write, so a bucket with nothing in it (DCP opens one file
    per writer thread) leaves no file behind that no item names.
    """

    def __init__(self, shard: ShardWriter, relpath: str) -> None:
        super().__init__()
        self._shard = shard
        self._relpath = relpath
        self._writer: HashedFileWriter | None = None

    def writable(self) -> bool:
        """DCP only writes these streams."""
        return True

    def write(self, data: Any) -> int:
        """Append `data` (any buffer); return its length."""
        if self._writer is None:
            self._writer = self._shard.create(self._relpath)
        view = memoryview(data)
        self._writer.write(view)
        return view.nbytes

    def tell(self) -> int:
        """The offset of the next write (DCP records each item's offset)."""
        return 0 if self._writer is None else self._writer.size

    def close(self) -> None:
        """Fsync and close the file, recording it in the rank's shard."""
        if self.closed:
            return
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                writer.close()
        finally:
            super().close()

    def discard(self) -> None:
        """Close without recording (the write failed)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.discard()
        super().close()


class ShardFileSystem(FileSystem):
    """DCP's file system, creating files for writing through the rank's `ShardWriter`."""

    def __init__(self) -> None:
        super().__init__()
        self.shard: ShardWriter | None = None

    @contextmanager
    def create_stream(
        self, path: str | os.PathLike[str], mode: str
    ) -> Generator[io.IOBase, None, None]:
        """A `ShardStream` for a file to write, an ordinary file for anything else."""
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        if self.shard is None:
            raise RuntimeError("a trainguard DCP writer writes files only within write_data")
        relpath = Path(path).relative_to(self.shard.directory).as_posix()
        stream = ShardStream(self.shard, relpath)
        try:
            yield stream
        except BaseException:
            stream.discard()
            raise
        stream.close()


class TrainguardWriter(FileSystemWriter):
    """A DCP storage writer whose checkpoint is `root/step-<8 digits>/` in trainguard's format.

    See the module docstring for the protocol. One writer saves one step; `committed` says
    what the coordinator's finish made durable.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        step: int,
        *,
        contents: Contents = Contents.FULL,
        algorithm: str = DEFAULT_ALGORITHM,
        metadata: dict[str, JsonValue] | None = None,
        thread_count: int = 1,
    ) -> None:
        new_hasher(algorithm)  # an unknown name fails here, before any collective
        self.root = Path(root)
        self.step = step
        self.target = self.root / step_dirname(step)
        # The trainguard transaction fsyncs every file and directory itself.
        super().__init__(self.target, sync_files=False, thread_count=thread_count)
        self._files = ShardFileSystem()
        self.fs = self._files
        self.contents = contents
        self.algorithm = canonical_algorithm(algorithm)
        self.metadata: dict[str, JsonValue] = {
            META_PRODUCER: PRODUCER,
            META_DCP_VERSION: CURRENT_DCP_VERSION,
            **(metadata or {}),
        }
        self._txn: CheckpointTransaction | None = None
        self.committed: Committed | None = None

    @property
    def checkpoint_id(self) -> Path:
        """The checkpoint's directory once committed (DCP records it in the storage meta)."""
        return self.target

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """A new save begins; the directory comes from the step, not from `checkpoint_id`."""
        if checkpoint_id and Path(checkpoint_id) != self.target:
            raise ValueError(
                f"this writer saves step {self.step} to {self.target}, not to {checkpoint_id}"
            )
        super().reset()
        self.committed = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Refuse a save without collectives: only a coordinator can write the global manifest."""
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        if not self.use_collectives:
            raise ValueError("a trainguard checkpoint needs collectives (use_collectives=True)")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Tell the coordinator which step this rank saves (they must all agree)."""
        return dataclasses.replace(plan, storage_data=self.step)

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Open the transaction and tell every rank its directory and file names."""
        steps = {plan.storage_data for plan in plans}
        if steps != {self.step}:
            raise ValueError(f"the ranks save different steps: {sorted(steps)}")
        self._txn = CheckpointTransaction(
            self.root,
            self.step,
            contents=self.contents,
            algorithm=self.algorithm,
            metadata=self.metadata,
            world_size=len(plans),
        )
        tmp_dir = str(self._txn.tmp_dir)
        return [
            dataclasses.replace(
                plan,
                storage_data=ShardPlan(rank, tmp_dir, f"{rank_dirname(rank)}/__{rank}_"),
            )
            for rank, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's items with DCP's writer; report each file's size and hash."""
        shard_plan: ShardPlan = plan.storage_data
        shard = ShardWriter(shard_plan.tmp_dir, shard_plan.rank, algorithm=self.algorithm)
        self._files.shard = shard
        self.path = Path(shard_plan.tmp_dir)
        try:
            written = super().write_data(plan, planner)
            written.wait()
            results: list[WriteResult] = written.value()
        finally:
            self._files.shard = None
            self.path = self.target
        files = {entry.path: entry for entry in shard.close()}
        hashed = [
            WriteResult(
                index=result.index,
                size_in_bytes=result.size_in_bytes,
                storage_data=HashedItem(
                    result.storage_data, files[result.storage_data.relative_path]
                ),
            )
            for result in results
        ]
        future: Future[list[WriteResult]] = Future()
        future.set_result(hashed)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Record every rank's files, write DCP's metadata, then the manifest last; commit."""
        txn = self._txn
        if txn is None:
            raise RuntimeError("finish() before prepare_global_plan()")
        self._txn = None
        with txn:
            storage: dict[MetadataIndex, Any] = {}
            for rank, rank_results in enumerate(results):
                files: dict[str, FileEntry] = {}
                for result in rank_results:
                    item: HashedItem = result.storage_data
                    storage[result.index] = item.info
                    files[item.file.path] = item.file
                txn.add_shard(rank, files.values())
            metadata.version = CURRENT_DCP_VERSION
            metadata.storage_data = storage
            metadata.storage_meta = self.storage_meta()
            with txn.create(DCP_METADATA_FILENAME) as out:
                out.write(pickle.dumps(metadata))
            self.committed = txn.commit()


class TrainguardReader(FileSystemReader):
    """A DCP storage reader that refuses a checkpoint that does not verify (module docstring)."""

    def __init__(self, checkpoint: str | os.PathLike[str]) -> None:
        super().__init__(checkpoint)
        self.checkpoint = Path(checkpoint)
        self.verification: Verification | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """A new load begins (of `checkpoint_id` when given)."""
        super().reset(checkpoint_id)
        if checkpoint_id:
            self.checkpoint = Path(checkpoint_id)
        self.verification = None

    def _refuse(self, *problems: Problem) -> CheckpointInvalidError:
        return CheckpointInvalidError(self.checkpoint, problems)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's metadata, once the manifest, the sizes and the metadata's own hash check out."""
        if kwargs.get("rank") is not None:
            # DCP falls back to a rank's own metadata when the global one fails: there is none.
            raise self._refuse(Problem(None, "rank-local DCP metadata is never part of it"))
        quick = verify(self.checkpoint, check_hashes=False)
        if quick.manifest is None or not quick.ok:
            raise self._refuse(*quick.problems)
        manifest = quick.manifest
        entry = next((e for e in manifest.files if e.path == DCP_METADATA_FILENAME), None)
        if entry is None:
            raise self._refuse(Problem(None, f"no {DCP_METADATA_FILENAME}: not saved through DCP"))
        raw = (self.checkpoint / DCP_METADATA_FILENAME).read_bytes()
        hasher = new_hasher(manifest.hash_algorithm)
        hasher.update(raw)
        if (len(raw), hasher.hexdigest()) != (entry.size, entry.hash):
            mismatch = f"{manifest.hash_algorithm} hash mismatch"
            raise self._refuse(Problem(DCP_METADATA_FILENAME, mismatch))
        metadata: Metadata = pickle.loads(raw)
        storage_meta = metadata.storage_meta or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """The coordinator verifies every file's hash before any rank reads."""
        if is_coordinator:
            self.verification = verify(self.checkpoint)
            if not self.verification.ok:
                raise self._refuse(*self.verification.problems)
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)


def trainguard_writer(
    root: str | os.PathLike[str],
    step: int,
    *,
    contents: Contents = Contents.FULL,
    metadata: dict[str, JsonValue] | None = None,
    thread_count: int = 1,
) -> TrainguardWriter:
    """The storage writer for `dcp.save`/`dcp.async_save` of `step` into the root `root` (L1)."""
    return TrainguardWriter(
        root, step, contents=contents, metadata=metadata, thread_count=thread_count
    )


def trainguard_reader(checkpoint: str | os.PathLike[str]) -> TrainguardReader:
    """The storage reader for `dcp.load` of the checkpoint directory `checkpoint`."""
    return TrainguardReader(checkpoint)
