"""The reader: newest valid checkpoint, corrupt ones reported and skipped, never used."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trainguard.ckpt import MANIFEST_FILENAME
from trainguard_harness.reader import load_newest
from trainguard_harness.writer import CheckpointWriter

pytestmark = pytest.mark.unit


def write_steps(root: Path, steps: tuple[int, ...]) -> None:
    writer = CheckpointWriter(root, keep_last=len(steps))
    for step in steps:
        writer.save(step, {"model": {"w": torch.full((1000,), float(step))}})
    writer.close()


def _truncate(path: Path) -> None:
    with (path / "model.safetensors").open("r+b") as handle:
        handle.truncate(200)


def _flip_one_byte(path: Path) -> None:
    target = path / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x04
    target.write_bytes(bytes(data))


def _delete_manifest(path: Path) -> None:
    (path / MANIFEST_FILENAME).unlink()


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncate": (_truncate, "size 200"),
    "flip-one-byte": (_flip_one_byte, "hash mismatch"),
    "delete-manifest": (_delete_manifest, "missing MANIFEST.json"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupt_newest_is_reported_and_the_one_before_loads(tmp_path: Path, name: str) -> None:
    corrupt, reason = CORRUPTIONS[name]
    write_steps(tmp_path, (1, 2, 3))
    corrupt(tmp_path / "step-00000003")
    reported: list[Path] = []
    result = load_newest(tmp_path, on_invalid=lambda v: reported.append(v.path))
    assert result.loaded is not None and result.loaded.step == 2
    model = result.loaded.components["model"]
    assert isinstance(model, dict) and torch.equal(model["w"], torch.full((1000,), 2.0))
    assert [v.path.name for v in result.skipped] == ["step-00000003"]
    assert reason in result.skipped[0].reasons[0]
    assert reported == [tmp_path / "step-00000003"]
    assert (tmp_path / "step-00000003").exists()  # reported, not deleted


def test_nothing_valid_is_a_fresh_start(tmp_path: Path) -> None:
    write_steps(tmp_path, (1,))
    _flip_one_byte(tmp_path / "step-00000001")
    result = load_newest(tmp_path)
    assert result.loaded is None and len(result.skipped) == 1
    assert load_newest(tmp_path / "absent").loaded is None
