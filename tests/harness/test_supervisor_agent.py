"""A script without the harness under `trainguard supervise`, watched by the real agent.

The script never writes a heartbeat: the agent learns its PID from the supervisor's state
file and judges it by presence and by the GPU readings the supervisor publishes (simulated
here), never by step. The Lease and Events go to a recorder standing in for the API.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainguard.agent.main import Agent
from trainguard.api import constants
from trainguard.contract import env
from trainguard.contract.env import PodEnv
from trainguard.contract.files import read_supervised_child
from trainguard.gpu import SIMULATED_PROCESS_MIB, VISIBLE_DEVICES_ENV, simulated_uuids
from trainguard_dev.testing.agent_api import AgentApiRecorder
from trainguard_dev.testing.polling import eventually

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

PLAIN_SCRIPT = "import time; time.sleep(600)"


class Recorder(AgentApiRecorder):
    """Takes the agent's Lease renewals and Events, and reads the newest evidence."""

    def evidence(self) -> dict[str, Any]:
        evidence: dict[str, Any] = json.loads(self.renewals[-1][constants.ANNOTATION_EVIDENCE])
        return evidence


class Pod:
    """The state volume, L1 and the GPU simulator of one training pod, on local directories."""

    def __init__(self, root: Path) -> None:
        self.state, self.l1, self.sim = root / "state", root / "l1", root / "gpu-sim.json"
        self.state.mkdir()
        self.l1.mkdir()
        self.environ = {env.STATE_DIR: str(self.state), env.L1_DIR: str(self.l1)}
        self.pod = PodEnv.from_env(self.environ)
        self.supervisor: subprocess.Popen[bytes] | None = None

    def supervise(self, *options: str, script: Path | None = None) -> int:
        """Start `trainguard supervise [options] -- python -c PLAIN_SCRIPT`; the script's PID.

        With `script`, `python <script>` instead: a command a warm standby can run.
        """
        environ = {**os.environ, **self.environ, env.GPU_SIMULATION: str(self.sim)}
        program = [str(script)] if script is not None else ["-c", PLAIN_SCRIPT]
        command = [
            sys.executable, "-m", "trainguard.cli.main", "supervise", *options,
            "--", sys.executable, *program,
        ]  # fmt: skip
        self.supervisor = subprocess.Popen(command, env=environ)
        return self.child()

    def child(self, other_than: int | None = None) -> int:
        """The PID of the process the supervisor runs (a new one, with `other_than`)."""

        def running() -> int | None:
            child = read_supervised_child(self.pod.supervisor_file)
            return child if child != other_than else None

        return eventually(running, 20, "the supervisor to run the script", 0.05)

    def agent(self, **monitor: Any) -> tuple[Agent, Recorder]:
        """The pod's agent, its monitor settings as in `spec.monitor`."""
        monitor_env = {env.MONITOR: json.dumps({"startupGraceSeconds": 0, **monitor})}
        recorder = Recorder()
        return Agent({**self.environ, **monitor_env}, recorder), recorder

    def stop(self) -> None:
        if self.supervisor is not None and self.supervisor.poll() is None:
            self.supervisor.send_signal(signal.SIGTERM)  # forwarded to the script
            try:
                self.supervisor.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.supervisor.kill()
                self.supervisor.wait(timeout=10)


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    made = Pod(tmp_path)
    yield made
    made.stop()


def verdict_becomes(loop: Agent, name: str, timeout: float = 10) -> None:
    seen: list[str] = []

    def reached() -> bool:
        seen.append(loop.step().name)
        return seen[-1] == name

    eventually(reached, timeout, f"the verdict {name}", 0.2, detail=lambda: seen)


def healthy_on_the_gpu(loop: Agent, api: Recorder) -> None:
    """Wait until the agent finds the script Healthy in a GPU reading taken while it runs."""

    def seen() -> bool:
        verdict = loop.step().name
        return verdict == "Healthy" and api.evidence()["gpu_used_mib"] != "0.0"

    eventually(seen, 10, "a Healthy verdict with the script's GPU memory", 0.2)


def test_a_plain_script_is_healthy_by_presence_then_dead_when_killed(pod: Pod) -> None:
    script = pod.supervise("--backoff", "1")
    loop, api = pod.agent(hangAfterSeconds=2, slowAfterSeconds=1)
    healthy_on_the_gpu(loop, api)
    assert loop.collector.pid == script
    assert loop.verdict is not None
    assert loop.verdict.reason.startswith("alive, running without the harness: no step signal")
    assert api.renewals[-1][constants.ANNOTATION_STEP] == ""
    evidence = api.evidence()
    assert evidence["heartbeat"] == "none" and evidence["alive"] == "true"
    assert evidence["gpu_used_mib"] == f"{SIMULATED_PROCESS_MIB:.1f}"  # the script's alone
    # Well past the hang bound, with no step ever: still Healthy, never Hung.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert loop.step().name == "Healthy"
        time.sleep(0.2)
    assert not pod.pod.heartbeat.exists()

    os.kill(script, signal.SIGKILL)
    verdict_becomes(loop, "Dead", timeout=5)
    assert api.renewals[-1][constants.ANNOTATION_VERDICT] == "Dead"
    dead_since = api.renewals[-1][constants.ANNOTATION_VERDICT_SINCE]
    assert [e[0] for e in api.events] == ["VerdictDead"]

    # The supervisor restarts it in place: the new process is watched from its start.
    restarted = pod.child(other_than=script)
    verdict_becomes(loop, "Healthy")
    assert loop.collector.pid == restarted
    assert api.renewals[-1][constants.ANNOTATION_VERDICT_SINCE] != dead_since


@pytest.mark.parametrize(("ghost_mib", "expected"), [(0, "Dead"), (1500, "GhostMemory")])
def test_the_memory_a_killed_plain_script_leaves_is_judged(
    pod: Pod, ghost_mib: float, expected: str
) -> None:
    # Memory no process accounts for, under the ghost threshold: no verdict while it runs.
    pod.sim.write_text(json.dumps({"ghost_mib": ghost_mib}))
    script = pod.supervise("--backoff", "60")  # no restart within the test
    loop, api = pod.agent(ghostMemory={"releaseTimeoutSeconds": 2})
    healthy_on_the_gpu(loop, api)
    os.kill(script, signal.SIGKILL)
    verdict_becomes(loop, "Dead", timeout=5)
    # Past the release bound: released memory leaves it Dead, held memory is the node's fault.
    time.sleep(2.5)
    verdict_becomes(loop, expected, timeout=5)
    evidence = api.evidence()
    assert evidence["heartbeat"] == "none"
    if expected == "GhostMemory":
        assert evidence[constants.EVIDENCE_CAUSE] == "GPUMemoryNotReleased"
        assert "1500 MiB still held" in evidence["reason"]
    else:
        assert constants.EVIDENCE_CAUSE not in evidence
        assert evidence["gpu_used_mib"] == "0.0"


def test_a_plain_script_on_four_gpus_is_healthy_and_ghost_memory_on_one_is_named(
    pod: Pod,
) -> None:
    # The container has four GPUs (as a device plugin names them); the one process uses all.
    pod.environ[VISIBLE_DEVICES_ENV] = ",".join(simulated_uuids(4))
    pod.supervise("--backoff", "60")
    loop, api = pod.agent()
    healthy_on_the_gpu(loop, api)
    evidence = api.evidence()
    assert evidence["gpus"] == "4" and evidence["gpu_procs"] == "1"
    assert evidence["gpu_used_mib"] == f"{4 * SIMULATED_PROCESS_MIB:.1f}"
    pod.sim.write_text(json.dumps({"ghost_mib": {"2": 8192}}))
    verdict_becomes(loop, "GhostMemory")
    evidence = api.evidence()
    assert evidence["gpu"] == "2"
    assert evidence["reason"] == "driver reports 8192 MiB on GPU 2 held by no live process"
    assert [e[0] for e in api.events] == ["VerdictGhostMemory"]


class TimedRecorder(Recorder):
    """A recorder that also notes when each verdict was first renewed (monotonic clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.first_renewed: dict[str, float] = {}

    def renew(self, duration: int, annotations: dict[str, str]) -> None:
        super().renew(duration, annotations)
        verdict = annotations[constants.ANNOTATION_VERDICT]
        self.first_renewed.setdefault(verdict, time.monotonic())


def test_a_death_wakes_the_agent_at_once_not_at_its_next_look(pod: Pod) -> None:
    """The supervisor's state file changing cuts the agent's wait short (`agent.wake`).

    The agent looks every 10 s; the script dies 1 s into a wait. The death reaches the Lease
    within a fraction of that interval, then the loop ends (it runs in this test's main thread:
    the loop installs a SIGTERM handler).
    """
    script = pod.supervise("--backoff", "5")
    loop, _ = pod.agent(intervalSeconds=10, leaseDurationSeconds=30)
    api = TimedRecorder()
    loop.client = api
    assert loop.wake.watching
    healthy_on_the_gpu(loop, api)
    killed: list[float] = []

    def kill() -> None:
        killed.append(time.monotonic())
        os.kill(script, signal.SIGKILL)

    timer = threading.Timer(1.0, kill)
    started = time.monotonic()
    timer.start()
    try:
        loop.run(stop_after_s=0.5)  # returns after the first look that follows the wake
    finally:
        timer.cancel()
    ran = time.monotonic() - started
    assert killed, "the loop ended before the script was killed"
    assert "Dead" in api.first_renewed, api.renewals[-1]
    seen_after = api.first_renewed["Dead"] - killed[0]
    # On an idle machine this is milliseconds; the bound leaves room for a loaded one and is
    # far below the 10 s interval the agent would otherwise have slept through.
    assert seen_after < 2.0, seen_after
    assert ran < 5.0, ran


def test_a_trainer_restarted_in_the_standby_is_not_mistaken_for_two_trainers(
    pod: Pod, tmp_path: Path
) -> None:
    """The next standby waits beside the trainer the last one became: one trainer, Healthy.

    The agent counts processes with the trainer's command line as duplicate trainers (a ghost
    seen from the other side); a standby's command line carries its serial, so the waiting one
    is not counted with the one it replaced.
    """
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_SCRIPT)
    first = pod.supervise("--backoff", "0.1", "--standby-delay", "0.2", script=script)
    loop, api = pod.agent(hangAfterSeconds=2, slowAfterSeconds=1)
    healthy_on_the_gpu(loop, api)

    def standby_waiting() -> int | None:
        return next((p for p in _pids_running("trainguard_harness.standby") if p != first), None)

    taken = eventually(standby_waiting, 60, "a standby beside the first trainer", 0.1)
    os.kill(first, signal.SIGKILL)
    assert pod.child(other_than=first) == taken  # the restart took the standby
    eventually(lambda: len(_pids_running("trainguard_harness.standby")) >= 2, 60,
               "the next standby beside the restarted trainer", 0.1)  # fmt: skip
    verdict_becomes(loop, "Healthy")
    for _ in range(5):
        assert loop.step().name == "Healthy", api.evidence()
        assert loop.collector.pid == taken
        time.sleep(0.2)


def _pids_running(needle: str) -> list[int]:
    """The processes whose command line contains `needle`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle.encode() in cmdline:
            found.append(int(entry.name))
    return found
