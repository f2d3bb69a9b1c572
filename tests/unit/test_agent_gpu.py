"""GPU probes: the simulator, the unavailable probe, NVML selection and the published file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard import gpu

pytestmark = pytest.mark.unit


def test_simulated_probe_accounts_for_live_processes_and_ghost(tmp_path: Path) -> None:
    state = tmp_path / "gpu-sim.json"
    state.write_text(
        json.dumps({"ghost_mib": 5000, "extra_processes": 1, "extra_process_mib": 700})
    )
    probe = gpu.SimulatedProbe(state, live_processes=lambda: [3000.0])
    snap = probe.read()
    assert snap.source == gpu.SOURCE_SIMULATED
    assert snap.used_mib == pytest.approx(3000 + 5000 + 700)
    assert snap.process_count == 2
    assert snap.unattributed_mib == pytest.approx(5000)
    assert snap.total_mib == pytest.approx(gpu.SIMULATED_TOTAL_MIB)


def test_simulated_probe_without_state_file_is_an_idle_gpu(tmp_path: Path) -> None:
    snap = gpu.SimulatedProbe(tmp_path / "missing.json").read()
    assert snap.available
    assert snap.used_mib == 0
    assert snap.process_count == 0


def test_simulated_probe_with_bad_state_is_unavailable_not_invented(tmp_path: Path) -> None:
    state = tmp_path / "gpu-sim.json"
    state.write_text("{not json")
    snap = gpu.SimulatedProbe(state).read()
    assert not snap.available
    assert snap.error


def test_default_probe_without_gpu_or_simulation_reports_unavailable() -> None:
    # These machines have no NVIDIA driver: NVML cannot initialise.
    probe = gpu.default_probe(environ={})
    snap = probe.read()
    assert snap.source == gpu.SOURCE_UNAVAILABLE
    assert "NVML" in (snap.error or "")
    assert snap.gpus == ()


def test_default_probe_uses_the_simulation_only_when_configured(tmp_path: Path) -> None:
    probe = gpu.default_probe(environ={gpu.SIMULATION_ENV: str(tmp_path / "s.json")})
    assert isinstance(probe, gpu.SimulatedProbe)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("all", None),
        ("0,1", None),
        ("GPU-aaa,GPU-bbb", ["GPU-aaa", "GPU-bbb"]),
        ("MIG-x", ["MIG-x"]),
    ],
)
def test_visible_uuids(value: str | None, expected: list[str] | None) -> None:
    assert gpu.visible_uuids(value) == expected


def test_published_snapshot_round_trips(tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    state.write_text(json.dumps({"ghost_mib": 1}))
    snap = gpu.SimulatedProbe(state, live_processes=lambda: [10.0]).read()
    path = tmp_path / "gpu.json"
    gpu.publish(snap, path)
    assert gpu.read_published(path) == snap
    assert gpu.read_published(tmp_path / "none.json") is None
