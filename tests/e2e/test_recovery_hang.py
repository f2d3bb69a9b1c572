"""Hang, end to end: a stopped trainer is found Hung, its stacks are dumped, it is restarted.

The training process is SIGSTOPped mid-run on a process-backed node. It stays alive, so
absence says nothing; its step freezes. After `hangAfterSeconds` the agent classifies Hung,
asks the trainer for its stacks through the harness's faulthandler handler (SIGUSR1, no
ptrace), reports the verdict and a truncated stack-dump Event, and only then kills it; the
operator records Hung and a restart in place; the supervisor starts the trainer again in
the same pod after the run's back-off, and training goes on from the newest L1 checkpoint.

The bound on detection follows from the monitor settings: the step froze at most one step
before the stop, the agent looks every `intervalSeconds`, the dump waits for the handler
(well under `STACK_WAIT_S`) and the Lease change starts an operator cycle at once. So
Hung reaches the status within hangAfter + 2 x interval + STACK_WAIT_S of the stop, plus
a few seconds for the operator and kubectl on a loaded machine; never before hangAfter
minus one interval (it must be the hang rule that fired, not something else).
"""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, events_of, pods_of
from recovery_helpers import bound_pod, status_of

from trainguard.agent.main import STACK_EVENT_BYTES
from trainguard.agent.stopping import STACK_WAIT_S
from trainguard.contract.files import read_json
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.pods import checkpointed, heartbeat, state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

EVERY_STEPS = 20
INTERVAL_S = 1
HANG_AFTER_S = 5
# Operator cycle, status write and the test's own kubectl calls on a machine under load.
SLACK_S = 4.0
DETECT_BOUND_S = HANG_AFTER_S + 2 * INTERVAL_S + STACK_WAIT_S + SLACK_S


@pytest.mark.parametrize("operator", ["chart-rbac"], indirect=True)
def test_a_stopped_trainer_is_hung_dumped_killed_and_restarted_in_place(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    shards = make_shards(tmp_path / "shards")
    run = reference_run(
        "hang",
        shards,
        EVERY_STEPS,
        {
            "monitor": {
                "intervalSeconds": INTERVAL_S,
                "hangAfterSeconds": HANG_AFTER_S,
                "slowAfterSeconds": 3,
                "startupGraceSeconds": 5,
            },
            "recovery": {"backoff": {"initialSeconds": 1, "maxSeconds": 1}},
        },
    )
    apply(cluster, namespace, run)
    pod = eventually(lambda: bound_pod(cluster, namespace, "hang"), what="pod bound to a node")
    state = state_dir(cluster.root, pod)
    eventually(lambda: checkpointed(state, EVERY_STEPS), timeout=120, what="a checkpoint")
    eventually(
        lambda: status_of(cluster, namespace, "hang").get("verdict") == "Healthy",
        what="Healthy in the status",
    )
    before = heartbeat(state)
    assert before is not None
    pid = int(before["pid"])
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)

    def hung() -> dict[str, Any] | None:
        # The verdict and its record are one status write: a recorded Hung was the verdict.
        status = status_of(cluster, namespace, "hang")
        last = status.get("lastFailure") or {}
        return status if last.get("cause") == "Hung" or status.get("verdict") == "Hung" else None

    status = eventually(hung, timeout=DETECT_BOUND_S + 20, what="Hung in the run's status")
    detect_s = time.monotonic() - stopped_at
    assert HANG_AFTER_S - INTERVAL_S <= detect_s <= DETECT_BOUND_S, detect_s
    assert status["restarts"] >= 1

    # The stack dump: made by the trainer's own faulthandler handler, in its stacks file...
    dump = (state / f"stacks-{pid}.txt").read_text(errors="replace")
    assert "most recent call first" in dump and "trainguard_harness" in dump, dump[:2000]

    def stack_events() -> list[dict[str, Any]]:
        found = events_of(cluster, namespace, "hang")
        return [e for e in found if e["reason"] == "HungTrainerStacks"]

    events = eventually(stack_events, timeout=15, what="the stack-dump Event")
    message = events[0]["message"]
    # ... truncated to fit an Event, holding a Python frame of the trainer.
    assert len(message.encode()) <= STACK_EVENT_BYTES
    assert 'File "' in message and "trainguard_harness" in message, message
    # The training loop's thread comes first, down to the trainer's own frames.
    main_thread = message.split("\n\n")[0]
    assert "trainguard_harness/train" in main_thread, message
    frames = re.findall(r'"(, line \d+ in \w+)', message)
    assert frames and all(frame in dump for frame in frames), (frames, dump)
    # Paths are shortened in the Event, so a dump larger than an Event may still fit whole:
    # either it says it was cut, or it holds every frame of the dump.
    if not message.rstrip().endswith("(truncated) ..."):
        assert sorted(frames) == sorted(re.findall(r'"(, line \d+ in \w+)', dump)), message

    # Killed after the dump, then restarted in place by the supervisor: same pod, new process.
    def restarted() -> dict[str, Any] | None:
        beat = heartbeat(state)
        moved = beat and beat["pid"] != pid and (beat.get("step") or 0) > before["step"]
        return beat if moved else None

    after = eventually(restarted, timeout=90, what="training again after the restart")
    supervisor = read_json(state / "supervisor.json")
    assert supervisor is not None
    ended = next(h for h in supervisor["history"] if h["pid"] == pid)
    assert ended["signal"] == "SIGKILL", ended
    event_at = datetime.fromisoformat(
        (events[0].get("firstTimestamp") or events[0]["eventTime"]).replace("Z", "+00:00")
    )
    assert event_at.timestamp() <= ended["ended_at"] + 1.0  # the Event's time is in seconds
    agent_log = (state.parent.parent / "agent.log").read_text(errors="replace")
    # Killed by the supervisor (the agent asks it: on a real node they are different users).
    assert agent_log.index(f"stacks of hung trainer pid {pid}") < agent_log.index(
        f"hung trainer pid {pid} killed by the supervisor"
    )
    assert supervisor["last_kill"]["pid"] == pid and supervisor["last_kill"]["dumped"], supervisor
    assert [p["metadata"]["name"] for p in pods_of(cluster, namespace, "hang")] == ["hang-1"]
    assert after["step"] > before["step"]
    final = status_of(cluster, namespace, "hang")
    assert final["lastFailure"]["cause"] == "Hung"
    assert final["restarts"] == 1, final  # the kill's absence is not a second failure
    reasons = {e["reason"] for e in events_of(cluster, namespace, "hang")}
    assert {"Hung", "VerdictHung", "HungTrainerStacks"} <= reasons, reasons
