"""DCP through trainguard: an FSDP2 state saved on 2 CPU ranks (gloo) is one verified checkpoint.

The ranks run `dcp_ranks` under `torch.multiprocessing.spawn`; this process only inspects what
they wrote and compares what they saved with what a fresh model holds after loading.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dcp_ranks
import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from trainguard.ckpt import find_newest_valid, rank_dirname, scan, step_dirname, verify
from trainguard_harness.dcp import (
    DCP_METADATA_FILENAME,
    PRODUCER,
    trainguard_reader,
    trainguard_writer,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]

WORLD = dcp_ranks.WORLD
STEP = 40


def spawn(job: Callable[..., None], tmp: Path, *args: Any) -> None:
    """Run `job(rank, rendezvous, *args)` on WORLD ranks; raises if any rank fails."""
    rendezvous = tmp / f"rendezvous-{job.__name__}-{len(list(tmp.iterdir()))}"
    mp.spawn(job, args=(rendezvous, *args), nprocs=WORLD, join=True)


def save(tmp: Path, mode: str, step: int = STEP) -> tuple[Path, Path]:
    """Save through the writer on WORLD ranks: (the checkpoint root, the ranks' output dir)."""
    root, out = tmp / "l1", tmp / f"out-{mode}"
    out.mkdir()
    spawn(dcp_ranks.save, tmp, root, step, out, mode)
    return root, out


def load(tmp: Path, checkpoint: Path, name: str) -> Path:
    """Load `checkpoint` on WORLD ranks into a fresh model; returns the ranks' output dir."""
    out = tmp / f"out-load-{name}"
    out.mkdir()
    spawn(dcp_ranks.load, tmp, checkpoint, out)
    return out


def assert_bit_identical(saved: Path, loaded: Path) -> None:
    for rank in range(WORLD):
        expected = torch.load(saved / f"expected-{rank}.pt", weights_only=True)
        fresh = torch.load(loaded / f"fresh-{rank}.pt", weights_only=True)
        got = torch.load(loaded / f"loaded-{rank}.pt", weights_only=True)
        assert sorted(got) == sorted(expected)
        tensors = [key for key, value in expected.items() if isinstance(value, torch.Tensor)]
        # Weights and both AdamW moments of every layer, sharded: real state, not a few scalars.
        assert sum(key.startswith("model/") for key in tensors) == 6
        assert sum(key.endswith("/exp_avg_sq/") for key in tensors) == 6
        # The fresh model differed in every weight and moment: the load put the state there.
        assert not any(
            torch.equal(expected[key], fresh[key])
            for key in tensors
            if key.startswith("model/") or key.endswith("/exp_avg/")
        )
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == got[key].dtype, key
                assert torch.equal(value, got[key]), key
            else:
                assert value == got[key], key


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An FSDP2 model and optimizer state, trained two steps, saved with `dcp.save`."""
    return save(tmp_path_factory.mktemp("dcp-sync"), "sync")


def test_a_saved_fsdp2_state_is_one_verified_sharded_checkpoint(saved: tuple[Path, Path]) -> None:
    root, _ = saved
    found = scan(root)
    assert [v.step for v in found.valid] == [STEP]
    assert found.invalid == () and found.partial == ()
    result = verify(root / step_dirname(STEP))
    assert result.ok, result.reasons
    manifest = result.manifest
    assert manifest is not None and manifest.world_size == WORLD
    assert manifest.metadata["producer"] == PRODUCER
    by_rank: dict[int | None, list[str]] = {}
    for entry in manifest.files:
        by_rank.setdefault(entry.rank, []).append(entry.path)
    assert by_rank[None] == [DCP_METADATA_FILENAME]
    for rank in range(WORLD):
        assert by_rank[rank], rank
        assert all(path.startswith(rank_dirname(rank) + "/") for path in by_rank[rank])


def test_it_restores_bit_identical_into_a_fresh_model(
    saved: tuple[Path, Path], tmp_path: Path
) -> None:
    root, out = saved
    loaded = load(tmp_path, root / step_dirname(STEP), "clean")
    assert_bit_identical(out, loaded)


def test_a_flipped_byte_in_one_ranks_shard_is_named_and_refused(
    saved: tuple[Path, Path], tmp_path: Path
) -> None:
    root, _ = saved
    copy = tmp_path / "l1" / step_dirname(STEP)
    shutil.copytree(root / step_dirname(STEP), copy)
    manifest = verify(copy).manifest
    assert manifest is not None
    victim = next(entry for entry in manifest.files if entry.rank == 1)
    data = bytearray((copy / victim.path).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / victim.path).write_bytes(bytes(data))

    result = verify(copy)
    assert not result.ok
    assert [problem.file for problem in result.problems] == [victim.path]
    assert "(rank 1 of 2)" in result.problems[0].reason

    out = load(tmp_path, copy, "corrupt")
    for rank in range(WORLD):
        assert not (out / f"loaded-{rank}.pt").exists()
        # Every rank gets the coordinator's refusal, naming the file, before anything is read.
        refusal = (out / f"refused-{rank}.txt").read_text()
        assert "CheckpointInvalidError" in refusal
        assert f"{victim.path}: xxh3-128 hash mismatch (rank 1 of 2)" in refusal


def test_async_save_through_the_writer_restores_bit_identical(tmp_path: Path) -> None:
    root, out = save(tmp_path, "async")
    assert verify(root / step_dirname(STEP)).ok
    loaded = load(tmp_path, root / step_dirname(STEP), "async")
    assert_bit_identical(out, loaded)


@pytest.mark.parametrize("mode", ["dies-while-writing", "dies-before-finish"])
def test_a_save_killed_before_the_coordinators_finish_is_no_checkpoint(
    tmp_path: Path, mode: str
) -> None:
    # The killed rank, or its peer failing on the broken connection first.
    with pytest.raises((mp.ProcessExitedException, mp.ProcessRaisedException)):
        save(tmp_path, mode)
    root = tmp_path / "l1"
    found = scan(root)
    # The previous save (step 39) is whole; the killed one is a hidden partial directory.
    assert [v.step for v in found.valid] == [STEP - 1]
    assert found.invalid == ()
    (partial,) = found.partial
    # Rank 1 had written its shard in both cases: only the global manifest was missing.
    assert any((partial / rank_dirname(1)).iterdir())
    assert not (partial / "MANIFEST.json").exists()
    newest = find_newest_valid(root).newest
    assert newest is not None and newest.step == STEP - 1


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.filterwarnings("ignore:torch.distributed is unavailable:UserWarning")
def test_one_process_with_several_writer_threads_lists_exactly_what_it_wrote(
    tmp_path: Path,
) -> None:
    state = {"big": torch.randn(4096), "small": torch.arange(10), "extra": {"position": 7}}
    # Four writer threads for three items: DCP's own writer leaves empty files, never listed.
    dcp.save(state, storage_writer=trainguard_writer(tmp_path, 3, thread_count=4))
    checkpoint = tmp_path / step_dirname(3)
    result = verify(checkpoint)
    assert result.ok, result.reasons
    assert result.manifest is not None and result.manifest.world_size == 1
    on_disk = sorted(
        path.relative_to(checkpoint).as_posix()
        for path in checkpoint.rglob("*")
        if path.is_file() and path.name != "MANIFEST.json"
    )
    assert on_disk == sorted(entry.path for entry in result.manifest.files)
    # DCP opens one file per thread; those left without an item were never created.
    assert 1 <= len([path for path in on_disk if path.startswith(rank_dirname(0))]) < 4

    loaded = {
        "big": torch.zeros(4096),
        "small": torch.zeros(10, dtype=torch.long),
        "extra": {"position": 0},
    }
    dcp.load(loaded, storage_reader=trainguard_reader(checkpoint))
    assert torch.equal(loaded["big"], state["big"]) and torch.equal(loaded["small"], state["small"])
    assert loaded["extra"] == {"position": 7}


def test_a_save_its_coordinator_cannot_settle_fails_on_every_rank_alike(tmp_path: Path) -> None:
    """A save that counts on some ranks only would leave them saving at different steps."""
    root, out = tmp_path / "l1", tmp_path / "out"
    out.mkdir()
    spawn(dcp_ranks.unsettled_save, tmp_path, root, out)
    results = [(out / f"result-{rank}.txt").read_text() for rank in range(WORLD)]
    # The first save failed on both ranks (nothing saved), the final one succeeded on both.
    assert results == ["False None 10"] * WORLD
    assert [c.step for c in scan(root).valid] == [10]
