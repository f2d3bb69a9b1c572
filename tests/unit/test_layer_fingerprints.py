"""Servers' fingerprints computed on a local copy: S3 ETags, git blob ids, and their text form."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.layers.fingerprints import (
    GIT_BLOB_SHA1,
    MD5,
    S3_MULTIPART,
    Fingerprint,
    MultipartEtag,
    file_fingerprint,
)

pytestmark = pytest.mark.unit

KIB = 1024


def s3_etag(data: bytes, part_bytes: int) -> str:
    """What S3 reports for `data` uploaded in parts of `part_bytes`: worked out here, apart."""
    parts = [data[i : i + part_bytes] for i in range(0, len(data), part_bytes)] or [b""]
    joined = b"".join(hashlib.md5(part).digest() for part in parts)
    return f"{hashlib.md5(joined).hexdigest()}-{len(parts)}"


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=40 * KIB),
    part_bytes=st.sampled_from([KIB, 5 * KIB, 8 * KIB]),
    feeds=st.lists(st.integers(min_value=1, max_value=9 * KIB), max_size=12),
)
def test_a_multipart_etag_does_not_depend_on_how_the_bytes_are_fed(
    data: bytes, part_bytes: int, feeds: list[int]
) -> None:
    hasher = MultipartEtag(part_bytes)
    position = 0
    for size in feeds:
        hasher.update(data[position : position + size])
        position += size
    hasher.update(data[position:])
    assert hasher.hexdigest() == s3_etag(data, part_bytes)


@pytest.mark.parametrize("size", [0, 1, 4 * KIB, 8 * KIB, 8 * KIB + 1, 20 * KIB])
def test_a_files_multipart_etag_is_the_one_s3_gives_it(tmp_path: Path, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    path = tmp_path / "shard.bin"
    path.write_bytes(data)
    assert file_fingerprint(path, S3_MULTIPART, 4 * KIB) == s3_etag(data, 4 * KIB)
    assert file_fingerprint(path, MD5) == hashlib.md5(data).hexdigest()


def test_a_git_blob_id_is_gits_own(tmp_path: Path) -> None:
    path = tmp_path / "info.json"
    path.write_bytes(b'{"shards": 12}\n')
    expected = subprocess.run(
        ["git", "hash-object", str(path)], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert file_fingerprint(path, GIT_BLOB_SHA1) == expected


@pytest.mark.parametrize(
    "fingerprint",
    [
        Fingerprint("sha256", "ab" * 32),
        Fingerprint("md5", "cd" * 16),
        Fingerprint("git-blob-sha1", "ef" * 20),
        Fingerprint("s3-multipart", f"{'01' * 16}-3", 5 * 2**20),
        Fingerprint("xxh3-128", "23" * 16),
    ],
)
def test_a_fingerprint_reads_back_from_its_text(fingerprint: Fingerprint) -> None:
    assert Fingerprint.parse(str(fingerprint)) == fingerprint


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ab12", "not a fingerprint"),
        ("sha256:", "not a fingerprint"),
        ("crc32:ab12", "unknown or unavailable hash algorithm"),
        (f"s3-multipart:{'01' * 16}-3", "names its part size"),
        (f"s3-multipart:{'01' * 16}-3/0", "names its part size"),
    ],
)
def test_what_is_not_a_fingerprint_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Fingerprint.parse(text)


def test_a_local_copy_is_checked_in_the_servers_terms(tmp_path: Path) -> None:
    data = b"shard" * 3000
    path = tmp_path / "shard.bin"
    path.write_bytes(data)
    listed = Fingerprint(S3_MULTIPART, s3_etag(data, 4 * KIB), 4 * KIB)
    assert listed.of_file(path) == listed
    path.write_bytes(data[:-1] + b"!")
    assert listed.of_file(path) != listed
