"""GPU memory as the driver sees it, behind one `GpuProbe` interface.

Implementations:
- `NvmlProbe` (the production default): NVML through pynvml — per GPU, device memory used
  and total, utilisation, and the compute processes with the memory each holds. It looks only
  at the pod's own GPUs, selected by the UUIDs the device plugin puts in
  ``NVIDIA_VISIBLE_DEVICES``.
- `SimulatedProbe`: for CPU-only tests and the demo, named as a simulator everywhere it is
  used. It simulates the pod's GPUs (those ``NVIDIA_VISIBLE_DEVICES`` names), reads a
  per-node state file (injected ghost MiB and extra processes, per GPU index) and accounts
  for the live trainer processes it is told about. It is chosen only when
  ``TRAINGUARD_GPU_SIMULATION`` names that file, which only the local test nodes' runtimes
  set; it is never a production default.
- `UnavailableProbe`: no GPU and no simulation configured: readings say "unavailable" and
  carry the reason; nothing is invented.

Limits (documented because they shape the verdicts): NVML reports *host* PIDs, which differ
from the pod's PID namespace, so the agent never matches PIDs; it reasons from memory totals,
the framework's own figures and process counts. Host PIDs are compared only with each other
(a process that uses several GPUs is listed on each). Memory held after the whole pod is gone
is visible only to a node-level probe or to the next pod's preflight.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainguard.contract import env

SIMULATION_ENV = env.GPU_SIMULATION
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
MIB = 1024 * 1024

SOURCE_NVML = "nvml"
SOURCE_SIMULATED = "simulated"
SOURCE_UNAVAILABLE = "unavailable"

# What one simulated trainer process holds (on each GPU it uses).
SIMULATED_PROCESS_MIB = 2048.0
SIMULATED_TOTAL_MIB = 143771.0
SIMULATED_EXTRA_PROCESS_MIB = 1024.0
# The simulated GPUs' UUIDs: the prefix and the GPU's index (the test nodes' runtimes name a
# container's GPUs so in NVIDIA_VISIBLE_DEVICES, one per GPU it requests).
SIMULATED_UUID_PREFIX = "GPU-simulated-"
# Host PIDs of the simulated processes: live trainer processes, then foreign ones.
SIMULATED_LIVE_PID = 100000
SIMULATED_FOREIGN_PID = 200000


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU (host PID: never compare with pod PIDs).

    `used_mib` is None where the driver cannot attribute memory per process.
    """

    pid: int
    used_mib: float | None


@dataclass(frozen=True)
class GpuReading:
    """One GPU's memory as the driver reports it."""

    uuid: str
    index: int
    name: str
    used_mib: float
    total_mib: float
    utilization_pct: float | None
    processes: tuple[GpuProcess, ...] = ()
    # Memory the driver keeps for itself (NVML's v2 memory reading), left out of `used_mib`:
    # no process holds it and it never comes back, so counting it would read as orphaned
    # memory on every GPU (618 MiB on an idle H200 with driver 580). None: the driver gives
    # no such split, and `used_mib` includes whatever it reserves.
    reserved_mib: float | None = None

    @property
    def unattributed_mib(self) -> float | None:
        """Memory in use on this GPU that none of its processes accounts for (None: unknown)."""
        if any(p.used_mib is None for p in self.processes):
            return None
        return max(0.0, self.used_mib - sum(p.used_mib or 0.0 for p in self.processes))


@dataclass(frozen=True)
class GpuSnapshot:
    """All of the pod's GPUs at one moment, or why they could not be read."""

    source: str
    time: float
    gpus: tuple[GpuReading, ...] = ()
    error: str | None = None

    @property
    def available(self) -> bool:
        """True when the readings are real (or explicitly simulated) figures."""
        return self.source != SOURCE_UNAVAILABLE

    @property
    def used_mib(self) -> float:
        """Memory used on all the pod's GPUs."""
        return sum(g.used_mib for g in self.gpus)

    @property
    def total_mib(self) -> float:
        """Memory of all the pod's GPUs."""
        return sum(g.total_mib for g in self.gpus)

    @property
    def unattributed_mib(self) -> float | None:
        """Memory in use that no live process accounts for, on all GPUs (None: a figure missing).

        This is ghost memory as the driver shows it: in one incident 141 of 143 GB were in
        use with no process visible.
        """
        per_gpu = [g.unattributed_mib for g in self.gpus]
        if any(mib is None for mib in per_gpu):
            return None
        return sum(mib or 0.0 for mib in per_gpu)

    @property
    def process_count(self) -> int:
        """Compute processes on the pod's GPUs, counted on each GPU they use."""
        return sum(len(g.processes) for g in self.gpus)

    @property
    def distinct_processes(self) -> int:
        """Compute processes on the pod's GPUs, each counted once however many GPUs it uses."""
        return len({p.pid for g in self.gpus for p in g.processes})

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the format published on the shared state volume)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuSnapshot:
        """Parse what `to_json` wrote."""
        gpus = tuple(
            GpuReading(
                uuid=str(g["uuid"]),
                index=int(g["index"]),
                name=str(g["name"]),
                used_mib=float(g["used_mib"]),
                total_mib=float(g["total_mib"]),
                utilization_pct=None
                if g.get("utilization_pct") is None
                else float(g["utilization_pct"]),
                processes=tuple(
                    GpuProcess(
                        int(p["pid"]), None if p["used_mib"] is None else float(p["used_mib"])
                    )
                    for p in g["processes"]
                ),
                reserved_mib=None if g.get("reserved_mib") is None else float(g["reserved_mib"]),
            )
            for g in data.get("gpus", [])
        )
        return cls(str(data["source"]), float(data["time"]), gpus, data.get("error"))


class GpuProbe(Protocol):
    """Reads the pod's GPUs."""

    def read(self) -> GpuSnapshot:
        """Take one reading; never raises (a failure is an unavailable snapshot)."""
        ...


@dataclass
class UnavailableProbe:
    """No GPU to read: every snapshot says so, with the reason."""

    reason: str

    def read(self) -> GpuSnapshot:
        """Report the GPU as unavailable."""
        return GpuSnapshot(SOURCE_UNAVAILABLE, time.time(), error=self.reason)


def visible_uuids(value: str | None) -> list[str] | None:
    """GPU UUIDs from NVIDIA_VISIBLE_DEVICES; None means "every GPU NVML shows"."""
    if not value or value in ("all", "void", "none"):
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    uuids = [v for v in items if v.startswith(("GPU-", "MIG-"))]
    return uuids or None


class NvmlProbe:
    """GPU readings from the NVIDIA driver through pynvml."""

    def __init__(self, uuids: Sequence[str] | None = None) -> None:
        import pynvml

        self._nvml = pynvml
        self._memory_v2: bool | None = None  # whether the driver has NVML's v2 memory reading
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        wanted = set(uuids) if uuids else None
        self._devices: list[tuple[int, Any, str]] = []
        for index, handle in enumerate(handles):
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            if wanted is None or uuid in wanted:
                self._devices.append((index, handle, uuid))

    def read(self) -> GpuSnapshot:
        """Read memory, utilisation and compute processes of the pod's GPUs."""
        nvml = self._nvml
        try:
            gpus = []
            for index, handle, uuid in self._devices:
                used, total, reserved = self._memory(handle)
                try:
                    utilization: float | None = float(
                        nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                    )
                except nvml.NVMLError:
                    utilization = None
                processes = tuple(
                    GpuProcess(
                        int(p.pid), None if p.usedGpuMemory is None else p.usedGpuMemory / MIB
                    )
                    for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                )
                gpus.append(
                    GpuReading(
                        uuid=uuid,
                        index=index,
                        name=_text(nvml.nvmlDeviceGetName(handle)),
                        used_mib=used / MIB,
                        total_mib=total / MIB,
                        utilization_pct=utilization,
                        processes=processes,
                        reserved_mib=None if reserved is None else reserved / MIB,
                    )
                )
            return GpuSnapshot(SOURCE_NVML, time.time(), tuple(gpus))
        except nvml.NVMLError as err:
            return GpuSnapshot(SOURCE_UNAVAILABLE, time.time(), error=f"NVML: {err}")

    def _memory(self, handle: Any) -> tuple[int, int, int | None]:
        """(used, total, driver-reserved or None) bytes: NVML's v2 reading where it has one.

        The v1 reading counts the driver's own reservation as used; v2 reports it apart. A
        driver or pynvml without v2 gives v1, and the reservation stays inside `used`.
        """
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None and self._memory_v2 is not False:
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except nvml.NVMLError:
                self._memory_v2 = False  # this driver has no v2: ask for v1 from now on
            else:
                self._memory_v2 = True
                return int(memory.used), int(memory.total), int(memory.reserved)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(memory.used), int(memory.total), None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class SimulatedProbe:
    """A GPU simulator for CPU-only tests and the demo (never a production default).

    The pod's GPUs are those `uuids` names (``NVIDIA_VISIBLE_DEVICES``, which the test nodes'
    runtimes set to one `simulated_uuids` entry per GPU a container requests), else as many
    as the state file's ``gpus`` says (1 by default). The state file (JSON, all keys
    optional) describes the node's GPUs: ``{"gpus": 1, "total_mib": 143771, "ghost_mib": 0,
    "extra_processes": 0, "extra_process_mib": 1024}``. ``ghost_mib`` (memory no process
    accounts for) and ``extra_processes`` (foreign processes) are either one figure, on the
    first GPU, or figures per GPU index: ``{"ghost_mib": {"2": 8192}}``; an index the pod does
    not have is another pod's GPU.

    `live_processes` returns one figure in MiB per live trainer process, placed as a training
    job places its processes: one process uses every GPU (and holds that figure on each, under
    one host PID, as NVML lists it); several are ranks, process i on GPU i mod the GPU count.
    A GPU's used memory is its processes' memory plus its ghost memory.
    """

    state_file: Path
    live_processes: Callable[[], list[float]] = field(default=lambda: [])
    uuids: Sequence[str] | None = None

    def read(self) -> GpuSnapshot:
        """Simulate one reading from the node's state file and the live processes."""
        try:
            state = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}
            uuids = list(self.uuids or simulated_uuids(max(1, int(state.get("gpus", 1)))))
            ghost = _per_gpu(state.get("ghost_mib", 0.0), len(uuids))
            extra = _per_gpu(state.get("extra_processes", 0), len(uuids))
            extra_mib = float(state.get("extra_process_mib", SIMULATED_EXTRA_PROCESS_MIB))
            total = float(state.get("total_mib", SIMULATED_TOTAL_MIB))
        except (OSError, ValueError, TypeError, AttributeError) as err:
            return GpuSnapshot(SOURCE_UNAVAILABLE, time.time(), error=f"simulation: {err}")
        processes = _place(self.live_processes(), len(uuids))
        foreign = SIMULATED_FOREIGN_PID
        for index, count in enumerate(extra):
            processes[index] += [GpuProcess(foreign + k, extra_mib) for k in range(int(count))]
            foreign += int(count)
        gpus = [
            GpuReading(
                uuid=uuid,
                index=index,
                name="Simulated H200",
                used_mib=sum(p.used_mib or 0.0 for p in processes[index]) + ghost[index],
                total_mib=total,
                utilization_pct=90.0 if processes[index] else 0.0,
                processes=tuple(processes[index]),
            )
            for index, uuid in enumerate(uuids)
        ]
        return GpuSnapshot(SOURCE_SIMULATED, time.time(), tuple(gpus))


def simulated_uuids(count: int) -> list[str]:
    """The UUIDs of `count` simulated GPUs, by index."""
    return [f"{SIMULATED_UUID_PREFIX}{index}" for index in range(count)]


def _per_gpu(value: Any, count: int) -> list[float]:
    """A state-file figure per GPU: one figure is the first GPU's, a mapping is by index."""
    figures = [0.0] * count
    if isinstance(value, dict):
        for index, figure in value.items():
            if 0 <= int(index) < count:
                figures[int(index)] = float(figure)
    else:
        figures[0] = float(value)
    return figures


def _place(live: list[float], count: int) -> list[list[GpuProcess]]:
    """The live trainer processes on each GPU: one process on all, else rank i on GPU i mod N."""
    placed: list[list[GpuProcess]] = [[] for _ in range(count)]
    for rank, mib in enumerate(live):
        pid = SIMULATED_LIVE_PID + rank
        for index in range(count) if len(live) == 1 else [rank % count]:
            placed[index].append(GpuProcess(pid, mib))
    return placed


def default_probe(
    environ: dict[str, str] | None = None,
    live_processes: Callable[[], list[float]] | None = None,
) -> GpuProbe:
    """The probe for this container: simulated only when configured, else NVML, else none."""
    variables = dict(os.environ if environ is None else environ)
    simulation = variables.get(SIMULATION_ENV)
    if simulation:
        return SimulatedProbe(
            Path(simulation),
            live_processes or (lambda: []),
            visible_uuids(variables.get(VISIBLE_DEVICES_ENV)),
        )
    try:
        return NvmlProbe(visible_uuids(variables.get(VISIBLE_DEVICES_ENV)))
    except Exception as err:  # any NVML or loader failure means "no GPU here"
        return UnavailableProbe(f"NVML not usable: {err}")


def publish(snapshot: GpuSnapshot, path: Path) -> None:
    """Atomically replace the readings file on the shared state volume."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(snapshot.to_json()))
    os.replace(tmp, path)


def read_published(path: Path) -> GpuSnapshot | None:
    """The last published readings, or None when there are none (yet)."""
    try:
        return GpuSnapshot.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
