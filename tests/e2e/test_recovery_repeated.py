"""Repeated failure at the same step, end to end: the condition, then stop or continue.

Two runs side by side on the process-backed nodes, identical but for
`recovery.onRepeatedFailure`. Each trainer is SIGKILLed, restarted in place from its newest
L1 checkpoint, and SIGKILLed again right after it resumed: the second death is within
`recovery.sameStepWindow` steps of the first (the window is wider than the checkpoint
interval, so resuming from the checkpoint before the first death is always inside it).
"twice in the same place is a pattern": both runs get the condition RepeatedFailureAtStep;
with Stop the run is Failed (phase Failed, reason RepeatedFailureAtStep, its pod deleted);
with Continue it is restarted in place again and trains on.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, condition, get_json, pods_of
from recovery_helpers import bound_pod, status_of

from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.pods import checkpointed, heartbeat, state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EVERY_STEPS = 10
WINDOW = 25  # > EVERY_STEPS: a resume from the last checkpoint lands inside the window
RUNS = {"stop": "Stop", "go": "Continue"}


def _kill_trainer(state: Path) -> dict[str, Any]:
    beat = heartbeat(state)
    assert beat is not None
    os.kill(int(beat["pid"]), signal.SIGKILL)
    return beat


@pytest.mark.parametrize("operator", ["chart-rbac"], indirect=True)
def test_a_second_death_near_the_same_step_stops_or_continues_as_configured(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    shards = make_shards(tmp_path / "shards")
    for name, policy in RUNS.items():
        run = reference_run(
            name,
            shards,
            EVERY_STEPS,
            {
                "monitor": {"startupGraceSeconds": 5},
                "recovery": {
                    "sameStepWindow": WINDOW,
                    "onRepeatedFailure": policy,
                    "backoff": {"initialSeconds": 1, "maxSeconds": 2},
                },
            },
        )
        apply(cluster, namespace, run)
    states = {}
    for name in RUNS:
        pod = eventually(lambda n=name: bound_pod(cluster, namespace, n), what=f"{name} bound")
        states[name] = state_dir(cluster.root, pod)
    for name, state in states.items():
        eventually(lambda s=state: checkpointed(s, EVERY_STEPS), timeout=120, what=f"{name} ckpt")

    # First death of each: recorded, restarted in place.
    first = {name: _kill_trainer(state) for name, state in states.items()}
    for name in RUNS:
        eventually(
            lambda n=name: status_of(cluster, namespace, n).get("restarts") == 1,
            timeout=20,
            what=f"{name}: first death recorded",
        )

    # Second death right after the resume, from the same checkpoint.
    def resumed(name: str) -> dict[str, Any] | None:
        beat = heartbeat(states[name])
        fresh = beat and beat["pid"] != first[name]["pid"] and beat.get("step") is not None
        return beat if fresh else None

    # Both watched at once: each trainer is killed as soon as its restart wrote a step.
    second: dict[str, dict[str, Any]] = {}

    def each_killed_again() -> bool:
        for name in set(RUNS) - set(second):
            if resumed(name):
                second[name] = _kill_trainer(states[name])
        return len(second) == len(RUNS)

    eventually(
        each_killed_again,
        90,
        "each trainer resumed (and killed again)",
        0.1,
        detail=lambda: f"not resumed: {set(RUNS) - set(second)}",
    )
    for name in RUNS:
        assert abs(second[name]["step"] - first[name]["step"]) <= WINDOW, (first, second)

    def repeated(name: str) -> dict[str, Any] | None:
        found = get_json(cluster, "tr", name, "-n", namespace)
        held = condition(found, "RepeatedFailureAtStep")
        return found if held and held["status"] == "True" else None

    # Stop: the run fails, its pod goes, no restart follows.
    stopped = eventually(lambda: repeated("stop"), timeout=20, what="stop: RepeatedFailureAtStep")
    failed = eventually(
        lambda: condition(get_json(cluster, "tr", "stop", "-n", namespace), "Failed"),
        timeout=20,
        what="stop: Failed",
    )
    assert failed["status"] == "True" and failed["reason"] == "RepeatedFailureAtStep", failed
    eventually(
        lambda: status_of(cluster, namespace, "stop").get("phase") == "Failed",
        timeout=20,
        what="stop: phase Failed",
    )
    eventually(lambda: not pods_of(cluster, namespace, "stop"), timeout=30, what="stop: pod gone")
    assert stopped["status"]["restarts"] == 1, stopped["status"]

    # Continue: the same condition, a second restart in place, and training goes on.
    going = eventually(lambda: repeated("go"), timeout=20, what="go: RepeatedFailureAtStep")
    assert condition(going, "Failed") is None or condition(going, "Failed")["status"] != "True"

    def training_again() -> dict[str, Any] | None:
        beat = heartbeat(states["go"])
        advanced = (
            beat
            and beat["pid"] != second["go"]["pid"]
            and (beat.get("step") or 0) > second["go"]["step"]
        )
        return beat if advanced else None

    eventually(training_again, timeout=90, what="go: training after the second restart")
    status = status_of(cluster, namespace, "go")
    assert status["restarts"] == 2 and status["phase"] != "Failed", status
    assert [p["metadata"]["name"] for p in pods_of(cluster, namespace, "go")] == ["go-1"]
