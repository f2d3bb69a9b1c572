"""Copying checkpoints between roots: verified while copied, subsets for weights-only layers."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.ckpt import (
    BLAKE3,
    CheckpointInvalidError,
    CheckpointTransaction,
    Contents,
    copy_checkpoint,
    scan,
    verify,
)

pytestmark = pytest.mark.unit


def write_checkpoint(root: Path, step: int) -> Path:
    with CheckpointTransaction(root, step, algorithm=BLAKE3, metadata={"tokens": 10}) as txn:
        txn.write_file("model.safetensors", b"w" * 3000)
        txn.write_file("optimizer.safetensors", b"o" * 5000)
        return txn.commit(timestamp=123.0).path


def test_full_copy_preserves_the_manifest(tmp_path: Path) -> None:
    source = write_checkpoint(tmp_path / "l1", 40)
    committed = copy_checkpoint(source, tmp_path / "remote")
    assert committed.path == tmp_path / "remote" / "step-00000040"
    original = verify(source).manifest
    assert verify(committed.path).ok
    assert committed.manifest == original


def test_weights_only_copy(tmp_path: Path) -> None:
    source = write_checkpoint(tmp_path / "l1", 40)
    committed = copy_checkpoint(
        source, tmp_path / "hub", paths=["model.safetensors"], contents=Contents.WEIGHTS
    )
    assert committed.manifest.contents is Contents.WEIGHTS
    assert [entry.path for entry in committed.manifest.files] == ["model.safetensors"]
    assert committed.manifest.metadata == {"tokens": 10}
    assert verify(committed.path).ok


def test_subset_without_contents_or_unknown_paths_is_refused(tmp_path: Path) -> None:
    source = write_checkpoint(tmp_path / "l1", 1)
    with pytest.raises(ValueError, match="contents"):
        copy_checkpoint(source, tmp_path / "dst", paths=["model.safetensors"])
    with pytest.raises(ValueError, match="no such files"):
        copy_checkpoint(source, tmp_path / "dst", paths=["x"], contents=Contents.WEIGHTS)
    assert not (tmp_path / "dst").exists() or list((tmp_path / "dst").iterdir()) == []


def test_a_corrupt_source_is_never_copied(tmp_path: Path) -> None:
    source = write_checkpoint(tmp_path / "l1", 1)
    data = bytearray((source / "optimizer.safetensors").read_bytes())
    data[-1] ^= 0x10
    (source / "optimizer.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointInvalidError, match=r"optimizer\.safetensors"):
        copy_checkpoint(source, tmp_path / "remote")
    result = scan(tmp_path / "remote")
    assert result.valid == () and result.invalid == () and result.partial == ()
    (source / "optimizer.safetensors").write_bytes(b"short")
    with pytest.raises(CheckpointInvalidError, match="size"):
        copy_checkpoint(source, tmp_path / "remote")
