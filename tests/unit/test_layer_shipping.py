"""The shipper's side of remote layers: progress per layer, bounded concurrency, bandwidth cap."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trainguard.agent.shipper import UPLOADING, VERIFIED, RateLimiter, Shipper
from trainguard.ckpt import CheckpointTransaction, Problem
from trainguard.layers import LayerConfig, Transfer
from trainguard.layers.lineage import CheckpointRef, Lineage, Origin, Pruning
from trainguard_dev.testing.polling import eventually

pytestmark = pytest.mark.unit

MIB = 2**20


class SlowLayer:
    """A layer whose put reports `chunks` MiB through the transfer, one MiB at a time."""

    def __init__(self, name: str, chunks: int = 4) -> None:
        self.config = LayerConfig(name, f"s3://bucket/{name}")
        self.origin = Origin.of("", None)
        self.chunks = chunks
        self.seen: list[dict[str, object]] = []
        self.shipper: Shipper | None = None
        self.stored: list[int] = []

    def checkpoints(self) -> list[CheckpointRef]:
        return [CheckpointRef(step, self.origin) for step in sorted(self.stored)]

    def put(self, checkpoint: Path, transfer: Transfer | None = None) -> CheckpointRef:
        assert transfer is not None
        transfer.begin(self.chunks * MIB)
        transfer.advance(MIB, sent=False)  # one MiB already there (a resumed upload)
        for _ in range(self.chunks - 1):
            transfer.advance(MIB)
            if self.shipper is not None:
                self.seen.append(self.shipper.states()[self.config.name])
        step = int(checkpoint.name.removeprefix("step-"))
        self.stored.append(step)
        return CheckpointRef(step, self.origin)

    def fetch(self, ref: CheckpointRef, dest_root: Path) -> Path:
        raise NotImplementedError

    def verify(self, ref: CheckpointRef) -> list[Problem]:
        return []

    def prune(self, keep: int, lineage: Lineage | None = None) -> Pruning:
        return Pruning([])


class Gauge:
    """How many puts run at once, and the most seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0


class CountedLayer(SlowLayer):
    """A layer whose put holds for a while and counts itself on a shared gauge."""

    def __init__(self, name: str, gauge: Gauge) -> None:
        super().__init__(name)
        self.gauge = gauge

    def put(self, checkpoint: Path, transfer: Transfer | None = None) -> CheckpointRef:
        with self.gauge.lock:
            self.gauge.now += 1
            self.gauge.most = max(self.gauge.most, self.gauge.now)
        time.sleep(0.3)
        shipped = super().put(checkpoint, transfer)
        with self.gauge.lock:
            self.gauge.now -= 1
        return shipped


def _save(l1: Path, step: int) -> None:
    with CheckpointTransaction(l1, step) as txn:
        txn.write_file("model.safetensors", b"m" * 1024)
        txn.commit()


def test_progress_is_in_the_layer_state(tmp_path: Path) -> None:
    layer = SlowLayer("s3")
    shipper = Shipper(tmp_path, [layer])
    layer.shipper = shipper
    _save(tmp_path, 5)
    shipper.ship_once()
    assert [s["state"] for s in layer.seen] == [UPLOADING] * 3
    assert [s["bytes_done"] for s in layer.seen] == [2 * MIB, 3 * MIB, 4 * MIB]
    assert all(s["bytes_total"] == 4 * MIB and s["uploading"] == 5 for s in layer.seen)
    final = shipper.states()["s3"]
    assert (final["state"], final["step"], final["bytes_done"]) == (VERIFIED, 5, 4 * MIB)


def test_layers_upload_concurrently_up_to_the_bound(tmp_path: Path) -> None:
    _save(tmp_path, 1)
    for bound, most in ((2, 2), (1, 1)):
        gauge = Gauge()
        layers = [CountedLayer(name, gauge) for name in ("a", "b", "c")]
        Shipper(tmp_path, list(layers), max_concurrent=bound).ship_once()
        assert gauge.most == most
        assert all(layer.stored == [1] for layer in layers)


def test_bandwidth_cap_holds_across_layers(tmp_path: Path) -> None:
    _save(tmp_path, 1)
    # Two layers send 3 MiB each (a 4th MiB is resumed, not sent): 6 MiB at 4 MiB/s with a
    # one-second burst takes at least half a second more than the burst allows.
    layers = [SlowLayer("a"), SlowLayer("b")]
    shipper = Shipper(tmp_path, list(layers), bandwidth_bytes_per_s=4 * MIB)
    started = time.monotonic()
    shipper.ship_once()
    elapsed = time.monotonic() - started
    assert elapsed >= (6 - 4) / 4 - 0.05
    assert all(s["state"] == VERIFIED for s in shipper.states().values())


def test_rate_limiter_rejects_a_nonsense_cap() -> None:
    with pytest.raises(ValueError):
        RateLimiter(0)


def test_a_stopped_shipper_can_be_joined(tmp_path: Path) -> None:
    # The stop event once shadowed threading.Thread._stop, and join() then raised.
    layer = SlowLayer("s3")
    _save(tmp_path, 1)
    shipper = Shipper(tmp_path, [layer], poll_s=0.05)
    shipper.start()
    eventually(lambda: layer.stored, 5, "a stored checkpoint", 0.01)
    shipper.stop()
    shipper.join(timeout=5)
    assert not shipper.is_alive()
    assert layer.stored == [1]
