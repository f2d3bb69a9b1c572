"""The agent's loop over real processes: when a verdict starts, and what a hang leads to.

The trainer is a real child process; its heartbeat file is written by the test. The Lease
and Events go to a recorder standing in for the API (what the agent sends is the subject).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainguard.agent.main import Agent
from trainguard.api import constants
from trainguard.contract import env
from trainguard.contract.files import (
    SUPERVISOR_CHILD_PID,
    SUPERVISOR_FILENAME,
    SUPERVISOR_RUNNING,
    SUPERVISOR_STATE,
)
from trainguard_dev.testing.agent_api import AgentApiRecorder
from trainguard_dev.testing.polling import eventually

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def start_trainer(state: Path, step: int, script: str = "import time; time.sleep(60)") -> int:
    """A live process standing for the trainer, and its heartbeat."""
    proc = subprocess.Popen([sys.executable, "-c", script])
    beat = {"pid": proc.pid, "step": step, "time": time.time(), "phase": "training"}
    (state / "heartbeat.json").write_text(json.dumps(beat))
    start_trainer.procs.append(proc)  # type: ignore[attr-defined]
    return proc.pid


start_trainer.procs = []  # type: ignore[attr-defined]


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    for proc in start_trainer.procs:  # type: ignore[attr-defined]
        if proc.pid == pid:
            proc.wait(timeout=10)  # reaped: absent from /proc, as in the pod


def agent(tmp_path: Path, **monitor: Any) -> tuple[Agent, AgentApiRecorder, Path]:
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "l1").mkdir()
    environ = {
        env.STATE_DIR: str(state),
        env.L1_DIR: str(tmp_path / "l1"),
        env.MONITOR: json.dumps({"startupGraceSeconds": 0, **monitor}),
    }
    recorder = AgentApiRecorder()
    return Agent(environ, recorder), recorder, state


def test_a_restarted_trainer_that_dies_unseen_is_a_new_death(tmp_path: Path) -> None:
    loop, api, state = agent(tmp_path)
    first = start_trainer(state, 10)
    assert loop.step().name == "Healthy"
    kill(first)
    assert loop.step().name == "Dead"
    since_first = api.renewals[-1][constants.ANNOTATION_VERDICT_SINCE]
    assert loop.step().name == "Dead"  # the same death, looked at again
    assert api.renewals[-1][constants.ANNOTATION_VERDICT_SINCE] == since_first
    # Restarted and dead again between two looks: never seen alive.
    second = start_trainer(state, 10)
    kill(second)
    assert loop.step().name == "Dead"
    assert api.renewals[-1][constants.ANNOTATION_VERDICT_SINCE] != since_first
    assert [e[0] for e in api.events].count("VerdictDead") == 2


def test_a_hung_trainer_is_dumped_reported_then_killed_and_stays_hung(tmp_path: Path) -> None:
    loop, api, state = agent(tmp_path, hangAfterSeconds=2, slowAfterSeconds=1)
    # The trainer registers the harness's stack dumps, then stops advancing.
    script = (
        "import sys, time; sys.path.insert(0, {!r})\n"
        "from trainguard_harness.stackdump import install_stack_dumps\n"
        "install_stack_dumps({!r})\n"
        "def training_loop():\n    time.sleep(60)\n"
        "training_loop()\n"
    ).format(str(Path(__file__).resolve().parents[2] / "trainer-image"), str(state))
    pid = start_trainer(state, 10, script)
    time.sleep(1.0)  # its handler registered
    verdicts: list[str] = []

    def hung() -> bool:
        verdicts.append(loop.step().name)
        return verdicts[-1] == "Hung"

    eventually(hung, 10, "the verdict Hung", detail=lambda: verdicts)
    assert verdicts[-1] == "Hung", verdicts
    reasons = [e[0] for e in api.events]
    assert reasons[-2:] == ["VerdictHung", "HungTrainerStacks"], reasons
    dump = api.events[-1][1]
    assert "training_loop" in dump and len(dump.encode()) <= 900, dump
    assert api.renewals[-1][constants.ANNOTATION_VERDICT] == "Hung"  # reported before the kill
    for proc in start_trainer.procs:  # type: ignore[attr-defined]
        if proc.pid == pid:
            assert proc.wait(timeout=5) == -signal.SIGKILL
    # The absence the kill caused is the hang's consequence: still Hung, no new failure.
    since = api.renewals[-1][constants.ANNOTATION_VERDICT_SINCE]
    assert loop.step().name == "Hung"
    assert api.renewals[-1][constants.ANNOTATION_VERDICT_SINCE] == since
    assert "VerdictDead" not in [e[0] for e in api.events]


def _supervising(state: Path, child: int, killed: int | None = None) -> None:
    """The supervisor's state file: it runs `child`, and has recorded the kill of `killed`."""
    record: dict[str, Any] = {SUPERVISOR_STATE: SUPERVISOR_RUNNING, SUPERVISOR_CHILD_PID: child}
    if killed is not None:
        record["last_kill"] = {"pid": killed, "killed_at": time.time(), "dumped": False}
    (state / SUPERVISOR_FILENAME).write_text(json.dumps(record))


def _beat(state: Path, pid: int, step: int) -> None:
    beat = {"pid": pid, "step": step, "time": time.time(), "phase": "training"}
    (state / "heartbeat.json").write_text(json.dumps(beat))


def _until_hung(loop: Agent) -> list[str]:
    verdicts: list[str] = []

    def hung() -> bool:
        verdicts.append(loop.step().name)
        return verdicts[-1] == "Hung"

    eventually(hung, 10, "the verdict Hung", detail=lambda: verdicts)
    return verdicts


def test_a_killed_hung_trainer_seen_stepping_before_it_is_gone_stays_one_hang(
    tmp_path: Path,
) -> None:
    # The supervisor continues a SIGSTOPped trainer for its stack dump, and the trainer steps
    # a few times before the SIGKILL the supervisor then records; the kill is asynchronous,
    # so the agent's next look (woken by that record) may find it still there, its step
    # advanced. The supervisor's state file says what it says at that moment: the kill of
    # the trainer recorded, the trainer not gone yet.
    loop, api, state = agent(tmp_path, hangAfterSeconds=2, slowAfterSeconds=1)
    hung = start_trainer(state, 10)
    _supervising(state, hung, killed=hung)
    assert loop.step().name == "Healthy"
    _until_hung(loop)
    since = api.renewals[-1][constants.ANNOTATION_VERDICT_SINCE]
    assert api.renewals[-1][constants.ANNOTATION_VERDICT] == "Hung"
    _beat(state, hung, 13)  # stepped after its continue, not yet gone
    assert loop.step().name == "Hung"
    kill(hung)
    assert loop.step().name == "Hung"
    # One hang, one verdict: no Healthy and no Dead between, the hang's start kept.
    told = [e[0] for e in api.events if e[0].startswith("Verdict")]
    assert told == ["VerdictHung"], told
    assert {r[constants.ANNOTATION_VERDICT_SINCE] for r in api.renewals[-3:]} == {since}

    # Its successor is watched from its first heartbeat: the hang is over, and a hang of the
    # successor is a hang of its own.
    successor = start_trainer(state, 11)
    _supervising(state, successor, killed=hung)
    assert loop.step().name == "Healthy"
    _until_hung(loop)
    assert api.renewals[-1][constants.ANNOTATION_VERDICT_SINCE] != since
    told = [e[0] for e in api.events if e[0].startswith("Verdict")]
    assert told == ["VerdictHung", "VerdictHung"], told


DEEP_WORKER = """
import os, signal, sys, threading, time
from trainguard_harness.stackdump import install_stack_dumps

def busy_saver():
    # Deep frames, as a checkpoint persist in flight has: they fill an Event on their own.
    def level(n):
        if n == 0:
            while True:
                time.sleep(0.01)
        level(n - 1)
    level(40)

def training_loop():
    open(sys.argv[2], "w").close()
    while True:
        time.sleep(0.01)

install_stack_dumps(sys.argv[1])
threading.Thread(target=busy_saver, daemon=True).start()
# The dump signal lands on the saver: the main thread blocks it, as a thread in C code can.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
training_loop()
"""


def test_the_main_threads_frames_lead_the_event_whichever_thread_took_the_dump_signal(
    tmp_path: Path,
) -> None:
    from trainguard.agent.main import shorten_dump

    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", DEEP_WORKER, str(tmp_path), str(ready)])
    try:
        eventually(ready.exists, 20, "the trainer in its loop")
        os.kill(proc.pid, signal.SIGUSR1)
        dump_file = env.PodEnv(state_dir=tmp_path).stacks_file(proc.pid)
        eventually(lambda: "training_loop" in dump_file.read_text(), 10, "the dump")
    finally:
        proc.kill()
        proc.wait(timeout=10)
    dump = dump_file.read_text()
    # The real dump: the saver took the signal and is "Current thread", first in the file.
    assert dump.startswith("Current thread") and "busy_saver" in dump.split("\n\n")[0], dump
    event = shorten_dump(dump)
    assert len(event.encode()) <= 900 and event.endswith("(truncated) ...\n"), event
    first = event.split("\n\n")[0]
    assert "training_loop" in first and "in <module>" in first, event
