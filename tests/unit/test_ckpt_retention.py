"""Keep-last-N: keeps the newest verified, never deletes invalid ones, reports everything."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from trainguard.ckpt import CheckpointTransaction, hash_file, prune, remove_partials, scan

pytestmark = pytest.mark.unit


def write_checkpoint(root: Path, step: int) -> Path:
    with CheckpointTransaction(root, step) as txn:
        txn.write_file("model.bin", bytes([step]) * 512)
        return txn.commit().path


def corrupt(path: Path) -> None:
    data = bytearray((path / "model.bin").read_bytes())
    data[0] ^= 0xFF
    (path / "model.bin").write_bytes(bytes(data))


def test_keeps_the_newest_n_and_deletes_older_valid_ones(tmp_path: Path) -> None:
    for step in range(1, 6):
        write_checkpoint(tmp_path, step)
    result = prune(tmp_path, keep_last=2)
    assert [p.name for p in result.kept] == ["step-00000005", "step-00000004"]
    assert sorted(p.name for p in result.deleted) == [f"step-0000000{i}" for i in (1, 2, 3)]
    assert result.invalid == ()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000005"]


def test_an_invalid_newest_never_costs_the_newest_verified(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        write_checkpoint(tmp_path, step)
    corrupt(tmp_path / "step-00000003")
    result = prune(tmp_path, keep_last=1)
    # step 3 does not verify, so step 2 is the newest verified and must stay.
    assert [p.name for p in result.kept] == ["step-00000002"]
    assert [p.name for p in result.deleted] == ["step-00000001"]
    assert [v.path.name for v in result.invalid] == ["step-00000003"]
    assert (tmp_path / "step-00000003").is_dir()


def test_invalid_older_checkpoints_are_reported_and_kept(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        write_checkpoint(tmp_path, step)
    (tmp_path / "step-00000001" / "model.bin").unlink()
    result = prune(tmp_path, keep_last=2)
    assert [p.name for p in result.deleted] == ["step-00000002"]
    assert [v.path.name for v in result.invalid] == ["step-00000001"]
    after = scan(tmp_path)
    assert [v.step for v in after.valid] == [3, 4]
    assert [v.step for v in after.invalid] == [1]


def test_a_checkpoint_a_reader_found_invalid_is_kept_though_its_sizes_match(
    tmp_path: Path,
) -> None:
    """Older than the N kept, only sizes are checked: a flipped byte needs the caller's word."""
    for step in (1, 2, 3):
        write_checkpoint(tmp_path, step)
    corrupt(tmp_path / "step-00000001")  # the same size: the cheap check cannot see it
    known = {tmp_path / "step-00000001"}
    result = prune(tmp_path, keep_last=1, known_invalid=known)
    assert [p.name for p in result.deleted] == ["step-00000002"]
    assert [p.name for p in result.kept] == ["step-00000003"]
    assert (tmp_path / "step-00000001").is_dir()
    # Unnamed, it would pass for a superseded checkpoint.
    assert [p.name for p in prune(tmp_path, keep_last=1).deleted] == ["step-00000001"]


def test_nothing_verified_means_nothing_deleted(tmp_path: Path) -> None:
    for step in (1, 2):
        corrupt(write_checkpoint(tmp_path, step))
    result = prune(tmp_path, keep_last=1)
    assert result.kept == () and result.deleted == ()
    assert len(result.invalid) == 2


def test_keep_last_must_keep_something(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        prune(tmp_path, keep_last=0)


def test_remove_partials_clears_leftovers_but_not_checkpoints_or_quarantine(
    tmp_path: Path,
) -> None:
    write_checkpoint(tmp_path, 1)
    leftover = CheckpointTransaction(tmp_path, 2)
    leftover.write_file("model.bin", b"half")
    (tmp_path / ".deleting-step-00000000-1-2").mkdir()
    (tmp_path / ".invalid-step-00000003-1-2").mkdir()
    removed = remove_partials(tmp_path)
    assert sorted(p.name for p in removed) == [
        ".deleting-step-00000000-1-2",
        leftover.tmp_dir.name,
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".invalid-step-00000003-1-2",
        "step-00000001",
    ]
    assert remove_partials(tmp_path / "absent") == ()


def test_remove_partials_of_one_leftover_by_two_ranks_at_once_both_succeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank of a restarted sharded launch clears the killed launch's partial save.

    Another rank removes `rank-00000` just before this one does: gone already, no error.
    """
    leftover = CheckpointTransaction(tmp_path, 25)
    for rank in (0, 1):
        leftover.write_file(f"rank-0000{rank}/shard.distcp", b"half")
    real_rmdir = os.rmdir

    def removed_first_by_another(path: str, *args: object, **kwargs: object) -> None:
        real_rmdir(path, *args, **kwargs)  # type: ignore[arg-type]
        if path == "rank-00000":
            raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(os, "rmdir", removed_first_by_another)
    assert [p.name for p in remove_partials(tmp_path)] == [leftover.tmp_dir.name]
    assert list(tmp_path.iterdir()) == []


def test_checkpoints_the_caller_verified_are_not_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (1, 2, 3):
        write_checkpoint(tmp_path, step)
    hashed: list[str] = []
    real = hash_file

    def counting(path: Path, algorithm: str, **kwargs: bool) -> tuple[int, str]:
        hashed.append(Path(path).parent.name)
        return real(path, algorithm, **kwargs)

    # The package exports the function verify(), which hides the module of the same name.
    monkeypatch.setattr(sys.modules["trainguard.ckpt.verify"], "hash_file", counting)
    result = prune(tmp_path, keep_last=2, verified=[tmp_path / "step-00000003"])
    assert [p.name for p in result.kept] == ["step-00000003", "step-00000002"]
    assert hashed == ["step-00000002"]
