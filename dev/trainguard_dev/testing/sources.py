"""A data source that damages what it passes on, for the staging tests: a byte flipped in transit.

It wraps a real source (a directory, an S3 bucket, an SSH host, a Hub dataset) and changes
nothing at the server: the copy that arrives differs from what the server holds, as a copy
damaged on the wire or in a buffer would.
"""

from __future__ import annotations

from trainguard.initsteps.sources import Source, SourceFile, SourceReader
from trainguard.layers.fingerprints import Fingerprint


class WrappedSource:
    """A real source passed through unchanged; subclasses change what `open` gives."""

    def __init__(self, inner: Source) -> None:
        self.inner = inner

    @property
    def description(self) -> str:
        """The wrapped source's."""
        return self.inner.description

    def list_files(self) -> list[SourceFile]:
        """The wrapped source's listing."""
        return self.inner.list_files()

    def read_manifest(self) -> bytes | None:
        """The wrapped source's manifest."""
        return self.inner.read_manifest()

    def fingerprint(self, file: SourceFile) -> Fingerprint | None:
        """The wrapped source's fingerprint."""
        return self.inner.fingerprint(file)

    def open(self, path: str, offset: int = 0) -> SourceReader:
        """The wrapped source's reader."""
        return self.inner.open(path, offset)


class FlipSource(WrappedSource):
    """`inner`, except that reads of `path` have their first byte flipped on chosen opens."""

    def __init__(self, inner: Source, path: str, opens: set[int]) -> None:
        super().__init__(inner)
        self.path = path
        self.opens = opens  # 1-based numbers of the opens of `path` that are corrupted
        self.count = 0

    def open(self, path: str, offset: int = 0) -> SourceReader:
        """The wrapped source's reader, flipping on the chosen opens of `path`."""
        reader = self.inner.open(path, offset)
        if path != self.path:
            return reader
        self.count += 1
        return _Flipping(reader) if self.count in self.opens else reader


class _Flipping:
    def __init__(self, inner: SourceReader) -> None:
        self.inner = inner
        self.flipped = False

    def read(self, size: int) -> bytes:
        data = self.inner.read(size)
        if data and not self.flipped:
            self.flipped = True
            return bytes([data[0] ^ 0x01]) + data[1:]
        return data

    def close(self) -> None:
        self.inner.close()
