"""Verification, scanning and the resume-point search over a checkpoint root."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from trainguard.ckpt import (
    MANIFEST_FILENAME,
    CheckpointTransaction,
    find_newest_valid,
    scan,
    verify,
)

pytestmark = pytest.mark.unit


def write_checkpoint(root: Path, step: int) -> Path:
    with CheckpointTransaction(root, step) as txn:
        txn.write_file("model.bin", bytes([step % 251]) * 4096)
        txn.write_file("optim.bin", b"o" * 1000)
        return txn.commit().path


def _truncate(path: Path) -> None:
    with (path / "model.bin").open("r+b") as handle:
        handle.truncate(100)


def _flip_one_byte(path: Path) -> None:
    target = path / "model.bin"
    data = bytearray(target.read_bytes())
    data[1234] ^= 0x01
    target.write_bytes(bytes(data))


def _delete_manifest(path: Path) -> None:
    (path / MANIFEST_FILENAME).unlink()


def _delete_file(path: Path) -> None:
    (path / "optim.bin").unlink()


def _garble_manifest(path: Path) -> None:
    (path / MANIFEST_FILENAME).write_text("{not json")


def _edit_manifest(**changes: object) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        manifest = json.loads((path / MANIFEST_FILENAME).read_text())
        manifest.update(changes)
        (path / MANIFEST_FILENAME).write_text(json.dumps(manifest))

    return edit


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncate": (_truncate, "model.bin: size 100 != 4096"),
    "flip-one-byte": (_flip_one_byte, "model.bin: xxh3-128 hash mismatch"),
    "delete-manifest": (_delete_manifest, "missing MANIFEST.json"),
    "delete-file": (_delete_file, "optim.bin: missing"),
    "garbled-manifest": (_garble_manifest, "malformed MANIFEST.json"),
    "future-format": (_edit_manifest(format_version=99), "unsupported format_version 99"),
    "wrong-step": (_edit_manifest(step=4), "directory is step 3 but the manifest says 4"),
    "unknown-hash": (_edit_manifest(hash_algorithm="crc0"), "unknown or unavailable hash"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corruption_of_the_newest_is_reported_and_the_one_before_is_used(
    tmp_path: Path, name: str
) -> None:
    corrupt, reason = CORRUPTIONS[name]
    for step in (1, 2, 3):
        write_checkpoint(tmp_path, step)
    corrupt(tmp_path / "step-00000003")

    result = verify(tmp_path / "step-00000003")
    assert not result.ok
    assert any(reason in text for text in result.reasons), result.reasons

    search = find_newest_valid(tmp_path)
    assert search.newest is not None and search.newest.step == 2
    assert [skipped.path.name for skipped in search.skipped] == ["step-00000003"]

    full = scan(tmp_path)
    assert [v.step for v in full.valid] == [1, 2]
    assert [v.path.name for v in full.invalid] == ["step-00000003"]
    assert full.newest_valid is not None and full.newest_valid.step == 2
    # Reporting never removes anything.
    assert (tmp_path / "step-00000003").is_dir()


def test_every_problem_is_reported_not_just_the_first(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, 1)
    _truncate(path)
    _delete_file(path)
    reasons = verify(path).reasons
    assert len(reasons) == 2


def test_quick_check_sees_sizes_but_not_content(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, 1)
    _flip_one_byte(path)
    assert verify(path, check_hashes=False).ok
    assert not verify(path).ok
    _truncate(path)
    assert not verify(path, check_hashes=False).ok


def test_missing_or_empty_roots_are_a_fresh_run(tmp_path: Path) -> None:
    for root in (tmp_path / "absent", tmp_path):
        assert find_newest_valid(root).newest is None
        result = scan(root)
        assert result.valid == () and result.invalid == () and result.newest_valid is None


def test_unrelated_entries_are_ignored(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 1)
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "step-00000009").write_text("a file, not a directory")
    (tmp_path / "step-9").mkdir()
    result = scan(tmp_path)
    assert [v.step for v in result.valid] == [1]
    assert result.invalid == ()
