"""The supervisor publishes GPU readings that follow its training process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard import gpu
from trainguard.ckpt.hashing import XXH3_128, canonical_algorithm, new_hasher
from trainguard_dev.testing.polling import eventually
from trainguard_harness.gpu_publisher import GpuPublisher

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_simulated_readings_follow_the_child_and_keep_ghost_memory(tmp_path: Path) -> None:
    state = tmp_path / "gpu-sim.json"
    state.write_text(json.dumps({"ghost_mib": 0}))
    alive = [True]
    out = tmp_path / "gpu.json"
    publisher = GpuPublisher(out, lambda: alive[0], environ={gpu.SIMULATION_ENV: str(state)})
    publisher.publish_once()
    first = gpu.read_published(out)
    assert first is not None and first.process_count == 1
    assert first.unattributed_mib == 0

    alive[0] = False  # the trainer died
    state.write_text(json.dumps({"ghost_mib": 30000}))  # and its memory stayed behind
    publisher.publish_once()
    after = gpu.read_published(out)
    assert after is not None and after.process_count == 0
    assert after.used_mib == pytest.approx(30000)
    assert after.unattributed_mib == pytest.approx(30000)


def test_supervise_publishes_readings_next_to_the_heartbeat(tmp_path: Path) -> None:
    env = {
        "TRAINGUARD_STATE_DIR": str(tmp_path),
        gpu.SIMULATION_ENV: str(tmp_path / "gpu-sim.json"),
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "supervise", "--", "sleep", "3"], env=env
    )
    try:
        snapshot = eventually(
            lambda: gpu.read_published(tmp_path / "gpu.json"), 20, "published readings", 0.1
        )
        assert snapshot is not None
        assert snapshot.source == gpu.SOURCE_SIMULATED
    finally:
        assert proc.wait(timeout=20) == 0


def test_api_hash_name_is_accepted_and_recorded_canonically() -> None:
    assert canonical_algorithm("xxh3") == XXH3_128
    assert new_hasher("xxh3").hexdigest() == new_hasher(XXH3_128).hexdigest()
