"""Shipping verified L1 checkpoints to a file:// layer and restoring the newest valid one."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from trainguard.agent.shipper import FAILED, SHIPPER_NICE, VERIFIED, Shipper
from trainguard.ckpt import CheckpointTransaction, Contents, scan, step_dirname
from trainguard.initsteps.restore import restore
from trainguard.layers import FileLayer, LayerConfig, Transfer, open_layer
from trainguard.layers.lineage import CheckpointRef, Origin
from trainguard_dev.testing.polling import eventually

pytestmark = pytest.mark.unit

# What a layer opened outside a pod ships as.
LOCAL = Origin.of("", None)


def ref(step: int) -> CheckpointRef:
    """A checkpoint shipped outside a pod."""
    return CheckpointRef(step, LOCAL)


def steps(layer: FileLayer) -> list[int]:
    """The steps of the complete checkpoints on the layer."""
    return [r.step for r in layer.checkpoints()]


def _save(root: Path, step: int, payload: bytes = b"x" * 4096) -> Path:
    with CheckpointTransaction(root, step, contents=Contents.FULL) as txn:
        txn.write_file("model.bin", payload + step.to_bytes(4, "little"))
        txn.write_file("optimizer.bin", payload[::-1])
        committed = txn.commit()
    return Path(committed.path)


def _layer(root: Path, name: str = "backup", contents: str = "full", keep: int = 2) -> FileLayer:
    return FileLayer(LayerConfig(name, f"file://{root}", contents=contents, keep=keep), root)


def test_ships_newest_and_keeps_n(tmp_path: Path) -> None:
    l1, remote = tmp_path / "l1", tmp_path / "remote"
    layer = _layer(remote, keep=2)
    shipper = Shipper(l1, [layer])
    for step in (10, 20, 30):
        _save(l1, step)
        shipper.ship_once()
    assert steps(layer) == [20, 30]
    state = shipper.states()["backup"]
    assert state["state"] == VERIFIED
    assert state["step"] == 30
    assert layer.checkpoints() == [ref(20), ref(30)]
    assert all(not layer.verify(r) for r in layer.checkpoints())


def test_corrupt_l1_checkpoint_is_never_shipped(tmp_path: Path) -> None:
    l1, remote = tmp_path / "l1", tmp_path / "remote"
    _save(l1, 10)
    bad = _save(l1, 20)
    data = bytearray((bad / "model.bin").read_bytes())
    data[0] ^= 0xFF
    (bad / "model.bin").write_bytes(bytes(data))
    layer = _layer(remote)
    Shipper(l1, [layer]).ship_once()
    assert steps(layer) == [10]


def test_weights_layer_gets_weights_only(tmp_path: Path) -> None:
    l1, remote = tmp_path / "l1", tmp_path / "remote"
    _save(l1, 5)
    layer = _layer(remote, contents="weights")
    Shipper(l1, [layer]).ship_once()
    shipped = remote / ref(5).path
    assert sorted(p.name for p in shipped.iterdir()) == ["MANIFEST.json", "model.bin"]
    manifest = scan(remote / LOCAL.path).valid[0].manifest
    assert manifest is not None
    assert manifest.contents == Contents.WEIGHTS


def test_failed_upload_is_reported_with_the_error(tmp_path: Path) -> None:
    l1 = tmp_path / "l1"
    _save(l1, 1)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the layer's directory should be")
    shipper = Shipper(l1, [_layer(blocker)])
    shipper.ship_once()
    state = shipper.states()["backup"]
    assert state["state"] == FAILED
    assert state["error"]


def test_restore_prefers_newest_then_cheapest_and_skips_corrupt(tmp_path: Path) -> None:
    l1, remote = tmp_path / "l1", tmp_path / "remote"
    for step in (10, 20):
        _save(remote / LOCAL.path, step)  # where a layer opened outside a pod keeps them
    _save(l1, 10)
    layer = _layer(remote)
    result = restore(l1, [layer])
    assert (result.step, result.from_layer) == (20, "backup")
    assert (l1 / step_dirname(20) / "MANIFEST.json").exists()

    # Equal steps: the local copy is the cheapest source.
    assert restore(l1, [layer]).from_layer == "l1"

    # A corrupt newest copy on a fresh node: reported and skipped, the previous one restored.
    fresh = tmp_path / "fresh-l1"
    victim = remote / ref(20).path / "optimizer.bin"
    victim.write_bytes(b"corrupted")
    result = restore(fresh, [layer])
    assert (result.step, result.from_layer) == (10, "backup")
    assert any("step 20" in line for line in result.skipped)


def test_restore_with_nothing_anywhere_starts_fresh(tmp_path: Path) -> None:
    result = restore(tmp_path / "l1", [_layer(tmp_path / "remote")])
    assert result.step is None


def test_flush_ships_now_despite_cadence(tmp_path: Path) -> None:
    l1, remote = tmp_path / "l1", tmp_path / "remote"
    layer = FileLayer(LayerConfig("slow", f"file://{remote}", every_seconds=3600), remote)
    shipper = Shipper(l1, [layer])
    _save(l1, 1)
    shipper.ship_once()
    _save(l1, 2)
    shipper.ship_once()
    assert steps(layer) == [1]  # the cadence held step 2 back
    assert shipper.flush(timeout_s=5)
    assert steps(layer) == [1, 2]


def test_open_layer_uses_the_mounted_path(tmp_path: Path) -> None:
    cfg = LayerConfig("nfs-backup", "file:///backups/run")
    layer = open_layer(cfg, {"TRAINGUARD_LAYER_PATH_NFS_BACKUP": str(tmp_path)})
    assert isinstance(layer, FileLayer)
    assert layer.root == tmp_path


def _nice_of_thread(native_id: int) -> int:
    # /proc/<pid>/task/<tid>/stat: field 19 is the nice value (after the parenthesised name).
    stat = Path(f"/proc/self/task/{native_id}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def test_shipping_runs_at_a_lower_cpu_priority_than_training(tmp_path: Path) -> None:
    l1, remote = tmp_path / "l1", tmp_path / "remote"
    seen: list[int] = []

    class Watching(FileLayer):
        def put(self, checkpoint: Path, transfer: Transfer | None = None) -> CheckpointRef:
            # Runs on one of the shipper's upload threads.
            seen.append(_nice_of_thread(threading.get_native_id()))
            return super().put(checkpoint, transfer)

    _save(l1, 10)
    layer = Watching(LayerConfig("backup", f"file://{remote}"), remote)
    shipper = Shipper(l1, [layer], poll_s=0.05)
    shipper.start()
    try:
        eventually(lambda: steps(layer), 10, "a shipped checkpoint", 0.05)
        assert shipper.native_id is not None
        assert _nice_of_thread(shipper.native_id) == SHIPPER_NICE
    finally:
        shipper.stop()
        shipper.join(timeout=10)
    assert steps(layer) == [10]
    assert seen and all(nice == SHIPPER_NICE for nice in seen), seen
    assert _nice_of_thread(threading.get_native_id()) == 0  # the caller's own is untouched
