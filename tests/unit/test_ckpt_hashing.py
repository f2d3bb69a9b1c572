"""Checkpoint hashes: names, availability, incremental equals one-shot, file hashing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import xxhash

from trainguard.ckpt import (
    BLAKE3,
    DEFAULT_ALGORITHM,
    SHA256,
    XXH3_128,
    UnknownHashAlgorithmError,
    available_algorithms,
    hash_file,
    new_hasher,
)
from trainguard.ckpt.hashing import CHUNK_BYTES

pytestmark = pytest.mark.unit

DATA = bytes(range(256)) * 40_000  # larger than one chunk, not a multiple of it


def test_default_is_xxh3_128_and_always_available() -> None:
    assert DEFAULT_ALGORITHM == XXH3_128
    assert available_algorithms()[0] == XXH3_128
    assert SHA256 in available_algorithms()
    # blake3 is a dev dependency, so the optional path is exercised here.
    assert BLAKE3 in available_algorithms()


@pytest.mark.parametrize("algorithm", [XXH3_128, BLAKE3, SHA256])
def test_incremental_hash_equals_one_shot(algorithm: str) -> None:
    hasher = new_hasher(algorithm)
    view = memoryview(DATA)
    for start in range(0, len(view), 12_345):
        hasher.update(view[start : start + 12_345])
    one_shot = new_hasher(algorithm)
    one_shot.update(DATA)
    assert hasher.hexdigest() == one_shot.hexdigest()


def test_digests_match_the_reference_implementations() -> None:
    xxh = new_hasher(XXH3_128)
    xxh.update(DATA)
    assert xxh.hexdigest() == xxhash.xxh3_128_hexdigest(DATA)
    sha = new_hasher(SHA256)
    sha.update(DATA)
    assert sha.hexdigest() == hashlib.sha256(DATA).hexdigest()


@pytest.mark.parametrize("algorithm", [XXH3_128, BLAKE3, SHA256])
def test_hash_file_reads_in_chunks(tmp_path: Path, algorithm: str) -> None:
    assert len(DATA) > CHUNK_BYTES
    path = tmp_path / "f.bin"
    path.write_bytes(DATA)
    expected = new_hasher(algorithm)
    expected.update(DATA)
    assert hash_file(path, algorithm) == (len(DATA), expected.hexdigest())


def test_unknown_algorithm_is_refused_with_the_available_list() -> None:
    with pytest.raises(UnknownHashAlgorithmError, match="available: xxh3-128"):
        new_hasher("md5")
