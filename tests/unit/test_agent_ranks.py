"""The agent judges a pod of several ranks: per-rank absence, per-rank hangs, per-GPU memory.

The classifier rows use signals as the collector makes them; the collector cases watch real
processes (a stand-in launcher with two rank children, as torchrun starts them) through the
supervisor's state file, the ranks' own heartbeats and the GPU simulator's readings.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from trainguard.agent.signals import Collector
from trainguard.agent.verdicts import (
    DEAD,
    GHOST_MEMORY,
    HEALTHY,
    HUNG,
    RankSignals,
    Signals,
    Thresholds,
    classify,
)
from trainguard.contract import env
from trainguard.contract.env import PodEnv
from trainguard.contract.files import (
    RankFailure,
    read_rank_failure,
    read_rank_pids,
    read_supervised_child,
)
from trainguard.gpu import SIMULATED_PROCESS_MIB, SimulatedProbe, publish, simulated_uuids

pytestmark = pytest.mark.unit

T = Thresholds(hang_after_s=30, startup_grace_s=0, expected_processes=2)
TWO = (RankSignals(0, 100, True, 50, 1.0), RankSignals(1, 101, True, 50, 1.0))
ALIVE = Signals(
    trainer_seen=True,
    process_alive=True,
    process_state="S",
    process_count=2,
    step=50,
    seconds_since_step_advanced=1.0,
    ranks=TWO,
)
MIB = 1024 * 1024


def test_two_live_advancing_ranks_are_healthy() -> None:
    verdict = classify(ALIVE, T)
    assert verdict.name == HEALTHY, verdict.reason
    assert verdict.evidence["ranks"] == "2"


def test_a_dead_rank_is_dead_naming_the_rank_and_its_pid() -> None:
    one_gone = replace(ALIVE, ranks=(TWO[0], replace(TWO[1], alive=False)))
    verdict = classify(one_gone, T)
    assert verdict.name == DEAD
    assert (verdict.evidence["rank"], verdict.evidence["rank_pid"]) == ("1", "101")
    assert "rank 1 (pid 101) absent" in verdict.reason


def test_the_supervisors_record_names_the_first_failure_when_all_ranks_are_gone() -> None:
    failure = RankFailure(rank=1, pid=101, signal="SIGKILL")
    all_gone = replace(
        ALIVE,
        process_alive=False,
        ranks=tuple(replace(r, alive=False) for r in TWO),
        rank_failure=failure,
    )
    verdict = classify(all_gone, T)
    assert verdict.name == DEAD
    assert verdict.evidence["rank"] == "1" and verdict.evidence["rank_pid"] == "101"
    assert verdict.evidence["rank_signal"] == "SIGKILL"
    assert verdict.reason.startswith("rank 1 (pid 101) killed by SIGKILL")
    # A record of an earlier launch (a PID not watched) is not this death's: the ranks seen
    # gone are named instead.
    stale = replace(all_gone, rank_failure=RankFailure(rank=0, pid=7, exit_code=1))
    assert classify(stale, T).evidence["rank"] == "0,1"


def test_a_rank_gone_after_closing_its_session_is_no_death() -> None:
    """At the last step the ranks end one after the other: the first gone closed its session."""
    finished = replace(TWO[1], alive=False, closed=True)
    one_finished = replace(ALIVE, ranks=(TWO[0], finished))
    assert classify(one_finished, T).name == HEALTHY
    # The supervisor saw it gone after the launcher reaped it (no status): still no death.
    seen_gone = replace(one_finished, rank_failure=RankFailure(rank=1, pid=101))
    assert classify(seen_gone, T).name == HEALTHY
    # ... unless it ended badly after closing (a non-zero exit, a signal): that is one.
    for failure in (RankFailure(1, 101, exit_code=1), RankFailure(1, 101, signal="SIGABRT")):
        verdict = classify(replace(one_finished, rank_failure=failure), T)
        assert verdict.name == DEAD and verdict.evidence["rank"] == "1", verdict.reason
    # A rank gone without having closed is a death, whatever the other did.
    other = replace(ALIVE, ranks=(replace(TWO[0], alive=False), finished))
    verdict = classify(other, T)
    assert verdict.name == DEAD and verdict.evidence["rank"] == "0", verdict.reason


@pytest.mark.parametrize(
    ("frozen", "named"),
    [({1: 40.0}, "1"), ({0: 31.0, 1: 45.0}, "0,1")],
    ids=["one-rank", "every-rank"],
)
def test_a_frozen_rank_is_hung_naming_it(frozen: dict[int, float], named: str) -> None:
    ranks = tuple(replace(r, seconds_since_step_advanced=frozen.get(r.rank, 1.0)) for r in TWO)
    verdict = classify(replace(ALIVE, ranks=ranks), T)
    assert verdict.name == HUNG, verdict.reason
    assert verdict.evidence["rank"] == named
    assert f"frozen for {max(frozen.values()):.0f}s" in verdict.reason


def test_a_rank_without_a_step_yet_is_not_hung() -> None:
    starting = replace(TWO[1], step=None, seconds_since_step_advanced=100.0)
    assert classify(replace(ALIVE, ranks=(TWO[0], starting)), T).name == HEALTHY


RANK_SCRIPT = "import time; time.sleep(120)"
LAUNCHER_SCRIPT = f"""
import subprocess, sys, time
ranks = [
    subprocess.Popen([sys.executable, "-c", {RANK_SCRIPT!r}], env={{**__import__("os").environ,
                     "LOCAL_RANK": str(r)}})
    for r in range(2)
]
print(" ".join(str(p.pid) for p in ranks), flush=True)
time.sleep(120)
"""


class RanksPod:
    """A stand-in launcher with two ranks, their heartbeats, the supervisor's file, the GPUs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        state = root / "state"
        state.mkdir()
        self.pod = PodEnv.from_env({env.STATE_DIR: str(state), env.PROCS_PER_NODE: "2"})
        self.sim = root / "gpu-sim.json"
        self.marker = f"TRAINGUARD_TEST_MARKER={root}"
        self.launcher: subprocess.Popen[str] | None = None
        self.ranks: list[int] = []
        self.collector = Collector(
            heartbeat_file=self.pod.heartbeat,
            gpu_file=self.pod.gpu,
            l1_dir=root / "l1",
            log_file=None,
            marker=self.marker.encode(),
            supervisor_file=self.pod.supervisor_file,
            rank_heartbeats=self.pod.rank_heartbeats,
        )

    def start(self) -> None:
        """The supervisor starts the launcher; it starts two ranks; the supervisor learns them."""
        name, value = self.marker.split("=", 1)
        self.launcher = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER_SCRIPT],
            env={**os.environ, name: value},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.launcher.stdout is not None
        self.ranks = [int(pid) for pid in self.launcher.stdout.readline().split()]
        self.supervisor(
            {"state": "running", "child_pid": self.launcher.pid,
             "rank_pids": {str(r): pid for r, pid in enumerate(self.ranks)}}
        )  # fmt: skip

    def supervisor(self, data: dict[str, Any]) -> None:
        self.pod.supervisor_file.write_text(json.dumps(data))

    def beat(self, rank: int, step: int, devices: list[dict[str, Any]] | None = None) -> None:
        """Rank `rank` reports `step` in its heartbeat (rank 0 in `heartbeat.json` too)."""
        record: dict[str, Any] = {
            "pid": self.ranks[rank], "step": step, "time": time.time(), "phase": "training",
            "rank": rank, "local_rank": rank, "memory_by_device": devices,
        }  # fmt: skip
        paths = [self.pod.rank_heartbeat(rank)] + ([self.pod.heartbeat] if rank == 0 else [])
        for path in paths:
            path.write_text(json.dumps(record))

    def observe(self, now: float) -> Signals:
        live = [SIMULATED_PROCESS_MIB] * sum(1 for pid in self.ranks if _alive(pid))
        publish(SimulatedProbe(self.sim, lambda: live, simulated_uuids(2)).read(), self.pod.gpu)
        return self.collector.collect(now, time.time())

    def stop(self) -> None:
        for pid in self.ranks:
            _kill(pid)
        if self.launcher is not None:
            self.launcher.kill()
            self.launcher.wait()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _seen(pid: int, marker: str) -> tuple[int, str | None, bytes | None, bool | None]:
    """What the collector reads of a rank: its PID, state, command line, marker found."""
    proc = Path(f"/proc/{pid}")
    try:
        environ: bool | None = marker.encode() in (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        environ = None
    try:
        cmdline: bytes | None = (proc / "cmdline").read_bytes()
    except OSError:
        cmdline = None
    state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] if proc.exists() else None
    return pid, state, cmdline, environ


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def ranks_pod(tmp_path: Path) -> Iterator[RanksPod]:
    made = RanksPod(tmp_path)
    yield made
    made.stop()


def device(index: int, reserved_mib: float) -> dict[str, Any]:
    return {"device": index, "uuid": f"simulated-{index}", "allocated_bytes": 0,
            "reserved_bytes": int(reserved_mib * MIB)}  # fmt: skip


@pytest.mark.timeout(30)
def test_two_ranks_on_two_simulated_gpus_read_healthy_then_a_killed_rank_reads_dead(
    ranks_pod: RanksPod,
) -> None:
    ranks_pod.start()
    for rank in (0, 1):
        # Each rank's framework holds memory on its own GPU only.
        ranks_pod.beat(rank, 10, [device(rank, 1900.0)])
    first = ranks_pod.observe(0.0)
    assert [r.pid for r in first.ranks] == ranks_pod.ranks
    assert ranks_pod.collector.pid == ranks_pod.ranks[0]  # heartbeat.json: local rank 0
    # Each GPU: one process and its own rank's framework memory.
    assert [g.processes for g in first.gpus] == [1, 1]
    assert [g.framework_reserved_mib for g in first.gpus] == [1900.0, 1900.0]
    # Both ranks counted as trainer processes (a look may miss one of them: fewer than
    # expected is never judged; more would be a duplicate trainer).
    deadline = time.monotonic() + 5.0
    while first.process_count != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
        first = ranks_pod.observe(0.0)
    assert first.process_count == 2, [_seen(pid, ranks_pod.marker) for pid in ranks_pod.ranks]
    verdict = classify(first, T)
    assert verdict.name == HEALTHY, verdict.reason

    for rank in (0, 1):
        ranks_pod.beat(rank, 11, [device(rank, 1900.0)])
    assert classify(ranks_pod.observe(1.0), T).name == HEALTHY

    _kill(ranks_pod.ranks[1])
    time.sleep(0.2)  # reaped by the stand-in launcher's exit or seen as a zombie
    dead = classify(ranks_pod.observe(2.0), T)
    assert dead.name == DEAD, dead.reason
    assert dead.evidence["rank"] == "1"
    assert dead.evidence["rank_pid"] == str(ranks_pod.ranks[1])

    # The supervisor's record, once the launch has ended: the rank and how it died.
    failure = RankFailure(rank=1, pid=ranks_pod.ranks[1], signal="SIGKILL")
    ranks_pod.supervisor(
        {"state": "backoff", "child_pid": None, "rank_pids": {},
         "rank_failure": failure.to_dict()}
    )  # fmt: skip
    assert read_rank_failure(ranks_pod.pod.supervisor_file) == failure
    _kill(ranks_pod.ranks[0])
    time.sleep(0.2)
    recorded = classify(ranks_pod.observe(3.0), T)
    assert recorded.name == DEAD
    assert recorded.evidence["rank_signal"] == "SIGKILL"
    assert recorded.evidence["rank"] == "1"


@pytest.mark.timeout(30)
def test_ranks_gone_at_one_look_wait_for_the_supervisors_record_of_the_first(
    ranks_pod: RanksPod,
) -> None:
    ranks_pod.start()
    for rank in (0, 1):
        ranks_pod.beat(rank, 10)
    assert classify(ranks_pod.observe(0.0), T).name == HEALTHY
    for pid in ranks_pod.ranks:
        _kill(pid)
    time.sleep(0.2)
    failure = RankFailure(rank=1, pid=ranks_pod.ranks[1], signal="SIGKILL")
    # The supervisor writes its record a moment after the launch ended.
    writer = threading.Timer(
        0.3,
        ranks_pod.supervisor,
        [{"state": "backoff", "child_pid": None, "rank_failure": failure.to_dict()}],
    )
    writer.start()
    try:
        dead = classify(ranks_pod.observe(1.0), T)
    finally:
        writer.join()
    assert dead.name == DEAD, dead.reason
    assert (dead.evidence["rank"], dead.evidence["rank_signal"]) == ("1", "SIGKILL")


@pytest.mark.timeout(30)
def test_a_rank_whose_step_stops_while_the_other_advances_reads_hung(
    ranks_pod: RanksPod,
) -> None:
    ranks_pod.start()
    for now in (0.0, 10.0, 20.0, 31.0, 41.0):
        ranks_pod.beat(0, int(now) + 1)
        ranks_pod.beat(1, 1)  # frozen from the first look
        signals = ranks_pod.observe(now)
    verdict = classify(signals, T)
    assert verdict.name == HUNG, verdict.reason
    assert verdict.evidence["rank"] == "1"
    assert verdict.evidence["rank_pid"] == str(ranks_pod.ranks[1])


@pytest.mark.timeout(30)
def test_ghost_memory_on_one_gpu_of_two_ranks_names_that_gpu(ranks_pod: RanksPod) -> None:
    ranks_pod.start()
    ranks_pod.sim.write_text(json.dumps({"ghost_mib": {"1": 8192}}))
    for rank in (0, 1):
        ranks_pod.beat(rank, 10, [device(rank, 1900.0)])
    verdict = classify(ranks_pod.observe(0.0), T)
    assert verdict.name == GHOST_MEMORY, verdict.reason
    assert verdict.evidence["gpu"] == "1"


def test_the_supervisor_files_readers() -> None:
    assert read_supervised_child(Path("/nonexistent")) is None
    assert read_rank_pids(Path("/nonexistent")) == {}
    assert read_rank_failure(Path("/nonexistent")) is None


@pytest.mark.parametrize(
    ("data", "pids", "failure"),
    [
        ({"state": "running", "child_pid": 5, "rank_pids": {"0": 6, "1": 7}}, {0: 6, 1: 7}, None),
        # Not running: no ranks, but the last failure stays readable through the back-off.
        (
            {"state": "backoff", "rank_pids": {"0": 6},
             "rank_failure": {"rank": 1, "pid": 7, "exit_code": None, "signal": "SIGKILL"}},
            {},
            RankFailure(1, 7, None, "SIGKILL"),
        ),
        # Malformed entries are left out, never guessed.
        (
            {"state": "running", "rank_pids": {"x": 6, "1": "7", "2": 8},
             "rank_failure": {"rank": -1}},
            {2: 8},
            None,
        ),
        (
            {"state": "running", "rank_pids": [6, 7],
             "rank_failure": {"rank": 0, "pid": 6, "exit_code": 3, "signal": None}},
            {},
            RankFailure(0, 6, 3, None),
        ),
    ],
)  # fmt: skip
def test_rank_pids_and_failure_are_read_from_the_supervisors_file(
    tmp_path: Path, data: dict[str, Any], pids: dict[int, int], failure: RankFailure | None
) -> None:
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps(data))
    assert read_rank_pids(path) == pids
    assert read_rank_failure(path) == failure
