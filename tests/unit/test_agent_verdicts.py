"""The verdict classifier, one row per signal combination that matters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from trainguard.agent.signals import (
    MIB,
    Collector,
    DeviceMemory,
    Heartbeat,
    framework_by_gpu,
    gpu_signals,
    parse_heartbeat,
)
from trainguard.agent.verdicts import (
    DEAD,
    EVIDENCE_CAUSE,
    GHOST_MEMORY,
    HEALTHY,
    HUNG,
    IO_STUCK,
    SLOW,
    UNKNOWN,
    RankSignals,
    Signals,
    Thresholds,
    classify,
)
from trainguard.api.spec import Monitor
from trainguard.gpu import SimulatedProbe, publish, simulated_uuids
from trainguard_dev.testing.polling import eventually

pytestmark = pytest.mark.unit

# What a simulated trainer process holds on each GPU it uses, and its framework's part of it.
SIMULATED_MIB = 2048.0
RESERVED_MIB = 1900.0
T = Thresholds(
    hang_after_s=30,
    slow_after_s=60,
    io_stuck_after_s=20,
    min_tokens_per_s=100,
    ghost_mib=2048,
    ghost_ratio=1.5,
    release_after_death_s=5,
)
ALIVE = Signals(
    trainer_seen=True,
    process_alive=True,
    process_state="R",
    process_count=1,
    step=100,
    seconds_since_step_advanced=1,
    tokens_per_s=1000,
    framework_reserved_mib=10000,
    gpu_used_mib=11000,
    gpu_processes=1,
    log_age_s=1,
)

CASES = [
    ("nothing started", replace(ALIVE, trainer_seen=False, process_alive=False), UNKNOWN),
    ("healthy", ALIVE, HEALTHY),
    (
        "healthy without GPU readings",
        replace(ALIVE, gpu_used_mib=None, gpu_processes=None),
        HEALTHY,
    ),
    (
        "healthy without heartbeat",
        replace(ALIVE, step=None, tokens_per_s=None, framework_reserved_mib=None),
        HEALTHY,
    ),
    (
        "process gone",
        replace(ALIVE, process_alive=False, seconds_since_death=0.5, gpu_used_mib=0),
        DEAD,
    ),
    ("zombie", replace(ALIVE, process_state="Z", seconds_since_death=0.5, gpu_used_mib=0), DEAD),
    (
        "gone, memory still held but within release bound",
        replace(ALIVE, process_alive=False, seconds_since_death=2, gpu_used_mib=9000),
        DEAD,
    ),
    (
        "gone, memory held past the bound",
        replace(
            ALIVE,
            process_alive=False,
            seconds_since_death=6,
            gpu_used_mib=9000,
            seconds_held_since_death=6,
            memory_left_mib=9000,
        ),
        GHOST_MEMORY,
    ),
    (
        "gone, no GPU readings",
        replace(ALIVE, process_alive=False, seconds_since_death=60, gpu_used_mib=None),
        DEAD,
    ),
    (
        "gone, memory released",
        replace(ALIVE, process_alive=False, seconds_since_death=60, gpu_used_mib=100),
        DEAD,
    ),
    ("D state briefly", replace(ALIVE, process_state="D", seconds_in_d_state=5), HEALTHY),
    (
        "D state too long",
        replace(ALIVE, process_state="D", seconds_in_d_state=25, seconds_since_step_advanced=25),
        IO_STUCK,
    ),
    ("duplicate trainer processes", replace(ALIVE, process_count=2), GHOST_MEMORY),
    ("extra process on the GPU", replace(ALIVE, gpu_processes=3), GHOST_MEMORY),
    ("driver >> framework", replace(ALIVE, gpu_used_mib=30000), GHOST_MEMORY),
    ("memory held by no live process", replace(ALIVE, gpu_unattributed_mib=30000), GHOST_MEMORY),
    ("a little unattributed memory", replace(ALIVE, gpu_unattributed_mib=500), HEALTHY),
    ("driver a bit above framework", replace(ALIVE, gpu_used_mib=12000), HEALTHY),
    (
        "memory dropped to ~0 with frozen step",
        replace(ALIVE, gpu_used_mib=100, seconds_since_step_advanced=40),
        DEAD,
    ),
    ("step frozen", replace(ALIVE, seconds_since_step_advanced=31), HUNG),
    (
        "stopped by SIGSTOP, then frozen",
        replace(ALIVE, process_state="T", seconds_since_step_advanced=31),
        HUNG,
    ),
    (
        "stopped by SIGSTOP, not yet frozen",
        replace(ALIVE, process_state="T", seconds_since_step_advanced=3),
        SLOW,
    ),
    (
        "restarted in place, the dead one's memory still held past the bound",
        replace(ALIVE, gpu_unattributed_mib=1500, seconds_held_since_death=5),
        GHOST_MEMORY,
    ),
    (
        "restarted in place, the dead one's memory held within the bound",
        replace(ALIVE, gpu_unattributed_mib=1500, seconds_held_since_death=4),
        HEALTHY,
    ),
    ("below the expected rate", replace(ALIVE, tokens_per_s=50), SLOW),
    ("old log but advancing: slow, never dead", replace(ALIVE, log_age_s=600), SLOW),
]


@pytest.mark.parametrize(("name", "signals", "expected"), CASES, ids=[c[0] for c in CASES])
def test_classify(name: str, signals: Signals, expected: str) -> None:
    verdict = classify(signals, T)
    assert verdict.name == expected, verdict.reason
    assert verdict.reason
    assert "step" in verdict.evidence


def test_log_age_alone_never_yields_dead_or_hung() -> None:
    for age in (0, 59, 60, 3600, 86400):
        verdict = classify(replace(ALIVE, log_age_s=age), T)
        assert verdict.name in (HEALTHY, SLOW)


# A script that does not use the harness: the supervisor names its process, no heartbeat gives
# a step, a rate or the framework's memory.
WITHOUT_HARNESS = replace(
    ALIVE,
    heartbeat=False,
    step=None,
    tokens_per_s=None,
    framework_reserved_mib=None,
    seconds_since_step_advanced=86400,
    log_age_s=86400,
)
WITHOUT_HARNESS_CASES = [
    ("running, a day without a step or a log line", WITHOUT_HARNESS, HEALTHY),
    ("stopped by SIGSTOP: slow, never hung", replace(WITHOUT_HARNESS, process_state="T"), SLOW),
    (
        "process gone",
        replace(WITHOUT_HARNESS, process_alive=False, seconds_since_death=0.5, gpu_used_mib=0),
        DEAD,
    ),
    (
        "D state too long",
        replace(WITHOUT_HARNESS, process_state="D", seconds_in_d_state=25),
        IO_STUCK,
    ),
    ("a second trainer process", replace(WITHOUT_HARNESS, process_count=2), GHOST_MEMORY),
    (
        "memory held by no live process",
        replace(WITHOUT_HARNESS, gpu_unattributed_mib=30000),
        GHOST_MEMORY,
    ),
    (
        "gone, memory held past the bound",
        replace(
            WITHOUT_HARNESS,
            process_alive=False,
            seconds_since_death=6,
            gpu_used_mib=9000,
            seconds_held_since_death=6,
            memory_left_mib=9000,
        ),
        GHOST_MEMORY,
    ),
]


@pytest.mark.parametrize(
    ("name", "signals", "expected"),
    WITHOUT_HARNESS_CASES,
    ids=[c[0] for c in WITHOUT_HARNESS_CASES],
)
def test_a_trainer_without_the_harness_is_judged_by_presence_and_memory(
    name: str, signals: Signals, expected: str
) -> None:
    verdict = classify(signals, T)
    assert verdict.name == expected, verdict.reason
    assert verdict.evidence["heartbeat"] == "none"
    if expected == HEALTHY:
        assert verdict.reason.startswith("alive, running without the harness: no step signal")


def test_a_trainer_without_the_harness_within_the_start_up_grace_is_starting_up() -> None:
    verdict = classify(
        replace(WITHOUT_HARNESS, seconds_since_start=10), replace(T, startup_grace_s=60)
    )
    assert (verdict.name, verdict.reason) == (HEALTHY, "alive, starting up")
    assert verdict.evidence["heartbeat"] == "none"  # no heartbeat yet, or none ever


NOT_RELEASED_CASES = [
    replace(
        ALIVE,
        process_alive=False,
        seconds_since_death=6,
        gpu_used_mib=9000,
        seconds_held_since_death=6,
        memory_left_mib=9000,
    ),
    replace(ALIVE, gpu_unattributed_mib=1500, seconds_held_since_death=5, memory_left_mib=1500),
]


@pytest.mark.parametrize("signals", NOT_RELEASED_CASES)
def test_memory_not_released_after_a_death_names_its_cause(signals: Signals) -> None:
    verdict = classify(signals, T)
    assert verdict.name == GHOST_MEMORY
    assert verdict.evidence[EVIDENCE_CAUSE] == "GPUMemoryNotReleased"
    assert "not released" in verdict.reason
    assert f"{signals.memory_left_mib:.0f} MiB" in verdict.reason


def test_ghost_memory_without_a_death_has_no_narrower_cause() -> None:
    verdict = classify(replace(ALIVE, gpu_unattributed_mib=30000), T)
    assert verdict.name == GHOST_MEMORY
    assert EVIDENCE_CAUSE not in verdict.evidence


class Pod:
    """A trainer process, its heartbeat and the supervisor's simulated GPU readings."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.heartbeat = root / "heartbeat.json"
        self.gpu_file = root / "gpu.json"
        self.sim = root / "gpu-sim.json"
        self.supervisor = root / "supervisor.json"
        self.process: subprocess.Popen[bytes] | None = None
        self.gpus = 1  # the pod's simulated GPUs
        self.ranks = 1  # live trainer processes while the trainer lives: one uses every GPU
        self.collector = Collector(
            heartbeat_file=self.heartbeat,
            gpu_file=self.gpu_file,
            l1_dir=root / "l1",
            log_file=None,
            marker=b"TRAINGUARD_TEST_MARKER=" + str(root).encode(),
            supervisor_file=self.supervisor,
        )

    def start(self, heartbeat: bool = True, devices: list[dict[str, Any]] | None = None) -> None:
        """The supervisor starts a trainer; it writes its first heartbeat (or not yet).

        `devices`: the heartbeat's framework memory per device (none: an older harness's).
        """
        self.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.supervisor.write_text(json.dumps({"state": "running", "child_pid": self.process.pid}))
        if heartbeat:
            beat = {"pid": self.process.pid, "step": 10, "time": time.time(), "phase": "training"}
            if devices is not None:
                beat["memory_by_device"] = devices
            self.heartbeat.write_text(json.dumps(beat))

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def ghost(self, mib: float | dict[str, float]) -> None:
        """Memory no process holds: on the first GPU, or by GPU index (``{"2": 8192}``)."""
        self.sim.write_text(json.dumps({"ghost_mib": mib}))

    def observe(self, now: float) -> Signals:
        alive = self.process is not None and self.process.poll() is None
        live = [SIMULATED_MIB] * self.ranks if alive else []
        probe = SimulatedProbe(self.sim, lambda: live, simulated_uuids(self.gpus))
        publish(probe.read(), self.gpu_file)
        return self.collector.collect(now, time.time())

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    made = Pod(tmp_path)
    yield made
    made.stop()


@pytest.mark.timeout(30)
def test_memory_left_by_a_death_is_timed_across_the_restart(pod: Pod) -> None:
    pod.start()
    assert pod.observe(0.0).seconds_held_since_death is None
    pod.ghost(1500)  # under the ghost threshold: alone, it is no verdict
    assert classify(pod.observe(1.0), T).name == HEALTHY
    pod.kill()
    dead = pod.observe(2.0)
    assert classify(dead, T).name == DEAD
    assert dead.seconds_held_since_death == 0.0
    pod.start()  # the supervisor's restart in place
    restarted = pod.observe(4.0)
    assert restarted.process_alive and restarted.seconds_held_since_death == 2.0
    assert classify(restarted, T).name == HEALTHY
    held = pod.observe(7.5)
    verdict = classify(held, T)
    assert verdict.name == GHOST_MEMORY, verdict.reason
    assert verdict.evidence[EVIDENCE_CAUSE] == "GPUMemoryNotReleased"
    assert verdict.evidence["held_s"] == "5.5"


@pytest.mark.timeout(30)
def test_memory_released_after_a_death_ends_the_watch(pod: Pod) -> None:
    pod.start()
    pod.observe(0.0)
    pod.kill()
    assert pod.observe(1.0).seconds_held_since_death is None  # released at once
    pod.start()
    pod.ghost(1500)  # memory that appears later is no death's leftover
    later = pod.observe(20.0)
    assert later.seconds_held_since_death is None
    assert classify(later, T).name == HEALTHY


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("ghost", "expected"), [(0, DEAD), (1500, GHOST_MEMORY)])
def test_a_restarted_trainer_before_its_first_heartbeat_holds_its_own_memory(
    pod: Pod, ghost: float, expected: str
) -> None:
    pod.start()
    pod.observe(0.0)
    pod.ghost(ghost)
    pod.kill()
    # Restarted in place before the agent looked again, still loading: the memory the new
    # trainer takes is its own, not the dead one's.
    pod.start(heartbeat=False)
    assert pod.observe(1.0).seconds_since_death == 0.0
    later = pod.observe(8.0)
    assert not later.process_alive  # the agent has not seen the new trainer yet
    verdict = classify(later, T)
    assert verdict.name == expected, verdict.reason
    if expected == GHOST_MEMORY:
        assert later.memory_left_mib == 1500


@pytest.mark.timeout(30)
def test_a_supervised_script_without_a_heartbeat_is_watched_by_presence(pod: Pod) -> None:
    pod.start(heartbeat=False)  # a script that never writes the harness heartbeat
    first = pod.observe(0.0)
    assert first.trainer_seen and first.process_alive and not first.heartbeat
    assert pod.process is not None and pod.collector.pid == pod.process.pid
    running = pod.observe(1000.0)  # past the start-up grace and any hang bound
    verdict = classify(running, T)
    assert verdict.name == HEALTHY, verdict.reason
    assert "running without the harness: no step signal" in verdict.reason
    assert running.step is None and running.gpu_used_mib == 2048.0
    pod.kill()
    assert classify(pod.observe(1001.0), T).name == DEAD
    # Restarted in place, and dead and restarted again before the next look: that death is
    # seen at one look, then the supervisor's new process is watched.
    pod.start(heartbeat=False)
    assert classify(pod.observe(1002.0), T).name == HEALTHY
    pod.kill()
    pod.start(heartbeat=False)
    unseen = pod.observe(1003.0)
    assert classify(unseen, T).name == DEAD and unseen.seconds_since_death == 0.0
    again = pod.observe(1004.0)
    assert again.process_alive and pod.collector.pid == pod.process.pid


@pytest.mark.timeout(30)
def test_a_heartbeat_left_by_a_dead_trainer_is_not_the_restarted_ones(pod: Pod) -> None:
    pod.start()  # wrote a heartbeat at step 10, then died
    pod.kill()
    pod.start(heartbeat=False)  # restarted in place; an agent that starts now
    signals = pod.observe(0.0)
    assert signals.process_alive and not signals.heartbeat and signals.step is None
    assert classify(signals, T).name == HEALTHY


LAUNCHER = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(worker.pid, flush=True)
worker.wait()
time.sleep(60)
"""


@pytest.mark.timeout(30)
def test_the_heartbeat_of_a_launchers_worker_names_the_trainer(pod: Pod) -> None:
    # The supervisor runs a launcher; the process that trains, and heartbeats, is its child.
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE)
    pod.process = launcher
    pod.supervisor.write_text(json.dumps({"state": "running", "child_pid": launcher.pid}))
    assert launcher.stdout is not None
    worker = int(launcher.stdout.readline())
    assert pod.observe(0.0).process_alive  # the launcher, watched before any heartbeat
    assert pod.collector.pid == launcher.pid
    beat = {"pid": worker, "step": 10, "time": time.time(), "phase": "training"}
    pod.heartbeat.write_text(json.dumps(beat))
    watched = pod.observe(1.0)
    assert pod.collector.pid == worker and watched.heartbeat and watched.step == 10
    os.kill(worker, signal.SIGKILL)
    eventually(lambda: not Path(f"/proc/{worker}").exists(), 10, "the worker reaped")
    # The worker's death is the trainer's, though the launcher still runs.
    assert launcher.poll() is None
    assert classify(pod.observe(2.0), T).name == DEAD


# Per GPU: a pod on several GPUs is judged GPU by GPU.


def device(index: int, mib: float = RESERVED_MIB, uuid: str | None = None) -> dict[str, Any]:
    """One entry of the heartbeat's framework memory per device."""
    reserved = int(mib * MIB)
    return {"device": index, "uuid": uuid, "allocated_bytes": reserved, "reserved_bytes": reserved}


def rank_beat(rank: int, reserved_mib: float) -> Heartbeat:
    """The heartbeat of rank `rank`, whose framework holds `reserved_mib` on device `rank`."""
    return Heartbeat(
        pid=1000 + rank,
        step=100,
        time=None,
        phase="training",
        tokens_per_s=1000.0,
        reserved_mib=reserved_mib,
        devices=(DeviceMemory(rank, None, reserved_mib),),
    )


def test_a_pod_on_four_gpus_with_a_rank_on_each_is_healthy(tmp_path: Path) -> None:
    ranks = [30000.0] * 4  # each rank holds 30000 MiB on its GPU, 29000 of it its framework's
    snapshot = SimulatedProbe(tmp_path / "idle.json", lambda: ranks, simulated_uuids(4)).read()
    beats = [rank_beat(rank, 29000.0) for rank in range(4)]
    signals = replace(
        ALIVE,
        gpu_used_mib=snapshot.used_mib,
        gpu_processes=snapshot.distinct_processes,
        gpu_unattributed_mib=snapshot.unattributed_mib,
        framework_reserved_mib=29000.0,
        gpus=gpu_signals(snapshot, beats, {}),
    )
    verdict = classify(signals, T)
    assert verdict.name == HEALTHY, verdict.reason
    assert verdict.evidence["gpus"] == "4" and verdict.evidence["gpu_procs"] == "4"
    # The same pod judged by its totals, as one GPU: four processes, and 120000 MiB used
    # against one rank's 29000. Per-GPU readings end this misjudgement.
    as_one = classify(replace(signals, gpus=()), T)
    assert as_one.name == GHOST_MEMORY, as_one.reason


def test_a_gpu_whose_memory_its_rank_does_not_account_for_is_named(tmp_path: Path) -> None:
    ranks = [30000.0] * 4
    snapshot = SimulatedProbe(tmp_path / "idle.json", lambda: ranks, simulated_uuids(4)).read()
    beats = [rank_beat(rank, 1000.0 if rank == 3 else 29000.0) for rank in range(4)]
    verdict = classify(replace(ALIVE, gpus=gpu_signals(snapshot, beats, {})), T)
    assert verdict.name == GHOST_MEMORY
    assert verdict.reason == (
        "driver reports 30000 MiB used on GPU 3, framework holds 1000 MiB: "
        "29000 MiB unaccounted for"
    )
    assert verdict.evidence["gpu"] == "3"


def test_framework_figures_land_on_their_gpu_by_uuid_else_by_index(tmp_path: Path) -> None:
    readings = SimulatedProbe(tmp_path / "idle.json", uuids=simulated_uuids(4)).read().gpus
    # Device 0 of a rank started with CUDA_VISIBLE_DEVICES=2 is the pod's GPU 2 (CUDA names
    # it by the UUID without NVML's "GPU-"); a device whose UUID is not the pod's, by index.
    renumbered = [device(0, 500.0, uuid="simulated-2"), device(1, 700.0, uuid="unknown")]
    beats = [parse_heartbeat({"pid": 1, "memory_by_device": renumbered})]
    assert framework_by_gpu(readings, beats) == [None, 700.0, 500.0, None]
    # Ranks' figures on one device add up.
    two = [parse_heartbeat({"pid": p, "memory_by_device": [device(0, 100.0)]}) for p in (1, 2)]
    assert framework_by_gpu(readings, two) == [200.0, None, None, None]
    # An older harness's one figure (the current device's) is a one-GPU pod's only.
    older = [parse_heartbeat({"pid": 1, "memory_reserved_bytes": 3 * MIB})]
    assert framework_by_gpu(readings, older) == [None] * 4
    assert framework_by_gpu(readings[:1], older) == [3.0]
    assert framework_by_gpu(readings, []) == [None] * 4


def test_malformed_per_device_figures_leave_the_rest_of_the_heartbeat() -> None:
    beat = parse_heartbeat({"pid": 7, "step": 3, "memory_by_device": [{"device": "x"}]})
    assert beat.pid == 7 and beat.step == 3 and beat.devices is None


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "devices",
    [[device(i) for i in range(4)], None],
    ids=["with per-device framework figures", "an older harness: the driver's view alone"],
)
def test_one_process_on_four_gpus_is_healthy(
    pod: Pod, devices: list[dict[str, Any]] | None
) -> None:
    pod.gpus = 4
    pod.start(devices=devices)
    signals = pod.observe(0.0)
    verdict = classify(signals, T)
    assert verdict.name == HEALTHY, verdict.reason
    assert [g.processes for g in signals.gpus] == [1, 1, 1, 1]
    assert signals.gpu_processes == 1  # one process, listed on each of its GPUs
    assert signals.gpu_used_mib == 4 * SIMULATED_MIB
    expected = RESERVED_MIB if devices is not None else None
    assert [g.framework_reserved_mib for g in signals.gpus] == [expected] * 4


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ranks", [1, 4], ids=["one process on all GPUs", "a rank per GPU"])
def test_ghost_memory_on_one_gpu_is_detected_and_named(pod: Pod, ranks: int) -> None:
    pod.gpus, pod.ranks = 4, ranks
    pod.start(devices=[device(0)])
    assert classify(pod.observe(0.0), T).name == HEALTHY
    pod.ghost({"2": 8192})
    verdict = classify(pod.observe(1.0), T)
    assert verdict.name == GHOST_MEMORY
    assert verdict.reason == "driver reports 8192 MiB on GPU 2 held by no live process"
    assert verdict.evidence["gpu"] == "2"
    assert EVIDENCE_CAUSE not in verdict.evidence


@pytest.mark.timeout(30)
def test_memory_a_death_leaves_is_judged_per_gpu(pod: Pod) -> None:
    pod.gpus = 4
    pod.start()
    pod.observe(0.0)
    # Each GPU keeps a context's worth after the death: released on every GPU, though 1200
    # MiB in all is more than the released bound.
    pod.ghost({str(index): 300 for index in range(4)})
    pod.kill()
    dead = pod.observe(1.0)
    assert dead.seconds_held_since_death is None
    assert classify(pod.observe(10.0), T).name == DEAD
    # Another death, and GPU 2 keeps 1500 MiB: not released there, after the restart too.
    pod.start()
    pod.observe(11.0)
    pod.ghost({"2": 1500})
    pod.kill()
    assert pod.observe(12.0).seconds_held_since_death == 0.0
    pod.start()
    held = pod.observe(17.5)
    assert [g.left_mib for g in held.gpus] == [None, None, 1500.0, None]
    verdict = classify(held, T)
    assert verdict.name == GHOST_MEMORY
    assert verdict.evidence[EVIDENCE_CAUSE] == "GPUMemoryNotReleased"
    assert verdict.evidence["gpu"] == "2"
    assert verdict.reason.startswith("1500 MiB still held on GPU 2 6s after the trainer died")


ADAPTIVE = replace(T, hang_after_s=300, hang_after_step_times=10, interval_s=1)
TRAINING = replace(ALIVE, phase="training", slowest_step_s=0.8)


@pytest.mark.parametrize(
    ("signals", "frozen_s", "expected"),
    [
        (TRAINING, 7.9, HEALTHY),  # under 10 x 0.8 s
        (TRAINING, 8.0, HUNG),
        (replace(TRAINING, slowest_step_s=0.1), 2.9, HEALTHY),  # 10 x 0.1 s, but at least 3 s
        (replace(TRAINING, slowest_step_s=0.1), 3.0, HUNG),
        (replace(TRAINING, slowest_step_s=None), 200.0, HEALTHY),  # no step time yet
        (replace(TRAINING, phase="saving"), 200.0, HEALTHY),  # a save: hangAfterSeconds
        (replace(TRAINING, slowest_step_s=60.0), 299.0, HEALTHY),  # never past hangAfterSeconds
        (replace(TRAINING, slowest_step_s=60.0), 300.0, HUNG),
    ],
    ids=["under", "at", "floor-under", "floor-at", "unknown", "saving", "capped", "capped-at"],
)
def test_hang_after_step_times_bounds_a_frozen_step_by_the_slowest_recent_one(
    signals: Signals, frozen_s: float, expected: str
) -> None:
    verdict = classify(replace(signals, seconds_since_step_advanced=frozen_s), ADAPTIVE)
    assert verdict.name == expected, verdict.reason
    # Without the factor, hangAfterSeconds alone.
    plain = classify(replace(signals, seconds_since_step_advanced=frozen_s), T)
    assert plain.name == (HUNG if frozen_s >= T.hang_after_s else HEALTHY)


def test_an_adaptive_hang_says_its_bound_and_where_it_came_from() -> None:
    verdict = classify(replace(TRAINING, seconds_since_step_advanced=9.0), ADAPTIVE)
    assert verdict.reason == (
        "step frozen for 9s (bound 8.0s: 10 x the slowest recent step 0.80s, at least 3s)"
    )
    # A slow agent's looks raise the floor: three looks.
    slow_looks = replace(ADAPTIVE, interval_s=4)
    assert classify(replace(TRAINING, seconds_since_step_advanced=11.0), slow_looks).name == HEALTHY
    assert classify(replace(TRAINING, seconds_since_step_advanced=12.0), slow_looks).name == HUNG


def test_the_adaptive_bound_holds_within_the_start_up_grace_once_steps_are_timed() -> None:
    young = replace(TRAINING, seconds_since_start=60.0, seconds_since_step_advanced=9.0)
    graced = replace(ADAPTIVE, startup_grace_s=900)
    assert classify(young, graced).name == HUNG
    # Before five step times are known the grace holds, as without the factor.
    assert classify(replace(young, slowest_step_s=None), graced).name == HEALTHY
    assert classify(young, replace(graced, hang_after_step_times=None)).name == HEALTHY


def test_a_frozen_rank_is_hung_by_the_adaptive_bound() -> None:
    ranks = (RankSignals(0, 100, True, 50, 9.0), RankSignals(1, 101, True, 50, 1.0))
    signals = replace(TRAINING, ranks=ranks, process_count=2)
    verdict = classify(signals, replace(ADAPTIVE, expected_processes=2))
    assert verdict.name == HUNG and verdict.evidence["rank"] == "0", verdict.reason


def test_the_monitor_field_reaches_the_thresholds() -> None:
    monitor = Monitor.model_validate({"hangAfterStepTimes": 20, "intervalSeconds": 2})
    thresholds = Thresholds.from_monitor(monitor)
    assert (thresholds.hang_after_step_times, thresholds.interval_s) == (20, 2)
    assert Thresholds.from_monitor(Monitor()).hang_after_step_times is None
    with pytest.raises(ValueError, match="greater than or equal to 2"):
        Monitor.model_validate({"hangAfterStepTimes": 1})


def _report(pod: Pod, step: int, seconds_ago: float, phase: str = "training") -> None:
    """The trainer's heartbeat: `step` reported `seconds_ago` on the node's clock."""
    assert pod.process is not None
    beat = {
        "pid": pod.process.pid,
        "step": step,
        "time": time.time() - seconds_ago,
        "phase": phase,
        "slowest_step_s": 0.1,
    }
    pod.heartbeat.write_text(json.dumps(beat))


@pytest.mark.timeout(30)
def test_a_new_step_is_timed_from_the_loops_report_not_from_the_look_that_saw_it(
    pod: Pod,
) -> None:
    pod.start()
    pod.observe(0.0)
    _report(pod, 11, seconds_ago=0.8)  # written a while before this look
    assert pod.observe(5.0).seconds_since_step_advanced == pytest.approx(0.8, abs=0.1)
    frozen = pod.observe(8.0)  # no step since: frozen from the report on, not from the look
    assert frozen.seconds_since_step_advanced == pytest.approx(3.8, abs=0.1)
    verdict = classify(frozen, ADAPTIVE)  # 10 x 0.1 s, at least 3 s
    assert verdict.name == HUNG, verdict.reason
    # A report older than a write interval and a look apart counts as that late, no later
    # (a clock that is off cannot make a healthy step read frozen); one from the future, now.
    _report(pod, 12, seconds_ago=30.0)
    assert pod.observe(9.0).seconds_since_step_advanced == pytest.approx(2.0)
    _report(pod, 13, seconds_ago=-30.0)
    assert pod.observe(10.0).seconds_since_step_advanced == 0.0
    # A restore is progress at every look, whatever its report's time.
    _report(pod, 13, seconds_ago=30.0, phase="loading")
    assert pod.observe(20.0).seconds_since_step_advanced == 0.0
