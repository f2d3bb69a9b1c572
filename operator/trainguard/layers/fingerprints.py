"""What a server says a file holds, in terms a local copy can be checked against.

Remote stores report a fingerprint of each file without a download, each in its own terms:

| server | fingerprint | `Fingerprint.algorithm` |
|---|---|---|
| S3, single-part upload | ETag: the MD5 of the content | `md5` |
| S3, multipart upload | ETag: `<MD5 of the parts' MD5s>-<parts>` (+ part size) | `s3-multipart` |
| the Hub, an LFS file | its LFS sha256 | `sha256` |
| the Hub, a file kept in git | its git blob id (sha1 of header + content) | `git-blob-sha1` |
| an SSH host | the sha256 its `sha256sum` computes where the file lies | `sha256` |

The remote layers check every upload against these and record them (`FINGERPRINTS.json`);
`stage-data` checks every copied data file against one. A fingerprint's text form,
`<algorithm>:<value>` (`s3-multipart:<etag>/<part bytes>`), names its algorithm, so a list of
them can mix algorithms. The checkpoint hashes (`trainguard.ckpt`: sha256, xxh3-128, blake3)
are fingerprints too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.ckpt.hashing import CHUNK_BYTES, Hasher, hash_file, new_hasher

if TYPE_CHECKING:
    from typing_extensions import Buffer

MD5 = "md5"
GIT_BLOB_SHA1 = "git-blob-sha1"
S3_MULTIPART = "s3-multipart"
# Fingerprints only a server gives; every other algorithm is a checkpoint hash.
SERVER_ALGORITHMS = frozenset({MD5, GIT_BLOB_SHA1, S3_MULTIPART})
_SEPARATOR = ":"
_PART_SEPARATOR = "/"


def multipart_etag(digests: list[bytes]) -> str:
    """The ETag S3 gives an object uploaded in parts with these MD5 digests."""
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


def git_blob_hasher(size: int) -> Hasher:
    """A hasher of git's blob id for `size` bytes of content (feed it the content)."""
    return hashlib.sha1(f"blob {size}\0".encode())


class MultipartEtag:
    """The ETag of content uploaded in parts of `part_bytes` (the last one shorter), fed in."""

    def __init__(self, part_bytes: int) -> None:
        if part_bytes <= 0:
            raise ValueError("part_bytes must be positive")
        self.part_bytes = part_bytes
        self._digests: list[bytes] = []
        self._part = hashlib.md5()
        self._filled = 0

    def update(self, data: Buffer, /) -> None:
        """Feed more bytes."""
        view = memoryview(data).cast("B")
        while view:
            piece = view[: self.part_bytes - self._filled]
            self._part.update(piece)
            self._filled += len(piece)
            view = view[len(piece) :]
            if self._filled == self.part_bytes:
                self._digests.append(self._part.digest())
                self._part, self._filled = hashlib.md5(), 0

    def hexdigest(self) -> str:
        """The ETag of everything fed so far (empty content is one empty part)."""
        digests = list(self._digests)
        if self._filled or not digests:
            digests.append(self._part.digest())
        return multipart_etag(digests)


def new_fingerprinter(algorithm: str, size: int, part_bytes: int = 0) -> Hasher:
    """An incremental hasher of `algorithm` for `size` bytes (`part_bytes`: s3-multipart).

    Raises ValueError for an unknown algorithm.
    """
    if algorithm == MD5:
        return hashlib.md5()
    if algorithm == GIT_BLOB_SHA1:
        return git_blob_hasher(size)
    if algorithm == S3_MULTIPART:
        return MultipartEtag(part_bytes)
    return new_hasher(algorithm)


def file_fingerprint(path: Path, algorithm: str, part_bytes: int = 0) -> str:
    """The value of `algorithm` for a local file, read from its start to its end."""
    if algorithm not in SERVER_ALGORITHMS:
        return hash_file(path, algorithm)[1]
    hasher = new_fingerprinter(algorithm, path.stat().st_size, part_bytes)
    with path.open("rb", buffering=0) as reader:
        while data := reader.read(CHUNK_BYTES):
            hasher.update(data)
    return hasher.hexdigest()


@dataclass(frozen=True)
class Fingerprint:
    """One file's fingerprint: its algorithm, its value and, for s3-multipart, the part size."""

    algorithm: str
    value: str
    part_bytes: int = 0

    def __str__(self) -> str:
        text = f"{self.algorithm}{_SEPARATOR}{self.value}"
        if self.algorithm == S3_MULTIPART:
            text += f"{_PART_SEPARATOR}{self.part_bytes}"
        return text

    @classmethod
    def parse(cls, text: str) -> Fingerprint:
        """The fingerprint of a text form; ValueError when it is not one."""
        algorithm, separator, value = text.partition(_SEPARATOR)
        part_bytes = 0
        if algorithm == S3_MULTIPART:
            value, _, part = value.rpartition(_PART_SEPARATOR)
            part_bytes = int(part) if part.isdigit() else 0
            if part_bytes <= 0:
                raise ValueError(f"{text!r}: an s3-multipart fingerprint names its part size")
        if not separator or not value:
            raise ValueError(f"{text!r} is not a fingerprint (<algorithm>:<value>)")
        new_fingerprinter(algorithm, 0, part_bytes)  # raises for an unknown algorithm
        return cls(algorithm, value, part_bytes)

    def hasher(self, size: int) -> Hasher:
        """A hasher of this fingerprint's algorithm for `size` bytes of content."""
        return new_fingerprinter(self.algorithm, size, self.part_bytes)

    def of_file(self, path: Path) -> Fingerprint:
        """The fingerprint of a local file in the same algorithm (compare it with this one)."""
        return Fingerprint(
            self.algorithm, file_fingerprint(path, self.algorithm, self.part_bytes), self.part_bytes
        )
