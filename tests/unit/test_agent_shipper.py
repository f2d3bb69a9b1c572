"""Shipping verified L1 checkpoints to a file:// layer and restoring the newest valid one."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainguard.agent.main import layers_report
from trainguard.agent.shipper import FAILED, SHIPPER_NICE, VERIFIED, Shipper
from trainguard.api.constants import ShippingState
from trainguard.ckpt import (
    CheckpointTransaction,
    Contents,
    pin_checkpoint,
    prune,
    scan,
    step_dirname,
)
from trainguard.initsteps.restore import restore
from trainguard.layers import FileLayer, LayerConfig, Transfer, open_layer
from trainguard.layers.lineage import CheckpointRef, Origin
from trainguard.operator.policies.layers import parse_layers
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
    assert (state["uploading"], state["step"], state["shipped"]) == (1, None, 0)
    # A layer that never verified a checkpoint still shows its failure in the status.
    (entry,) = parse_layers(layers_report(shipper.states())[0])
    assert entry.step is None
    assert entry.shipping is not None
    assert (entry.shipping.state, entry.shipping.step) == (ShippingState.FAILED, 1)
    assert entry.shipping.message and "backup" in entry.shipping.message


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


class GatedLayer(FileLayer):
    """A file:// layer whose copy does not start before the test lets it (a slow uplink)."""

    def __init__(self, config: LayerConfig, root: Path) -> None:
        super().__init__(config, root)
        self.entered: list[int] = []  # the steps whose put began
        self.gate = threading.Event()

    def put(self, checkpoint: Path, transfer: Transfer | None = None) -> CheckpointRef:
        self.entered.append(int(checkpoint.name.removeprefix("step-")))
        assert self.gate.wait(timeout=30), "the test never opened the gate"
        return super().put(checkpoint, transfer)


def _gated(root: Path, name: str = "slow", every_steps: int = 0) -> GatedLayer:
    return GatedLayer(LayerConfig(name, f"file://{root}", keep=2, every_steps=every_steps), root)


@contextmanager
def _running(shipper: Shipper) -> Iterator[Shipper]:
    shipper.start()
    try:
        yield shipper
    finally:
        for layer in shipper.layers:
            if isinstance(layer, GatedLayer):
                layer.gate.set()
        shipper.stop()
        shipper.join(timeout=30)
    assert not shipper.is_alive()


def test_an_upload_survives_keep_last_n_removing_its_checkpoint(tmp_path: Path) -> None:
    l1 = tmp_path / "l1"
    layer = _gated(tmp_path / "remote")
    _save(l1, 10)
    with _running(Shipper(l1, [layer], poll_s=0.05)) as shipper:
        eventually(lambda: layer.entered, 10, "the upload of step 10 to begin", 0.02)
        # The trainer goes on saving, and its keep-last-1 removes step 10 mid-upload.
        for step in (20, 30):
            _save(l1, step)
            assert shipper.newest_verified() == step  # seen, as the shipper's poll would
            prune(l1, keep_last=1)
        assert [v.step for v in scan(l1).valid] == [30]
        layer.gate.set()
        eventually(lambda: shipper.states()["slow"]["step"] == 30, 10, "step 30 shipped", 0.02)
    assert steps(layer) == [10, 30]
    assert not layer.verify(ref(10)) and not layer.verify(ref(30))
    state = shipper.states()["slow"]
    assert (state["state"], state["shipped"], state["skipped"]) == (VERIFIED, 2, 1)
    assert scan(l1).pinned == ()  # every pin went with its upload


def test_a_slow_layer_ships_the_newest_while_a_fast_one_ships_each(tmp_path: Path) -> None:
    l1 = tmp_path / "l1"
    slow = _gated(tmp_path / "slow")
    fast = _layer(tmp_path / "fast", name="fast", keep=5)
    _save(l1, 10)
    with _running(Shipper(l1, [slow, fast], poll_s=0.05)) as shipper:
        eventually(lambda: slow.entered and steps(fast) == [10], 10, "both layers at step 10")
        for step in (20, 30, 40):
            _save(l1, step)
            # The fast layer is not held back by the slow one's upload.
            eventually(lambda step=step: step in steps(fast), 10, f"step {step} on fast", 0.02)
        slow.gate.set()
        eventually(lambda: shipper.states()["slow"]["step"] == 40, 10, "step 40 on slow", 0.02)
    assert steps(fast) == [10, 20, 30, 40]
    assert steps(slow) == [10, 40]
    assert slow.entered == [10, 40]
    states = shipper.states()
    assert (states["fast"]["shipped"], states["fast"]["skipped"]) == (4, 0)
    assert (states["slow"]["shipped"], states["slow"]["skipped"]) == (2, 2)
    (fast_entry, slow_entry) = parse_layers(layers_report(states)[0])
    assert slow_entry.shipping is not None and fast_entry.shipping is not None
    assert (slow_entry.shipping.shipped, slow_entry.shipping.skipped) == (2, 2)
    assert (fast_entry.shipping.shipped, fast_entry.shipping.skipped) == (4, 0)


@pytest.mark.parametrize(
    ("every_steps", "skipped"),
    [(0, 4), (20, 2), (50, 0)],
    ids=["every-checkpoint", "every-20-steps", "every-50-steps"],
)
def test_skipped_counts_what_the_cadence_would_have_shipped(
    tmp_path: Path, every_steps: int, skipped: int
) -> None:
    l1 = tmp_path / "l1"
    layer = _gated(tmp_path / "remote", every_steps=every_steps)
    _save(l1, 10)
    with _running(Shipper(l1, [layer], poll_s=0.05)) as shipper:
        eventually(lambda: layer.entered, 10, "the upload of step 10 to begin", 0.02)
        for step in (20, 30, 40, 50, 60):  # all while the layer is busy with step 10
            _save(l1, step)
        layer.gate.set()
        eventually(lambda: shipper.states()["slow"]["step"] == 60, 10, "step 60 shipped", 0.02)
    # Of 20..50, a layer free all along would have shipped each (every checkpoint), 30 and 50
    # (every 20 steps from 10), or none (every 50: 60 is the next after 10).
    assert shipper.states()["slow"]["skipped"] == skipped


def test_pins_of_an_earlier_agent_are_removed_at_the_start(tmp_path: Path) -> None:
    l1 = tmp_path / "l1"
    checkpoint = _save(l1, 10)
    pin_checkpoint(checkpoint)
    assert len(scan(l1).pinned) == 1
    Shipper(l1, [_layer(tmp_path / "remote")])
    found = scan(l1)
    assert found.pinned == ()
    assert [v.step for v in found.valid] == [10]
