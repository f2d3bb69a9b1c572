"""Pinning a checkpoint: it outlives keep-last-N, is never read as one, its maker removes it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trainguard.ckpt import (
    CheckpointTransaction,
    find_newest_valid,
    pin_checkpoint,
    prune,
    remove_partials,
    remove_pins,
    room_in_checkpoints,
    scan,
    unpin_checkpoint,
    verify,
)
from trainguard.contract.files import SHARED_UMASK

pytestmark = pytest.mark.unit


def write_checkpoint(root: Path, step: int) -> Path:
    with CheckpointTransaction(root, step) as txn:
        txn.write_file("model.bin", bytes([step]) * 4096)
        txn.write_file("optim/state.bin", bytes([step]) * 512)  # a file in a subdirectory
        return txn.commit().path


def test_a_pinned_checkpoint_outlives_keep_last_n(tmp_path: Path) -> None:
    first = write_checkpoint(tmp_path, 1)
    pinned = pin_checkpoint(first)
    assert pinned.name == first.name
    assert (pinned / "model.bin").stat().st_ino == (first / "model.bin").stat().st_ino
    write_checkpoint(tmp_path, 2)

    result = prune(tmp_path, keep_last=1)

    assert [p.name for p in result.deleted] == [first.name]
    assert not first.exists()
    check = verify(pinned)  # every hash, from the pin alone
    assert check.ok, check.reasons
    assert check.step == 1


def test_a_pin_is_never_read_as_a_checkpoint_and_the_writer_leaves_it(tmp_path: Path) -> None:
    pinned = pin_checkpoint(write_checkpoint(tmp_path, 7))
    write_checkpoint(tmp_path, 3)
    prune(tmp_path, keep_last=1)

    found = scan(tmp_path)
    assert [v.step for v in found.valid] == [7]
    assert found.pinned == (pinned.parent,)
    assert found.partial == () and found.quarantined == ()
    assert find_newest_valid(tmp_path).newest is not None
    assert remove_partials(tmp_path) == ()  # the writer's clean-up at its start
    assert pinned.is_dir()

    unpin_checkpoint(pinned)
    assert not pinned.parent.exists()
    assert (tmp_path / "step-00000007").is_dir()  # the original is not touched
    assert scan(tmp_path).pinned == ()


def test_pins_left_behind_are_removed_at_the_start(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path, 5)
    leftovers = {pin_checkpoint(checkpoint).parent, pin_checkpoint(checkpoint).parent}
    assert set(remove_pins(tmp_path)) == leftovers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000005"]
    assert verify(checkpoint).ok


def test_pinning_a_checkpoint_that_is_gone_leaves_nothing(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path, 4)
    write_checkpoint(tmp_path, 5)
    prune(tmp_path, keep_last=1)
    with pytest.raises(FileNotFoundError):
        pin_checkpoint(checkpoint)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000005"]


def test_checkpoint_files_are_group_writable_under_the_pods_umask(tmp_path: Path) -> None:
    # The agent runs as another user of the pod's group; the kernel's protected hard links let
    # it link (pin) only files it may write.
    previous = os.umask(SHARED_UMASK)
    try:
        checkpoint = write_checkpoint(tmp_path, 1)
    finally:
        os.umask(previous)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in checkpoint.rglob("*") if p.is_file()}
    assert modes == {0o664}


@pytest.mark.parametrize(
    ("keep_last", "remote_layers", "room"),
    [(2, 0, 3), (2, 1, 4), (2, 2, 5), (2, 5, 5), (1, 3, 4)],
)
def test_room_counts_one_pinned_checkpoint_per_concurrent_upload(
    keep_last: int, remote_layers: int, room: int
) -> None:
    assert room_in_checkpoints(keep_last, remote_layers) == room
