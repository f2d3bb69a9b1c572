"""Writing one checkpoint as a transaction: nothing is visible until everything is durable.

Order of operations (the contract in DESIGN.md "Checkpoints")::

    mkdir  .tmp-step-N-<unique>/          hidden: never read as a checkpoint
    write  every file, hashing the bytes as they are written; fsync; close
    fsync  the temporary directory        its entries are durable
    write  MANIFEST.json; fsync           written last: its presence implies all of the above
    rename .tmp-step-N-<unique>/ -> step-N/
    fsync  the root                       the rename is durable

A sharded checkpoint (several ranks, one checkpoint) follows the same order with one more
party. The coordinator opens the transaction with the `world_size`; every rank, itself included,
writes its files into `rank-<k>/` of the coordinator's temporary directory through a
`ShardWriter` (hashing as it writes, fsyncing every file and its directory) and hands the
coordinator the entries it wrote; the coordinator records each rank's report (`add_shard`:
the files exist with the reported sizes), adds the global files, and commits: the manifest is
written only once every rank has reported, so a rank that died mid-save leaves only a hidden
temporary directory behind, never a checkpoint.

Large aligned buffers can be written with O_DIRECT (`create(..., direct=True)`), bypassing the
page cache. Every write, fsync and close error propagates (ENOSPC and EIO included): a save
that cannot be made durable fails loudly and leaves the temporary directory for `abort()` to
remove, so the previous checkpoint is untouched.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from threading import Lock
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from pydantic import JsonValue

from trainguard.ckpt.hashing import (
    CHUNK_BYTES,
    DEFAULT_ALGORITHM,
    canonical_algorithm,
    new_hasher,
)
from trainguard.ckpt.layout import (
    DELETING_PREFIX,
    DIRECT_IO_ALIGN,
    INVALID_PREFIX,
    TMP_PREFIX,
    fsync_path,
    hidden_name,
    open_direct,
    rank_dirname,
    step_dirname,
)
from trainguard.ckpt.manifest import (
    FORMAT_VERSION,
    MANIFEST_FILENAME,
    Contents,
    FileEntry,
    Manifest,
)
from trainguard.ckpt.verify import Problem, verify

if TYPE_CHECKING:
    from typing_extensions import Buffer

# Group-writable as far as the process's umask allows (a pod's programs share theirs with the
# pod's group, `trainguard.contract.files.share_with_pod`): the agent, another user of that
# group, pins a checkpoint by hard-linking its files, which the kernel's protected hard links
# allow only to a user who may write the file. The files are never written after the commit.
FILE_MODE = 0o664


class CheckpointWriteError(RuntimeError):
    """A checkpoint transaction was used out of order."""


def buffer_address(view: memoryview) -> int | None:
    """The memory address of a writable buffer, or None for a read-only or empty one."""
    if not view or view.readonly:
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class FileOwner(Protocol):
    """What a file being written reports to: a transaction, or one rank's `ShardWriter`."""

    @property
    def algorithm(self) -> str:
        """The hash algorithm of the checkpoint."""
        ...

    @property
    def rank(self) -> int | None:
        """The rank whose file it is (None: a global or single writer's file)."""
        ...

    def _record(self, entry: FileEntry) -> None: ...


class HashedFileWriter:
    """A file of a checkpoint being written: hashes every byte written, fsyncs on close.

    With `direct=True` the writer also opens the file with O_DIRECT, and writes the aligned
    part of every block-aligned buffer at a block-aligned offset through it: the bytes go from
    the caller's memory to the device without a copy into the page cache (less CPU and memory
    traffic taken from training, and a later read-back verification reads the device, not a
    cached copy). The rest goes through the page cache. Where O_DIRECT is not supported the
    writer silently uses the page cache for everything.
    """

    def __init__(self, owner: FileOwner, relpath: str, path: Path, *, direct: bool = False) -> None:
        self._owner = owner
        self._relpath = relpath
        self._hasher = new_hasher(owner.algorithm)
        self._size = 0
        self._fd: int | None = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE
        )
        self._direct_fd: int | None = None
        if direct:
            try:
                self._direct_fd = open_direct(path, os.O_WRONLY)
            except OSError:
                self.discard()
                raise

    @property
    def direct(self) -> bool:
        """Whether aligned writes bypass the page cache."""
        return self._direct_fd is not None

    @property
    def size(self) -> int:
        """Bytes written so far (the offset of the next write)."""
        return self._size

    def _write_at(self, fd: int, view: memoryview) -> None:
        for start in range(0, len(view), CHUNK_BYTES):
            # Hash each chunk just before writing it, while it is still in the CPU caches.
            chunk = view[start : start + CHUNK_BYTES]
            self._hasher.update(chunk)
            while chunk:
                # A write may be short (signals, a filling disk); loop until all is out.
                written = os.pwrite(fd, chunk, self._size)
                chunk = chunk[written:]
                self._size += written

    def write(self, data: Buffer) -> None:
        """Append all of `data` (any buffer); see the class docstring for O_DIRECT."""
        if self._fd is None:
            raise CheckpointWriteError(f"{self._relpath} is already closed")
        view = memoryview(data).cast("B")
        address = buffer_address(view)
        aligned = 0
        if (
            self._direct_fd is not None
            and address is not None
            and address % DIRECT_IO_ALIGN == 0
            and self._size % DIRECT_IO_ALIGN == 0
        ):
            aligned = len(view) - len(view) % DIRECT_IO_ALIGN
            self._write_at(self._direct_fd, view[:aligned])
        self._write_at(self._fd, view[aligned:])

    def close(self) -> FileEntry:
        """Flush to disk (fsync), close, record the file in the transaction; errors propagate."""
        if self._fd is None:
            raise CheckpointWriteError(f"{self._relpath} is already closed")
        fd, self._fd = self._fd, None
        direct_fd, self._direct_fd = self._direct_fd, None
        try:
            # One fsync covers the file, whichever descriptor wrote its data.
            os.fsync(fd)
        finally:
            # close() can report a deferred write error too (the incident's corrupt file).
            if direct_fd is not None:
                os.close(direct_fd)
            os.close(fd)
        digest = self._hasher.hexdigest()
        entry = FileEntry(path=self._relpath, size=self._size, hash=digest, rank=self._owner.rank)
        self._owner._record(entry)
        return entry

    def discard(self) -> None:
        """Close without recording (used when the transaction is being aborted)."""
        for fd in (self._direct_fd, self._fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._direct_fd = None

    def __enter__(self) -> HashedFileWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


@dataclass(frozen=True)
class Committed:
    """A checkpoint made durable: where it is, its manifest, what it displaced.

    `quarantined` is set when an invalid directory of the same step was in the way: it was
    moved aside under a hidden `.invalid-` name (kept for inspection, reported, never deleted);
    `quarantined_problems` says what was wrong with it.
    """

    path: Path
    manifest: Manifest
    quarantined: Path | None
    quarantined_problems: tuple[Problem, ...] = ()


class CheckpointTransaction:
    """One checkpoint being written under a hidden name until `commit()` (see module docstring).

    Use as a context manager: leaving the block with an exception aborts (removes the temporary
    directory); leaving it normally without `commit()` aborts too. With `world_size`, the
    checkpoint is sharded: ranks write into `tmp_dir` through `ShardWriter`s and the commit
    needs every rank's `add_shard`.
    """

    # The transaction's own files are global ones (`FileOwner`).
    rank = None

    def __init__(
        self,
        root: str | os.PathLike[str],
        step: int,
        *,
        contents: Contents = Contents.FULL,
        algorithm: str = DEFAULT_ALGORITHM,
        metadata: dict[str, JsonValue] | None = None,
        world_size: int | None = None,
    ) -> None:
        new_hasher(algorithm)  # fail before touching the disk when the name is unknown
        if world_size is not None and world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        self.root = Path(root)
        self.step = step
        self.contents = contents
        self.algorithm = canonical_algorithm(algorithm)
        self.metadata: dict[str, JsonValue] = dict(metadata or {})
        self.target = self.root / step_dirname(step)
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmp_dir = self.root / hidden_name(TMP_PREFIX, step)
        self.tmp_dir.mkdir()
        self._entries: dict[str, FileEntry] = {}
        self._open: set[str] = set()
        self._subdirs: set[Path] = set()
        self._reported: set[int] = set()
        self._copies: dict[int, ShardWriter] = {}
        self._done = False

    def create(self, relpath: str, *, direct: bool = False) -> HashedFileWriter:
        """Create a new file of the checkpoint (relative path, subdirectories allowed).

        `direct=True` writes aligned data with O_DIRECT where possible (see HashedFileWriter).
        """
        self._check_open()
        entry_check = FileEntry(path=relpath, size=0, hash="")  # validates the path
        if entry_check.path in self._entries or relpath in self._open:
            raise CheckpointWriteError(f"{relpath} is already part of this checkpoint")
        path = self.tmp_dir / relpath
        if path.parent != self.tmp_dir:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._subdirs.update(p for p in path.parents if self.tmp_dir in p.parents)
        self._open.add(relpath)
        return HashedFileWriter(self, relpath, path, direct=direct)

    def write_file(self, relpath: str, data: Buffer) -> FileEntry:
        """Create, write and close a file in one call."""
        return _write_whole(self.create(relpath), data)

    def create_as(self, entry: FileEntry) -> HashedFileWriter:
        """Create the file `entry` names, in its rank's shard where it has a rank.

        For a copy of a checkpoint (`copy_checkpoint`, a remote layer's fetch): a sharded
        source stays sharded, each file under the same rank, and `report_copied_shards`
        reports every rank before `commit`.
        """
        if entry.rank is None:
            return self.create(entry.path)
        shard = self._copies.get(entry.rank)
        if shard is None:
            shard = ShardWriter(self.tmp_dir, entry.rank, algorithm=self.algorithm)
            self._copies[entry.rank] = shard
        return shard.create(entry.path[len(rank_dirname(entry.rank)) + 1 :])

    def report_copied_shards(self) -> None:
        """Report each rank's files created by `create_as` (none for a rank left out)."""
        for rank in range(self.world_size or 0):
            shard = self._copies.get(rank)
            self.add_shard(rank, shard.close() if shard is not None else ())

    def _record(self, entry: FileEntry) -> None:
        self._open.discard(entry.path)
        self._entries[entry.path] = entry

    def add_shard(self, rank: int, entries: Iterable[FileEntry]) -> None:
        """Record rank `rank`'s report: the files its `ShardWriter` wrote, fsynced and closed.

        Each file must lie in the rank's directory, name the rank and exist with the reported
        size (its bytes were hashed by the rank as it wrote them; reading them again here would
        cost a second pass over the whole checkpoint). Every rank reports exactly once, with
        no files if it had nothing to save.
        """
        self._check_open()
        if self.world_size is None:
            raise CheckpointWriteError("add_shard needs a sharded transaction (world_size)")
        if not 0 <= rank < self.world_size:
            raise CheckpointWriteError(f"rank {rank} is outside world_size {self.world_size}")
        if rank in self._reported:
            raise CheckpointWriteError(f"rank {rank} has already reported its shard")
        prefix = rank_dirname(rank) + "/"
        checked = []
        for entry in entries:
            if entry.rank != rank or not entry.path.startswith(prefix):
                raise CheckpointWriteError(f"{entry.path} is not a file of rank {rank}'s shard")
            if entry.path in self._entries:
                raise CheckpointWriteError(f"{entry.path} is already part of this checkpoint")
            try:
                size = (self.tmp_dir / entry.path).stat().st_size
            except FileNotFoundError:
                raise CheckpointWriteError(
                    f"{entry.path}: reported by rank {rank} but not written"
                ) from None
            if size != entry.size:
                raise CheckpointWriteError(
                    f"{entry.path}: rank {rank} reported {entry.size} bytes, {size} are there"
                )
            checked.append(entry)
        for entry in checked:
            self._entries[entry.path] = entry
        self._reported.add(rank)

    def _check_open(self) -> None:
        if self._done:
            raise CheckpointWriteError("the transaction is already committed or aborted")

    def commit(self, *, timestamp: float | None = None) -> Committed:
        """Write the manifest last, rename into place, fsync the root; return the result."""
        self._check_open()
        if self._open:
            raise CheckpointWriteError(f"files still open: {sorted(self._open)}")
        if self.world_size is not None:
            missing = sorted(set(range(self.world_size)) - self._reported)
            if missing:
                raise CheckpointWriteError(f"no shard reported by rank(s) {missing}")
        # Every directory's entries must be durable before the manifest claims the files.
        for directory in sorted(self._subdirs, key=lambda path: len(path.parts), reverse=True):
            fsync_path(directory)
        fsync_path(self.tmp_dir)
        manifest = Manifest(
            format_version=FORMAT_VERSION,
            step=self.step,
            time=time.time() if timestamp is None else timestamp,
            contents=self.contents,
            hash_algorithm=self.algorithm,
            files=tuple(sorted(self._entries.values(), key=lambda entry: entry.path)),
            metadata=self.metadata,
            world_size=self.world_size,
        )
        manifest_path = self.tmp_dir / MANIFEST_FILENAME
        fd = os.open(manifest_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            data = memoryview(manifest.to_json_bytes())
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_path(self.tmp_dir)
        superseded, quarantined, problems = self._move_existing_target_aside()
        os.rename(self.tmp_dir, self.target)
        fsync_path(self.root)
        self._done = True
        if superseded is not None:
            # Removed only now that its replacement is durable under the same name.
            shutil.rmtree(superseded)
        return Committed(self.target, manifest, quarantined, problems)

    def _move_existing_target_aside(
        self,
    ) -> tuple[Path | None, Path | None, tuple[Problem, ...]]:
        """Clear the way when a directory of the same step already exists.

        Returns (superseded, quarantined, its problems): a valid one is moved to a hidden
        `.deleting-` name to be removed after the commit; an invalid one to a hidden `.invalid-`
        name, where it is kept for inspection, never read again and never silently lost.
        """
        if not self.target.exists():
            return None, None, ()
        found = verify(self.target)
        if found.ok:
            superseded = self.root / hidden_name(DELETING_PREFIX, self.step)
            os.rename(self.target, superseded)
            return superseded, None, ()
        quarantined = self.root / hidden_name(INVALID_PREFIX, self.step)
        os.rename(self.target, quarantined)
        return None, quarantined, found.problems

    def abort(self) -> None:
        """Remove the temporary directory; the root is left as it was before the transaction."""
        if self._done:
            return
        self._done = True
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def __enter__(self) -> CheckpointTransaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()


class ShardWriter:
    """One rank's files of a sharded checkpoint (see the module docstring).

    Writes into `rank-<k>/` of the coordinator's temporary directory `tmp_dir` (which must
    exist: the coordinator made it); `close()` makes the rank's files and directories durable
    and returns the entries to hand to the coordinator's `CheckpointTransaction.add_shard`.
    Files may be written from several threads at once.
    """

    def __init__(
        self, tmp_dir: str | os.PathLike[str], rank: int, *, algorithm: str = DEFAULT_ALGORITHM
    ) -> None:
        new_hasher(algorithm)
        self._rank = rank
        self._algorithm = canonical_algorithm(algorithm)
        self.tmp_dir = Path(tmp_dir)
        self.directory = self.tmp_dir / rank_dirname(rank)
        self.directory.mkdir(exist_ok=True)
        self._entries: dict[str, FileEntry] = {}
        self._open: set[str] = set()
        self._subdirs: set[Path] = set()
        self._lock = Lock()
        self._closed = False

    @property
    def algorithm(self) -> str:
        """The hash algorithm of the checkpoint."""
        return self._algorithm

    @property
    def rank(self) -> int:
        """The rank whose files these are."""
        return self._rank

    def create(self, relpath: str, *, direct: bool = False) -> HashedFileWriter:
        """Create a file at `relpath` within the rank's directory (subdirectories allowed)."""
        name = f"{rank_dirname(self._rank)}/{relpath}"
        FileEntry(path=name, size=0, hash="")  # validates the path
        path = self.tmp_dir / name
        with self._lock:
            if self._closed:
                raise CheckpointWriteError(f"rank {self._rank}'s shard is already closed")
            if name in self._entries or name in self._open:
                raise CheckpointWriteError(f"{name} is already part of this checkpoint")
            if path.parent != self.directory:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._subdirs.update(p for p in path.parents if self.directory in p.parents)
            self._open.add(name)
        return HashedFileWriter(self, name, path, direct=direct)

    def write_file(self, relpath: str, data: Buffer) -> FileEntry:
        """Create, write and close a file in one call."""
        return _write_whole(self.create(relpath), data)

    def _record(self, entry: FileEntry) -> None:
        with self._lock:
            self._open.discard(entry.path)
            self._entries[entry.path] = entry

    def close(self) -> tuple[FileEntry, ...]:
        """Make the rank's directories durable; return its files (for `add_shard`)."""
        with self._lock:
            if self._open:
                raise CheckpointWriteError(f"files still open: {sorted(self._open)}")
            self._closed = True
        for directory in sorted(self._subdirs, key=lambda path: len(path.parts), reverse=True):
            fsync_path(directory)
        fsync_path(self.directory)
        return tuple(sorted(self._entries.values(), key=lambda entry: entry.path))


def _write_whole(writer: HashedFileWriter, data: Buffer) -> FileEntry:
    """Write `data` as the whole file and close it; a failed write leaves no file."""
    try:
        writer.write(data)
    except BaseException:
        writer.discard()
        raise
    return writer.close()
