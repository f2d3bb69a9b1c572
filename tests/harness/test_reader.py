"""The reader: newest valid checkpoint, corrupt ones reported and skipped, never used."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trainguard.ckpt import MANIFEST_FILENAME, Verification
from trainguard_harness.reader import load_newest, load_newest_of
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


def test_across_layers_the_newest_step_wins_and_a_corrupt_one_falls_back(tmp_path: Path) -> None:
    l0, l1 = tmp_path / "l0", tmp_path / "l1"
    write_steps(l1, (10, 20))
    write_steps(l0, (20, 23, 24))
    layers = (("l0", l0), ("l1", l1))
    reported: list[tuple[str, str]] = []

    def report(layer: str, result: Verification) -> None:
        reported.append((layer, result.path.name))

    newest = load_newest_of(layers, on_invalid=report)
    assert newest.loaded is not None and (newest.layer, newest.loaded.step) == ("l0", 24)
    # Both of L0's newer ones corrupt: skipped with their layer; at step 20 the first layer wins.
    _flip_one_byte(l0 / "step-00000024")
    _delete_manifest(l0 / "step-00000023")
    fallback = load_newest_of(layers, on_invalid=report)
    assert fallback.loaded is not None and (fallback.layer, fallback.loaded.step) == ("l0", 20)
    assert fallback.skipped_layers == ("l0", "l0")
    assert reported == [("l0", "step-00000024"), ("l0", "step-00000023")]
    _truncate(l0 / "step-00000020")
    from_l1 = load_newest_of(layers)
    assert from_l1.loaded is not None and (from_l1.layer, from_l1.loaded.step) == ("l1", 20)
    assert [v.path for v in from_l1.skipped] == [
        l0 / "step-00000024",
        l0 / "step-00000023",
        l0 / "step-00000020",
    ]
