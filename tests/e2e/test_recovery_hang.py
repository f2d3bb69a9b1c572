"""One hang is one failure, end to end; a second hang is a second failure.

The reference trainer on a process-backed node is frozen with SIGSTOP. The agent finds it
`Hung`, has its stacks dumped and the trainer killed through the supervisor, which restarts it
in place. The frozen trainer is continued for its dump and steps a few times before the kill
lands; none of that may look like a second failure (a Healthy and then a Hung or Dead again a
few steps on). With the repeated-failure rule on (`sameStepWindow` far wider than what the
test trains, `onRepeatedFailure: Stop`), a second failure recorded for the one hang would stop
the run: the status must show exactly one failure (`Hung`), one restart in place, no
`RepeatedFailureAtStep`, and the trainer training again past the step it hung at. Then the
restarted trainer is frozen too: a hang of its own, within the window of the first, is the
pattern the rule is for: `RepeatedFailureAtStep`, and the run stops.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, condition, get_json
from recovery_helpers import bound_pod, status_of

from trainguard.api.spec import MIN_ADAPTIVE_HANG_SECONDS
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.pods import checkpointed, heartbeat, state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUN = "hang"
EVERY_STEPS = 10
# Wider than all the steps the test trains: any second failure is a repeated one.
WINDOW = 100_000
HANG_AFTER_S = 3
# Past the restart, this long must go by without a second failure: the hang's aftermath (the
# killed trainer's absence, its successor's start-up) is over well before.
SETTLE_S = 15.0


@pytest.mark.parametrize("operator", ["admin"], indirect=True)
def test_one_hang_is_one_failure_and_one_restart_a_second_hang_is_repeated(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    shards = make_shards(tmp_path / "shards")
    run = reference_run(
        RUN,
        shards,
        EVERY_STEPS,
        {
            "monitor": {
                "hangAfterSeconds": HANG_AFTER_S,
                "slowAfterSeconds": 1,
                "startupGraceSeconds": 5,
            },
            "recovery": {
                "sameStepWindow": WINDOW,
                "onRepeatedFailure": "Stop",
                "backoff": {"initialSeconds": 1, "maxSeconds": 1},
            },
        },
    )
    apply(cluster, namespace, run)
    pod = eventually(lambda: bound_pod(cluster, namespace, RUN), what="pod bound")
    state = state_dir(cluster.root, pod)
    eventually(lambda: checkpointed(state, EVERY_STEPS), timeout=120, what="first checkpoint")

    beat = heartbeat(state)
    assert beat is not None and beat.get("step") is not None
    hung_pid = int(beat["pid"])
    os.kill(hung_pid, signal.SIGSTOP)

    def restarted() -> dict[str, Any] | None:
        status = status_of(cluster, namespace, RUN)
        return status if status.get("restarts", 0) >= 1 else None

    first = eventually(restarted, timeout=30, what="the hang recorded")
    assert first["lastFailure"]["cause"] == "Hung", first
    hung_step = first["lastFailure"]["step"]

    def training_again() -> dict[str, Any] | None:
        now = heartbeat(state)
        advanced = (
            now and now["pid"] != hung_pid and (now.get("step") or 0) > hung_step + EVERY_STEPS
        )
        return now if advanced else None

    eventually(training_again, timeout=90, what="training again past the hung step")
    time.sleep(SETTLE_S)

    found = get_json(cluster, "tr", RUN, "-n", namespace)
    status = found["status"]
    assert condition(found, "RepeatedFailureAtStep") is None, status
    assert status["phase"] != "Failed", status
    assert status["restarts"] == 1 and status["inPlaceRestarts"] == 1, status
    assert status["attempt"] == 1, status
    assert status["lastFailure"]["cause"] == "Hung", status
    assert status["lastFailure"]["step"] == hung_step, status
    beat = heartbeat(state)
    assert beat is not None and beat["pid"] != hung_pid and beat["step"] > hung_step, beat

    # A second hang, of the restarted trainer: a failure of its own, repeated within the window.
    os.kill(int(beat["pid"]), signal.SIGSTOP)

    def repeated() -> dict[str, Any] | None:
        found = get_json(cluster, "tr", RUN, "-n", namespace)
        held = condition(found, "RepeatedFailureAtStep")
        return found if held and held["status"] == "True" else None

    stopped = eventually(repeated, timeout=30, what="the second hang: RepeatedFailureAtStep")
    failed = condition(stopped, "Failed")
    assert failed is not None and failed["reason"] == "RepeatedFailureAtStep", stopped["status"]
    last = stopped["status"]["lastFailure"]
    assert last["cause"] == "Hung" and last["step"] > hung_step, stopped["status"]
    assert stopped["status"]["restarts"] == 1, stopped["status"]


ADAPTIVE_RUN = "hang-adaptive"
# The bound a step-time multiple gives a trainer of short steps: the floor.
ADAPTIVE_FLOOR_S = MIN_ADAPTIVE_HANG_SECONDS
# Healthy training must outlast this without a hang recorded (saves, L0 snapshots included).
HEALTHY_S = 20.0


@pytest.mark.parametrize("operator", ["admin"], indirect=True)
def test_a_hang_is_found_after_a_multiple_of_the_slowest_step_not_hang_after_seconds(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    """`hangAfterStepTimes`: a hung trainer of short steps is Hung within seconds.

    A healthy one never is; `hangAfterSeconds` (5 minutes) alone would wait for minutes.
    """
    shards = make_shards(tmp_path / "shards")
    run = reference_run(
        ADAPTIVE_RUN,
        shards,
        EVERY_STEPS,
        {
            "monitor": {"hangAfterSeconds": 300, "hangAfterStepTimes": 10},
            "recovery": {"backoff": {"initialSeconds": 1, "maxSeconds": 1}},
        },
        steps=100_000,
    )
    apply(cluster, namespace, run)
    pod = eventually(lambda: bound_pod(cluster, namespace, ADAPTIVE_RUN), what="pod bound")
    state = state_dir(cluster.root, pod)
    eventually(lambda: checkpointed(state, EVERY_STEPS), timeout=120, what="first checkpoint")

    # Healthy: stepping, checkpointing, never Hung by the short bound.
    time.sleep(HEALTHY_S)
    status = status_of(cluster, namespace, ADAPTIVE_RUN)
    assert status.get("restarts", 0) == 0 and "lastFailure" not in status, status
    beat = heartbeat(state)
    assert beat is not None and beat.get("slowest_step_s") is not None, beat
    assert 10 * beat["slowest_step_s"] < 300, beat

    hung_pid = int(beat["pid"])
    os.kill(hung_pid, signal.SIGSTOP)
    frozen_at = time.monotonic()

    def restarted() -> dict[str, Any] | None:
        status = status_of(cluster, namespace, ADAPTIVE_RUN)
        return status if status.get("restarts", 0) >= 1 else None

    # Well inside hangAfterSeconds: the floor, a look, the Lease and the operator's write.
    first = eventually(restarted, timeout=60, what="the hang recorded by the adaptive bound")
    found_s = time.monotonic() - frozen_at
    failure = first["lastFailure"]
    assert failure["cause"] == "Hung", first
    assert "x the slowest recent step" in failure["message"], failure
    # Timed from the loop's last report, at most a step before the freeze.
    assert ADAPTIVE_FLOOR_S - beat["slowest_step_s"] <= found_s < 60, found_s

    def training_again() -> dict[str, Any] | None:
        now = heartbeat(state)
        return now if now and now["pid"] != hung_pid and now.get("step") else None

    eventually(training_again, timeout=60, what="the restarted trainer training")
