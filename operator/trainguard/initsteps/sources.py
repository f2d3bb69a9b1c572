"""Where staged data comes from: a small `Source` interface, its backends, and bounded reads.

A source lists its files (path, size, modification time, and the server's fingerprint of the
content when the listing carries one: `trainguard.layers.fingerprints`), gives a fingerprint on
request where the server computes one apart from the listing, returns its data manifest when it
has one, and opens a file for reading from an offset (so an interrupted copy resumes where it
stopped; object stores serve the same with range requests). Backends are chosen by
`open_source`:

| source | backend | fingerprints |
|---|---|---|
| a directory (e.g. the source PVC mounted into the `stage-data` step) | `DirectorySource` | none |
| `file:///path` | `DirectorySource` | none |
| `s3://bucket/prefix` | `remote_sources.S3Source` | ETag (MD5 or multipart), by HEAD |
| `ssh://[user@]host[:port]/path` | `remote_sources.SshSource` | sha256 on the remote host |
| `hf://datasets/owner/name[@revision][/path]` | `remote_sources.HfSource` | LFS sha256, blob id |

The remote backends use the remote checkpoint layers' clients and credential handling, with the
data source's own Secret (`credentials_dir`, one file per key, as a layer's).

Reads can hang: in the incident, dataloader workers sat in `poll_schedule_timeout` on a
network volume forever. So every call into a source (listing, opening, each chunk read) runs
on a worker thread and must answer within a timeout (`timed_items`); otherwise
`SourceTimeoutError` names the file and the offset. The stuck thread cannot be cancelled (it is
blocked in the kernel), so it is a daemon thread and the caller reports and exits.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Protocol, TypeVar, cast
from urllib.parse import unquote, urlparse

from trainguard.api.constants import UriScheme
from trainguard.ckpt.hashing import CHUNK_BYTES
from trainguard.layers.fingerprints import Fingerprint

# Written at the root of a source by `trainguard stage-data --write-manifest`; read by staging.
DATA_MANIFEST_FILENAME = "DATA_MANIFEST.json"
# Chunks read ahead of the writer: reading and writing overlap, memory stays bounded.
READ_AHEAD_CHUNKS = 2
# How often a producer blocked on a full queue checks whether its consumer gave up.
_PUT_POLL_S = 0.2

T = TypeVar("T")


class SourceError(RuntimeError):
    """A source could not be listed or read (the message names the source and the file)."""


class SourceTimeoutError(SourceError):
    """A call into the source did not return within the read timeout: a hung read."""


@dataclass(frozen=True)
class SourceFile:
    """One file of a source: relative POSIX path, size, mtime when known, server's fingerprint.

    The fingerprint is there when the source's listing carries one (None otherwise).
    """

    path: str
    size: int
    mtime_ns: int | None
    fingerprint: Fingerprint | None = None


class SourceReader(Protocol):
    """An open file of a source, positioned at the offset it was opened at."""

    def read(self, size: int) -> bytes:
        """Up to `size` bytes; empty at the end of the file."""
        ...

    def close(self) -> None:
        """Release the file."""
        ...


class Source(Protocol):
    """Where data shards are staged from."""

    @property
    def description(self) -> str:
        """The source as messages name it (a path or a URI)."""
        ...

    def list_files(self) -> list[SourceFile]:
        """Every data file, sorted by path (the data manifest itself excluded)."""
        ...

    def read_manifest(self) -> bytes | None:
        """The source's data manifest (`DATA_MANIFEST.json`), or None when it has none."""
        ...

    def fingerprint(self, file: SourceFile) -> Fingerprint | None:
        """The server's fingerprint of a file listed without one, asked for now; None if none.

        It may take the server a read of the whole file (a remote `sha256sum`).
        """
        ...

    def open(self, path: str, offset: int = 0) -> SourceReader:
        """Open one file for reading from `offset`."""
        ...


class DirectorySource:
    """A directory: a mounted PVC or a `file://` URI.

    Regular files are data, symlinks to them too (a Hugging Face cache links to blobs);
    symlinked directories are not followed.
    """

    def __init__(self, root: Path, exclude: frozenset[str] = frozenset()) -> None:
        self.root = root
        # Top-level names that are not data (e.g. the bookkeeping of a staged copy).
        self.exclude = exclude | {DATA_MANIFEST_FILENAME}

    @property
    def description(self) -> str:
        """The directory's path."""
        return str(self.root)

    def list_files(self) -> list[SourceFile]:
        """Walk the directory (without following symlinked directories)."""
        if not self.root.is_dir():
            raise SourceError(f"{self.root}: not a directory")
        files = []
        for dirpath, dirnames, filenames in os.walk(self.root, onerror=_raise):
            top = Path(dirpath) == self.root
            if top:
                dirnames[:] = [name for name in dirnames if name not in self.exclude]
            dirnames.sort()
            for name in filenames:
                if top and name in self.exclude:
                    continue
                path = Path(dirpath, name)
                stat = path.stat()  # follows a symlinked file (e.g. a Hugging Face cache blob)
                if not S_ISREG(stat.st_mode):
                    continue  # pipes, sockets and devices are not data
                files.append(
                    SourceFile(
                        path.relative_to(self.root).as_posix(), stat.st_size, stat.st_mtime_ns
                    )
                )
        return sorted(files, key=lambda item: item.path)

    def read_manifest(self) -> bytes | None:
        """DATA_MANIFEST.json at the root, if present."""
        try:
            return (self.root / DATA_MANIFEST_FILENAME).read_bytes()
        except FileNotFoundError:
            return None

    def fingerprint(self, file: SourceFile) -> Fingerprint | None:
        """None: a file system keeps no fingerprints (staging hashes the files it reads)."""
        return None

    def open(self, path: str, offset: int = 0) -> SourceReader:
        """Open a file unbuffered (every read is one system call we can time)."""
        handle = (self.root / path).open("rb", buffering=0)
        if offset:
            handle.seek(offset)
        return handle


def _raise(err: OSError) -> None:
    raise err


# A factory: (URI, the Secret's directory or None, the environment) -> the source.
Factory = Callable[[str, Path | None, Mapping[str, str]], Source]


def _directory_from_uri(
    uri: str, credentials_dir: Path | None, environ: Mapping[str, str]
) -> Source:
    return DirectorySource(Path(unquote(urlparse(uri).path)))


def _remote(uri: str, credentials_dir: Path | None, environ: Mapping[str, str]) -> Source:
    # Imported on use: a directory source needs none of the remote clients.
    from trainguard.initsteps.remote_sources import open_remote

    return open_remote(uri, credentials_dir, environ)


# URI scheme -> factory. A new backend implements `Source` and registers here.
BACKENDS: dict[str, Factory] = {
    UriScheme.FILE: _directory_from_uri,
    UriScheme.S3: _remote,
    UriScheme.SSH: _remote,
    UriScheme.HF: _remote,
}


def open_source(
    value: str,
    exclude: frozenset[str] = frozenset(),
    credentials_dir: Path | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Source:
    """The source named by a directory path or a URI (`credentials_dir`: its Secret, mounted)."""
    if "://" not in value:
        return DirectorySource(Path(value), exclude)
    scheme = urlparse(value).scheme
    factory = BACKENDS.get(scheme)
    if factory is None:
        raise SourceError(
            f"{value}: {scheme}:// data sources are not supported "
            f"(supported: a directory, {', '.join(s + '://' for s in sorted(BACKENDS))})"
        )
    return factory(value, credentials_dir, environ)


def timed_items(
    produce: Callable[[], Iterator[T]], timeout_s: float, what: Callable[[], str]
) -> Iterator[T]:
    """Yield what `produce` yields, each item within `timeout_s`, produced on a worker thread.

    `what()` describes the pending operation for the error message (it is called only on a
    timeout or an error, so it can report the offset reached). OSErrors of the producer come
    back as `SourceError`. Leaving the loop early tells the producer to stop.
    """
    items: queue.Queue[tuple[int, object]] = queue.Queue(maxsize=READ_AHEAD_CHUNKS)
    stop = threading.Event()
    item_kind, end_kind, error_kind = 0, 1, 2

    def put(kind: int, value: object) -> bool:
        while not stop.is_set():
            try:
                items.put((kind, value), timeout=_PUT_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in produce():
                if not put(item_kind, item):
                    return
            put(end_kind, None)
        except BaseException as err:  # handed to the consumer, which raises it
            put(error_kind, err)

    # A daemon: a read blocked in the kernel cannot be interrupted and must not block exit.
    threading.Thread(target=run, name="trainguard-source-read", daemon=True).start()
    try:
        while True:
            try:
                kind, value = items.get(timeout=timeout_s)
            except queue.Empty:
                raise SourceTimeoutError(
                    f"{what()}: no answer from the source within {timeout_s:g} s "
                    "(a hung read: the source volume or network stopped responding)"
                ) from None
            if kind == end_kind:
                return
            if kind == error_kind:
                if isinstance(value, OSError):
                    raise SourceError(f"{what()}: {value}") from value
                assert isinstance(value, BaseException)
                raise value
            yield cast(T, value)
    finally:
        stop.set()


def call_with_timeout(call: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run one call into a source on a worker thread; it must return within `timeout_s`."""
    # The lambda runs on the worker thread, so `call()` itself is what is timed.
    return next(timed_items(lambda: iter((call(),)), timeout_s, lambda: what))


def read_chunks(
    source: Source, path: str, offset: int, timeout_s: float, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[bytes]:
    """The bytes of `path` from `offset` in chunks, each read within `timeout_s`."""
    position = offset

    def produce() -> Iterator[bytes]:
        reader = source.open(path, offset)
        try:
            while chunk := reader.read(chunk_bytes):
                yield chunk
        finally:
            reader.close()

    def what() -> str:
        return f"reading {path} at offset {position} from {source.description}"

    for chunk in timed_items(produce, timeout_s, what):
        position += len(chunk)
        yield chunk
