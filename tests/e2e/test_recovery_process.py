"""Silent death, end to end: real operator, agent, supervisor and trainer on a process node.

The run's pod runs as local processes on a process-backed node (preflight, stage-data from a
file:// source, restore, the agent sidecar, the reference trainer under the supervisor). The
training process is SIGKILLed mid-run: the agent sees it gone (absence, not log age), the
Lease carries `Dead`, the operator writes it to the run's status within seconds and records
an in-place restart; the supervisor restarts the trainer in the same pod, and training goes
on from the newest L1 checkpoint, losing at most one checkpoint interval.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, events_of, get_json, pods_of
from recovery_helpers import bound_pod

from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.pods import checkpointed, heartbeat, state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

EVERY_STEPS = 20


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """A few synthetic token shards, the data source of the run."""
    return make_shards(tmp_path / "shards")


def _run(name: str, shards: Path) -> dict[str, Any]:
    return reference_run(name, shards, EVERY_STEPS, {"monitor": {"startupGraceSeconds": 5}})


def test_silent_death_is_detected_in_seconds_and_resumed_in_place(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    shards: Path,
    process_nodes: list[str],
) -> None:
    apply(cluster, namespace, _run("silent", shards))

    pod = eventually(
        lambda: bound_pod(cluster, namespace, "silent"), what="pod bound to a process-backed node"
    )
    pod_name = pod["metadata"]["name"]
    state = state_dir(cluster.root, pod)
    eventually(
        lambda: checkpointed(state, 2 * EVERY_STEPS),
        timeout=120,
        what="training with two checkpoints",
    )
    eventually(
        lambda: (
            get_json(cluster, "tr", "silent", "-n", namespace).get("status", {}).get("verdict")
            == "Healthy"
        ),
        what="Healthy verdict in the status",
    )
    before = heartbeat(state)
    assert before is not None
    killed_at = time.monotonic()
    os.kill(int(before["pid"]), signal.SIGKILL)

    def dead() -> dict[str, Any] | None:
        status: dict[str, Any] = get_json(cluster, "tr", "silent", "-n", namespace)["status"]
        return status if status.get("verdict") == "Dead" else None

    status = eventually(dead, timeout=15, what="Dead in the run's status")
    detect_s = time.monotonic() - killed_at
    assert detect_s <= 5.0, detect_s
    assert status["restarts"] >= 1
    assert status["lastFailure"]["cause"] == "Dead"

    def resumed() -> dict[str, Any] | None:
        beat = heartbeat(state)
        advanced = (
            beat and beat["pid"] != before["pid"] and (beat.get("step") or 0) > before["step"]
        )
        return beat if advanced else None

    after = eventually(resumed, timeout=90, what="training again after the restart")
    # The same pod: restarted in place by the supervisor, not rescheduled.
    assert [p["metadata"]["name"] for p in pods_of(cluster, namespace, "silent")] == [pod_name]
    assert after["step"] > before["step"]
    steps_lost = before["step"] - before["last_checkpoint_step"]
    assert steps_lost <= EVERY_STEPS
    reasons = {e["reason"] for e in events_of(cluster, namespace, "silent")}
    assert "Dead" in reasons or "RestartingInPlace" in reasons, reasons
