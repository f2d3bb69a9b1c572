"""Sharded checkpoints: several ranks' files, one global manifest, verified as one unit.

Also: a single writer's manifest is unchanged by the sharded form (old manifests still parse
and verify), and a sharded checkpoint is copied, shipped and restored whole by the code that
already handles whole step directories.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from test_layer_remote import MemoryStore

from trainguard.agent.shipper import Shipper
from trainguard.ckpt import (
    MANIFEST_FILENAME,
    CheckpointInvalidError,
    CheckpointTransaction,
    CheckpointWriteError,
    Contents,
    FileEntry,
    Manifest,
    ShardWriter,
    copy_checkpoint,
    find_newest_valid,
    hash_file,
    rank_dirname,
    scan,
    step_dirname,
    verify,
)
from trainguard.initsteps.restore import restore
from trainguard.layers import Credentials, FileLayer, LayerConfig
from trainguard.layers.base import RemoteLayer
from trainguard.layers.lineage import CheckpointRef, Origin, checkpoint_key

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

WORLD = 2
# What a layer opened outside a pod ships as.
LOCAL = Origin.of("", None)


def shard_payload(step: int, rank: int) -> bytes:
    return bytes([rank]) * 4096 + step.to_bytes(4, "little")


def save_sharded(root: Path, step: int, world: int = WORLD) -> Path:
    """What a gang's save does: every rank writes its shard, the coordinator commits last."""
    with CheckpointTransaction(root, step, world_size=world, metadata={"k": "v"}) as txn:
        for rank in range(world):
            # Each rank knows only the coordinator's temporary directory.
            shard = ShardWriter(txn.tmp_dir, rank)
            shard.write_file("weights.bin", shard_payload(step, rank))
            with shard.create("optim/moments.bin") as writer:
                writer.write(b"m" * (rank + 1))
            txn.add_shard(rank, shard.close())
        txn.write_file(".metadata", b"global index")
        return txn.commit().path


def flip_byte(path: Path, offset: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def rank_file(checkpoint: Path, rank: int, name: str = "weights.bin") -> Path:
    return checkpoint / rank_dirname(rank) / name


# An on-disk manifest exactly as a single writer wrote it before the sharded form existed.
OLD_MANIFEST = {
    "format_version": 1,
    "step": 3,
    "time": 1.5,
    "contents": "full",
    "hash_algorithm": "xxh3-128",
    "files": [{"path": "model.safetensors", "size": 5, "hash": ""}],
    "metadata": {"producer": "trainguard-harness"},
}


def test_an_old_single_writer_checkpoint_still_parses_and_verifies(tmp_path: Path) -> None:
    checkpoint = tmp_path / step_dirname(3)
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"abcde")
    _, digest = hash_file(checkpoint / "model.safetensors", "xxh3-128")
    old = {**OLD_MANIFEST, "files": [{"path": "model.safetensors", "size": 5, "hash": digest}]}
    raw = (json.dumps(old, indent=1) + "\n").encode()
    (checkpoint / MANIFEST_FILENAME).write_bytes(raw)
    result = verify(checkpoint)
    assert result.ok, result.reasons
    assert result.manifest is not None and not result.manifest.sharded
    # Written again, it is the same bytes: the sharded fields never appear in this form.
    assert result.manifest.to_json_bytes() == raw


def test_a_single_writer_commit_records_no_sharded_fields(tmp_path: Path) -> None:
    with CheckpointTransaction(tmp_path, 1) as txn:
        txn.write_file("model.bin", b"x")
        path = txn.commit().path
    on_disk = json.loads((path / MANIFEST_FILENAME).read_bytes())
    assert "world_size" not in on_disk
    assert all("rank" not in entry for entry in on_disk["files"])


def test_a_sharded_checkpoint_lists_every_ranks_files_and_verifies(tmp_path: Path) -> None:
    path = save_sharded(tmp_path, 40)
    assert path == tmp_path / step_dirname(40)
    result = verify(path)
    assert result.ok, result.reasons
    manifest = result.manifest
    assert manifest is not None and manifest.world_size == WORLD and manifest.sharded
    ranks = {entry.path: entry.rank for entry in manifest.files}
    assert ranks == {
        ".metadata": None,
        "rank-00000/optim/moments.bin": 0,
        "rank-00000/weights.bin": 0,
        "rank-00001/optim/moments.bin": 1,
        "rank-00001/weights.bin": 1,
    }
    assert Manifest.from_json_bytes(manifest.to_json_bytes()) == manifest
    assert rank_file(path, 1).read_bytes() == shard_payload(40, 1)


def test_a_flipped_byte_in_one_ranks_shard_invalidates_the_whole_checkpoint(
    tmp_path: Path,
) -> None:
    path = save_sharded(tmp_path, 40)
    flip_byte(rank_file(path, 1))
    result = verify(path)
    assert not result.ok
    (problem,) = result.problems
    assert problem.file == "rank-00001/weights.bin"
    assert problem.reason == "xxh3-128 hash mismatch (rank 1 of 2)"
    # Without hashes the cheap check cannot see it; with a missing file it can.
    assert verify(path, check_hashes=False).ok
    rank_file(path, 0).unlink()
    assert verify(path, check_hashes=False).reasons == (
        "rank-00000/weights.bin: missing (rank 0 of 2)",
    )


def test_no_manifest_until_every_rank_has_reported(tmp_path: Path) -> None:
    with CheckpointTransaction(tmp_path, 5, world_size=WORLD) as txn:
        shard = ShardWriter(txn.tmp_dir, 0)
        shard.write_file("weights.bin", b"rank 0")
        txn.add_shard(0, shard.close())
        # Rank 1 died mid-save: it wrote a file but never reported.
        ShardWriter(txn.tmp_dir, 1).write_file("weights.bin", b"half")
        with pytest.raises(CheckpointWriteError, match=r"no shard reported by rank\(s\) \[1\]"):
            txn.commit()
        assert not (txn.tmp_dir / MANIFEST_FILENAME).exists()
    found = scan(tmp_path)
    assert found.valid == () and found.invalid == () and found.partial == ()
    assert find_newest_valid(tmp_path).newest is None


def test_a_save_abandoned_before_the_commit_is_never_a_checkpoint(tmp_path: Path) -> None:
    save_sharded(tmp_path, 10)
    # The coordinator dies before its commit: the shards lie in a hidden temporary directory.
    txn = CheckpointTransaction(tmp_path, 20, world_size=WORLD)
    for rank in range(WORLD):
        shard = ShardWriter(txn.tmp_dir, rank)
        shard.write_file("weights.bin", shard_payload(20, rank))
        txn.add_shard(rank, shard.close())
    found = scan(tmp_path)
    assert [v.step for v in found.valid] == [10]
    assert found.partial == (txn.tmp_dir,)
    newest = find_newest_valid(tmp_path).newest
    assert newest is not None and newest.step == 10


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (FileEntry(path="rank-00001/weights.bin", size=6, hash="h", rank=1), "not a file of"),
        (FileEntry(path="weights.bin", size=6, hash="h", rank=0), "not a file of"),
        (FileEntry(path="rank-00000/other.bin", size=6, hash="h", rank=0), "not written"),
        (FileEntry(path="rank-00000/weights.bin", size=7, hash="h", rank=0), "reported 7 bytes"),
    ],
)
def test_a_ranks_report_must_match_what_it_wrote(
    tmp_path: Path, entry: FileEntry, message: str
) -> None:
    with CheckpointTransaction(tmp_path, 5, world_size=WORLD) as txn:
        ShardWriter(txn.tmp_dir, 0).write_file("weights.bin", b"rank 0")
        with pytest.raises(CheckpointWriteError, match=message):
            txn.add_shard(0, [entry])


def test_a_rank_reports_once_and_within_the_world(tmp_path: Path) -> None:
    with CheckpointTransaction(tmp_path, 5, world_size=WORLD) as txn:
        txn.add_shard(0, ())
        with pytest.raises(CheckpointWriteError, match="already reported"):
            txn.add_shard(0, ())
        with pytest.raises(CheckpointWriteError, match="outside world_size"):
            txn.add_shard(2, ())
    with CheckpointTransaction(tmp_path, 6) as single, pytest.raises(CheckpointWriteError):
        single.add_shard(0, ())


def test_a_rank_with_nothing_to_save_reports_an_empty_shard(tmp_path: Path) -> None:
    with CheckpointTransaction(tmp_path, 8, world_size=WORLD) as txn:
        shard = ShardWriter(txn.tmp_dir, 0)
        shard.write_file("weights.bin", b"all of it")
        txn.add_shard(0, shard.close())
        txn.add_shard(1, ())
        path = txn.commit().path
    assert verify(path).ok


BASE = {
    "format_version": 1,
    "step": 1,
    "time": 0.0,
    "contents": "full",
    "hash_algorithm": "xxh3-128",
}


@pytest.mark.parametrize(
    "fields",
    [
        # A rank without a world size, or beyond it.
        {"files": [{"path": "rank-00000/a", "size": 1, "hash": "h", "rank": 0}]},
        {"world_size": 2, "files": [{"path": "rank-00002/a", "size": 1, "hash": "h", "rank": 2}]},
        # A rank's file outside its directory, in another rank's, a global one inside one.
        {"world_size": 2, "files": [{"path": "a", "size": 1, "hash": "h", "rank": 0}]},
        {"world_size": 2, "files": [{"path": "rank-00001/a", "size": 1, "hash": "h", "rank": 0}]},
        {"world_size": 2, "files": [{"path": "rank-00001/a", "size": 1, "hash": "h"}]},
        {"world_size": 0, "files": []},
        {"world_size": 2, "files": [{"path": "rank-00000/a", "size": 1, "hash": "h", "rank": -1}]},
    ],
)
def test_malformed_sharded_manifests_are_rejected(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Manifest.model_validate({**BASE, **fields})


def test_a_malformed_sharded_manifest_makes_the_checkpoint_invalid(tmp_path: Path) -> None:
    path = save_sharded(tmp_path, 3)
    on_disk = json.loads((path / MANIFEST_FILENAME).read_bytes())
    on_disk["world_size"] = 1  # rank 1's files would be outside the world
    (path / MANIFEST_FILENAME).write_text(json.dumps(on_disk))
    result = verify(path)
    assert not result.ok
    assert result.reasons[0].startswith("malformed MANIFEST.json")


def test_a_copy_keeps_the_world_size_and_every_files_rank(tmp_path: Path) -> None:
    source = save_sharded(tmp_path / "l1", 30)
    committed = copy_checkpoint(source, tmp_path / "remote")
    copied = verify(committed.path)
    assert copied.ok, copied.reasons
    original = verify(source).manifest
    assert copied.manifest is not None and original is not None
    assert copied.manifest.world_size == WORLD
    assert copied.manifest.files == original.files
    assert rank_file(committed.path, 1).read_bytes() == shard_payload(30, 1)


def test_a_weights_subset_of_a_sharded_checkpoint_stays_valid(tmp_path: Path) -> None:
    source = save_sharded(tmp_path / "l1", 30)
    committed = copy_checkpoint(
        source,
        tmp_path / "weights",
        paths=["rank-00000/weights.bin", "rank-00001/weights.bin"],
        contents=Contents.WEIGHTS,
    )
    result = verify(committed.path)
    assert result.ok, result.reasons
    assert result.manifest is not None
    assert [e.rank for e in result.manifest.files] == [0, 1]


def test_a_copy_refuses_a_source_with_a_corrupt_shard(tmp_path: Path) -> None:
    source = save_sharded(tmp_path / "l1", 30)
    flip_byte(rank_file(source, 1))
    with pytest.raises(CheckpointInvalidError, match=r"rank-00001/weights\.bin"):
        copy_checkpoint(source, tmp_path / "remote")
    assert scan(tmp_path / "remote").valid == ()


def _layer(root: Path) -> FileLayer:
    return FileLayer(LayerConfig("backup", f"file://{root}", contents="full", keep=5), root)


def test_a_sharded_checkpoint_is_shipped_and_restored_as_one(tmp_path: Path) -> None:
    l1, remote = tmp_path / "l1", tmp_path / "remote"
    layer = _layer(remote)
    shipper = Shipper(l1, [layer])
    for step in (100, 200):
        save_sharded(l1, step)
        shipper.ship_once()
    assert [ref.step for ref in layer.checkpoints()] == [100, 200]
    fresh = tmp_path / "fresh-l1"
    result = restore(fresh, [layer])
    assert (result.step, result.from_layer) == (200, "backup")
    restored = verify(fresh / step_dirname(200))
    assert restored.ok and restored.manifest is not None
    assert restored.manifest.world_size == WORLD


def test_restore_skips_a_checkpoint_whose_rank_1_shard_is_corrupt(tmp_path: Path) -> None:
    # On the layer (a member's replacement starts with an empty L1) ...
    remote = tmp_path / "remote"
    shipped = remote / LOCAL.path
    save_sharded(shipped, 100)
    flip_byte(rank_file(save_sharded(shipped, 200), 1))
    fresh = tmp_path / "fresh-l1"
    result = restore(fresh, [_layer(remote)])
    assert (result.step, result.from_layer) == (100, "backup")
    assert [f.file for f in result.findings] == ["rank-00001/weights.bin"]
    assert any("step 200" in line for line in result.skipped)
    assert not (fresh / step_dirname(200)).exists()
    assert verify(fresh / step_dirname(100)).ok

    # ... and in L1 itself (an in-place restart of the gang).
    l1 = tmp_path / "l1"
    save_sharded(l1, 100)
    flip_byte(rank_file(save_sharded(l1, 200), 1))
    result = restore(l1, [])
    assert (result.step, result.from_layer) == (100, "l1")
    assert [f.file for f in result.findings] == ["rank-00001/weights.bin"]
    assert (l1 / step_dirname(200)).exists()  # reported and skipped, never deleted


def test_a_remote_layer_restores_a_sharded_checkpoint_whole_or_not_at_all(tmp_path: Path) -> None:
    store = MemoryStore()
    layer = RemoteLayer(LayerConfig("mem", "s3://bucket/prefix"), store, Credentials({}))
    for step in (100, 200):
        layer.put(save_sharded(tmp_path / "l1", step))
    # Only rank 1's shard of step 200 is damaged on the layer (same length and ends).
    key = checkpoint_key(CheckpointRef(200, LOCAL), "rank-00001/weights.bin")
    data = bytearray(store.objects[key])
    data[100] ^= 1
    store.objects[key] = bytes(data)
    fresh = tmp_path / "fresh-l1"
    result = restore(fresh, [layer])
    assert (result.step, result.from_layer) == (100, "mem")
    assert [f.file for f in result.findings] == ["rank-00001/weights.bin"]
    assert not (fresh / step_dirname(200)).exists()
    restored = verify(fresh / step_dirname(100))
    assert restored.ok, restored.reasons
    original = verify(tmp_path / "l1" / step_dirname(100)).manifest
    assert restored.manifest is not None and original is not None
    # The fetched copy keeps the sharded record: the world size and every file's rank.
    assert restored.manifest.world_size == original.world_size == 2
    assert [(e.path, e.size, e.hash, e.rank) for e in restored.manifest.files] == [
        (e.path, e.size, e.hash, e.rank) for e in original.files
    ]
