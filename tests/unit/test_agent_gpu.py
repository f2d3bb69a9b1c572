"""GPU probes: the simulator, the unavailable probe, NVML selection and the published file."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainguard import gpu
from trainguard.agent import verdicts
from trainguard_dev.cluster.gpusim_runtime import add_env, container_gpus, node_env, visible_devices

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


def test_simulated_gpus_are_the_pods_and_one_process_uses_them_all(tmp_path: Path) -> None:
    state = tmp_path / "gpu-sim.json"
    state.write_text(json.dumps({"ghost_mib": {"2": 8192, "7": 100}, "extra_processes": {"3": 1}}))
    probe = gpu.SimulatedProbe(state, lambda: [3000.0], gpu.simulated_uuids(4))
    snap = probe.read()
    assert [g.uuid for g in snap.gpus] == gpu.simulated_uuids(4)
    assert [g.index for g in snap.gpus] == [0, 1, 2, 3]
    # One process, listed on every GPU under one host PID, as NVML lists it.
    assert [[p.pid for p in g.processes if p.used_mib == 3000.0] for g in snap.gpus] == [
        [gpu.SIMULATED_LIVE_PID]
    ] * 4
    assert [g.used_mib for g in snap.gpus] == [3000.0, 3000.0, 3000.0 + 8192, 3000.0 + 1024]
    assert [g.unattributed_mib for g in snap.gpus] == [0.0, 0.0, 8192.0, 0.0]
    assert snap.distinct_processes == 2 and snap.process_count == 5  # index 7: not the pod's


def test_simulated_ranks_run_one_per_gpu(tmp_path: Path) -> None:
    probe = gpu.SimulatedProbe(tmp_path / "none.json", lambda: [1000.0] * 4, gpu.simulated_uuids(4))
    snap = probe.read()
    assert [[p.pid for p in g.processes] for g in snap.gpus] == [
        [gpu.SIMULATED_LIVE_PID + rank] for rank in range(4)
    ]
    assert [g.used_mib for g in snap.gpus] == [1000.0] * 4
    assert snap.unattributed_mib == 0.0


def test_the_old_state_form_keeps_its_meaning(tmp_path: Path) -> None:
    # One figure is the first GPU's; without visible devices, the state file counts the GPUs.
    state = tmp_path / "gpu-sim.json"
    state.write_text(json.dumps({"gpus": 2, "ghost_mib": 5000, "extra_processes": 1}))
    snap = gpu.SimulatedProbe(state).read()
    assert [g.used_mib for g in snap.gpus] == [5000.0 + gpu.SIMULATED_EXTRA_PROCESS_MIB, 0.0]
    assert [len(g.processes) for g in snap.gpus] == [1, 0]


def test_a_container_asking_for_four_gpus_is_simulated_with_four(tmp_path: Path) -> None:
    # As the test nodes' runtimes set up a container: one simulated GPU per GPU requested.
    container = {"resources": {"limits": {"nvidia.com/gpu": "4"}}}
    devices = visible_devices(container_gpus(container))
    environ = {gpu.SIMULATION_ENV: str(tmp_path / "s.json"), gpu.VISIBLE_DEVICES_ENV: devices}
    snap = gpu.default_probe(environ=environ, live_processes=lambda: [10.0]).read()
    assert [g.uuid for g in snap.gpus] == gpu.simulated_uuids(4)
    assert container_gpus({"resources": {}}) == 0


def test_a_real_nodes_environment_is_set_over_the_containers_own(tmp_path: Path) -> None:
    # As a real node's runtime sets up every container of its pods (instance credentials).
    assert node_env(tmp_path / "env.json") == []  # a node without one
    (tmp_path / "env.json").write_text(
        json.dumps({"AWS_ACCESS_KEY_ID": "node", "HF_ENDPOINT": "h"})
    )
    spec = {"process": {"env": ["PATH=/bin", "AWS_ACCESS_KEY_ID=image"]}}
    add_env(spec, node_env(tmp_path / "env.json"))
    assert spec["process"]["env"] == ["PATH=/bin", "AWS_ACCESS_KEY_ID=node", "HF_ENDPOINT=h"]
    (tmp_path / "env.json").write_text(json.dumps({"PORT": 9}))
    with pytest.raises(ValueError, match="not an object of strings"):
        node_env(tmp_path / "env.json")


class FakeNvml(types.ModuleType):
    """pynvml on a host with 3 GPUs: one process uses GPUs 1 and 2, GPU 2 holds 8 GiB more."""

    class NVMLError(Exception):
        """An NVML call that failed."""

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.used = {0: 50 * gpu.MIB, 1: 3000 * gpu.MIB, 2: (3000 + 8192) * gpu.MIB}
        self.processes = {0: [(999, 50)], 1: [(4242, 3000)], 2: [(4242, 3000)]}

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-host-{handle}".encode()

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=self.used[handle], total=143771 * gpu.MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        raise self.NVMLError("not supported")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=mib * gpu.MIB)
            for pid, mib in self.processes[handle]
        ]


def test_nvml_readings_are_per_gpu_of_the_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    snap = gpu.NvmlProbe(["GPU-host-1", "GPU-host-2"]).read()
    assert snap.source == gpu.SOURCE_NVML
    assert [(g.index, g.uuid, g.utilization_pct) for g in snap.gpus] == [
        (1, "GPU-host-1", None),
        (2, "GPU-host-2", None),
    ]
    assert [g.unattributed_mib for g in snap.gpus] == [0.0, 8192.0]
    assert snap.distinct_processes == 1 and snap.process_count == 2


# What NVML reported on an H200 (driver 580) before, during and after a CUDA trainer's life,
# recorded by `python bench/gpu.py` (section readings, nvml_raw) on the real GPU.
RECORDED_NVML = json.loads(
    (Path(__file__).parent / "recorded" / "nvml-h200-trainer-life.json").read_text()
)


class RecordedNvml(types.ModuleType):
    """pynvml replaying one recorded moment of the H200; `with_v2` False: a driver without v2."""

    class NVMLError(Exception):
        """An NVML call that failed."""

    nvmlMemory_v2 = 0x02000028

    def __init__(self, moment: str, *, with_v2: bool) -> None:
        super().__init__("pynvml")
        self.devices = RECORDED_NVML["nvml"][moment]
        self.with_v2 = with_v2
        self.v2_calls = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-recorded-{handle}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(RECORDED_NVML["gpu"])

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> SimpleNamespace:
        if version is None:
            return SimpleNamespace(**self.devices[handle]["v1"])
        self.v2_calls += 1
        if not self.with_v2:
            raise self.NVMLError("Function Not Found")
        return SimpleNamespace(**self.devices[handle]["v2"])

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(**p) for p in self.devices[handle]["processes"]]


def _recorded(monkeypatch: pytest.MonkeyPatch, moment: str, with_v2: bool) -> gpu.GpuReading:
    monkeypatch.setitem(sys.modules, "pynvml", RecordedNvml(moment, with_v2=with_v2))
    (reading,) = gpu.NvmlProbe().read().gpus
    return reading


def test_driver_reserved_memory_is_not_read_as_orphaned(monkeypatch: pytest.MonkeyPatch) -> None:
    released = verdicts.Thresholds().released_mib
    idle = _recorded(monkeypatch, "before_start", with_v2=True)
    live = _recorded(monkeypatch, "live", with_v2=True)
    after = _recorded(monkeypatch, "after_kill", with_v2=True)
    # The driver keeps ~615 MiB for itself on every GPU; the v2 reading reports it apart.
    assert idle.reserved_mib is not None and 600 < idle.reserved_mib < 640
    assert idle.used_mib < 16 and idle.unattributed_mib is not None and idle.unattributed_mib < 16
    # A live trainer's memory is its own: nothing unattributed beyond a few MiB.
    assert live.processes and live.unattributed_mib is not None and live.unattributed_mib < 16
    assert live.used_mib > RECORDED_NVML["framework_reserved_mib"]
    # Its death's memory comes back to what the agent counts as released.
    assert not after.processes and after.used_mib <= released


def test_without_the_v2_reading_the_reservation_stays_in_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    released = verdicts.Thresholds().released_mib
    after = _recorded(monkeypatch, "after_kill", with_v2=False)
    # The v1 figure: ~618 MiB "used" with no process on an idle GPU, above the release bound.
    assert after.reserved_mib is None and not after.processes
    assert after.used_mib > released and after.unattributed_mib == after.used_mib
    # The probe asked once and then keeps to v1 (a driver without v2 never grows one).
    v1_only = RecordedNvml("live", with_v2=False)
    monkeypatch.setitem(sys.modules, "pynvml", v1_only)
    probe = gpu.NvmlProbe()
    probe.read()
    probe.read()
    assert v1_only.v2_calls == 1
