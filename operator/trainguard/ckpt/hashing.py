"""Content hashes for checkpoint files, recorded by name in every manifest.

The hash guards integrity, not authenticity, so the default is the fastest one available:
xxh3-128 (the `xxhash` package, a runtime dependency). blake3 is offered when its package is
installed, sha256 always (standard library). Every hasher accepts any buffer-protocol object,
so callers can hash memory views of large host buffers without copying them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import mmap
import os
from typing import TYPE_CHECKING, Protocol

import xxhash

from trainguard.ckpt.layout import open_direct

if TYPE_CHECKING:
    # collections.abc.Buffer exists only from Python 3.12.
    from typing_extensions import Buffer

XXH3_128 = "xxh3-128"
BLAKE3 = "blake3"
SHA256 = "sha256"
DEFAULT_ALGORITHM = XXH3_128
# Names the TrainingRun API uses for the same algorithms (spec.checkpoints.hashAlgorithm).
ALIASES = {"xxh3": XXH3_128}

# Large enough to amortise the per-call cost, small enough to stay in the CPU caches.
CHUNK_BYTES = 8 * 1024 * 1024


class Hasher(Protocol):
    """The incremental interface shared by every supported hash."""

    def update(self, data: Buffer, /) -> object:
        """Feed more bytes."""

    def hexdigest(self) -> str:
        """Return the digest of everything fed so far, as lowercase hex."""


class UnknownHashAlgorithmError(ValueError):
    """The named algorithm is not supported or its package is not installed."""


def _blake3_installed() -> bool:
    return importlib.util.find_spec("blake3") is not None


def available_algorithms() -> tuple[str, ...]:
    """Names of the algorithms usable in this process, the default first."""
    names = [XXH3_128]
    if _blake3_installed():
        names.append(BLAKE3)
    names.append(SHA256)
    return tuple(names)


def canonical_algorithm(algorithm: str) -> str:
    """The name a manifest records for `algorithm` (API aliases resolved)."""
    return ALIASES.get(algorithm, algorithm)


def new_hasher(algorithm: str) -> Hasher:
    """Return a fresh incremental hasher for `algorithm` (an API alias is accepted)."""
    algorithm = canonical_algorithm(algorithm)
    if algorithm == XXH3_128:
        return xxhash.xxh3_128()
    if algorithm == SHA256:
        return hashlib.sha256()
    if algorithm == BLAKE3 and _blake3_installed():
        import blake3

        # blake3 hashes large inputs on several threads when asked to.
        hasher: Hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        return hasher
    raise UnknownHashAlgorithmError(
        f"unknown or unavailable hash algorithm {algorithm!r}; available: "
        + ", ".join(available_algorithms())
    )


def hash_file(
    path: str | os.PathLike[str], algorithm: str, *, direct: bool = False
) -> tuple[int, str]:
    """Return (size in bytes, hex digest) of a file, read in chunks into one reused buffer.

    With `direct=True` the file is read with O_DIRECT where supported: from the device rather
    than from a cached copy, and without filling the page cache (or spending CPU on it).
    """
    hasher = new_hasher(algorithm)
    fd = open_direct(path, os.O_RDONLY) if direct else None
    if fd is None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    size = 0
    # Anonymous mmap memory is page-aligned, as O_DIRECT reads require.
    buffer = mmap.mmap(-1, CHUNK_BYTES)
    view = memoryview(buffer)
    try:
        while True:
            count = os.preadv(fd, [view], size)
            hasher.update(view[:count])
            size += count
            # A short read of a regular file is its end (and O_DIRECT could not read on from
            # the unaligned offset that follows).
            if count < CHUNK_BYTES:
                break
    finally:
        view.release()
        buffer.close()
        os.close(fd)
    return size, hasher.hexdigest()
