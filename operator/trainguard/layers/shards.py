"""Split a safetensors file into shards under a size limit, in the Hugging Face layout.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's
dtype, shape and byte range in the data section, plus an optional `__metadata__`) and the data
section. Splitting copies whole tensors, in data order, into shards `<stem>-00001-of-0000N
.safetensors` of at most `max_bytes` each, with an index `<stem>.safetensors.index.json`
(`metadata.total_size`, `weight_map`: tensor -> shard) that transformers and the Hub read.
Every shard keeps the original `__metadata__`. Nothing is parsed beyond the header and no
tensor library is needed.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

HEADER_LENGTH_BYTES = 8
METADATA_KEY = "__metadata__"
# The safetensors format pads the header with spaces so the data section starts aligned.
ALIGN = 8
COPY_BYTES = 8 * 1024 * 1024
SUFFIX = ".safetensors"


class ShardError(ValueError):
    """The file cannot be split as asked (malformed, or one tensor is over the limit)."""


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and the offset where its data section starts."""
    with path.open("rb") as reader:
        raw = reader.read(HEADER_LENGTH_BYTES)
        if len(raw) != HEADER_LENGTH_BYTES:
            raise ShardError(f"{path.name}: not a safetensors file")
        (length,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(reader.read(length))
        except ValueError as err:
            raise ShardError(f"{path.name}: malformed safetensors header: {err}") from err
    if not isinstance(header, dict):
        raise ShardError(f"{path.name}: malformed safetensors header")
    return header, HEADER_LENGTH_BYTES + length


def _encode_header(header: dict[str, Any]) -> bytes:
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-(HEADER_LENGTH_BYTES + len(body)) % ALIGN)
    return struct.pack("<Q", len(body)) + body


def split(source: Path, dest: Path, max_bytes: int) -> list[Path]:
    """Shard `source` into `dest`; return the shard files, then the index file."""
    header, data_start = read_header(source)
    metadata = header.pop(METADATA_KEY, None)
    tensors = sorted(header.items(), key=lambda item: item[1]["data_offsets"][0])
    groups: list[list[tuple[str, dict[str, Any]]]] = [[]]
    size = 0
    for name, info in tensors:
        begin, end = info["data_offsets"]
        if end - begin > max_bytes:
            raise ShardError(f"{source.name}: tensor {name} alone is over {max_bytes} bytes")
        if groups[-1] and size + end - begin > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, info))
        size += end - begin
    stem = source.name.removesuffix(SUFFIX)
    dest.mkdir(parents=True, exist_ok=True)
    shards = []
    weight_map = {}
    total = 0
    with source.open("rb") as reader:
        for number, group in enumerate(groups, 1):
            shard = dest / f"{stem}-{number:05d}-of-{len(groups):05d}{SUFFIX}"
            offset = 0
            shard_header: dict[str, Any] = {} if metadata is None else {METADATA_KEY: metadata}
            for name, info in group:
                begin, end = info["data_offsets"]
                shard_header[name] = {**info, "data_offsets": [offset, offset + end - begin]}
                offset += end - begin
                weight_map[name] = shard.name
            with shard.open("wb") as writer:
                writer.write(_encode_header(shard_header))
                for _, info in group:
                    begin, end = info["data_offsets"]
                    reader.seek(data_start + begin)
                    remaining = end - begin
                    while remaining:
                        chunk = reader.read(min(COPY_BYTES, remaining))
                        if not chunk:
                            raise ShardError(f"{source.name}: data section is truncated")
                        writer.write(chunk)
                        remaining -= len(chunk)
            total += offset
            shards.append(shard)
    index = dest / f"{stem}{SUFFIX}.index.json"
    index.write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1) + "\n"
    )
    return [*shards, index]
