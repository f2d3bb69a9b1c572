"""Two ranks in one pod on a process-backed node, with the real operator, agent and supervisor.

The reference trainer runs data-parallel on 2 ranks (gloo on CPU, `procsPerNode: 2`) in a pod
that requests 2 simulated GPUs: each rank is its own GPU's one process, so the run reads
Healthy. SIGKILL of rank 1: the status records the death naming rank 1 and its PID, the
supervisor restarts both ranks in the same pod (no new attempt), and both resume from the
same verified step, the newest checkpoint at the death.

Four ranks on four simulated GPUs (`procsPerNode` omitted: one per GPU) read Healthy too; memory
the node's driver reports on GPU 2 alone, held by no live process, is ghost memory naming GPU 2:
the node is excluded and the run moves.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, events_of, pods_of
from recovery_helpers import bound_pod, status_of

from trainguard.contract.env import PodEnv
from trainguard.contract.files import read_json, read_rank_failure, read_rank_pids
from trainguard.gpu import read_published
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.procnode import GPU_SIM_FILENAME
from trainguard_dev.testing.pods import checkpointed, pod_directory, state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUN = "ranks"
EVERY_STEPS = 10
RANKS = 2
# Each start imports torch three times (the launcher and two ranks) on 2 loaded cores.
START_S = 120


def rank_beats(pod: PodEnv) -> list[dict[str, Any] | None]:
    return [read_json(pod.rank_heartbeat(rank)) for rank in range(RANKS)]


def test_two_ranks_read_healthy_and_restart_together_in_place_after_one_is_killed(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    run = reference_run(
        RUN,
        make_shards(tmp_path / "shards"),
        EVERY_STEPS,
        {
            "trainer": {"resources": {"gpus": RANKS}, "procsPerNode": RANKS},
            "monitor": {"startupGraceSeconds": 5},
            "recovery": {"backoff": {"initialSeconds": 1, "maxSeconds": 2}},
        },
    )
    apply(cluster, namespace, run)
    bound = eventually(lambda: bound_pod(cluster, namespace, RUN), what="the pod bound")
    state = state_dir(cluster.root, bound)
    pod = PodEnv(state_dir=state, procs_per_node=RANKS)

    def both_training() -> dict[int, int] | None:
        ranks = read_rank_pids(pod.supervisor_file)
        beats = rank_beats(pod)
        if len(ranks) != RANKS or not checkpointed(state, EVERY_STEPS):
            return None
        own = all(b is not None and b["pid"] == ranks[r] and b["step"] for r, b in enumerate(beats))
        return ranks if own else None

    first = eventually(both_training, START_S, "both ranks training past a checkpoint", 0.1)
    eventually(
        lambda: status_of(cluster, namespace, RUN).get("verdict") == "Healthy", 30, "Healthy"
    )
    readings = read_published(pod.gpu)
    assert readings is not None and [len(g.processes) for g in readings.gpus] == [1, 1]

    os.kill(first[1], signal.SIGKILL)

    def death_recorded() -> dict[str, Any] | None:
        status = status_of(cluster, namespace, RUN)
        failure = status.get("lastFailure") or {}
        return failure if failure.get("cause") == "Dead" and status.get("restarts") == 1 else None

    failure = eventually(death_recorded, 60, "the death in the status", 0.2)
    evidence = json.loads(failure["message"])  # the agent's evidence on the Lease
    assert evidence.get("rank") == "1", failure
    assert evidence.get("rank_pid") == str(first[1]), failure

    def restarted() -> dict[int, int] | None:
        ranks = read_rank_pids(pod.supervisor_file)
        beats = rank_beats(pod)
        new = len(ranks) == RANKS and not set(ranks.values()) & set(first.values())
        own = new and all(
            b is not None and b["pid"] == ranks[r] and b["step"] for r, b in enumerate(beats)
        )
        return ranks if own else None

    eventually(restarted, START_S, "both ranks restarted in place", 0.1)
    # The supervisor's account of the launch that ended, read once it has ended: while the
    # launcher still winds down, the record is the supervisor's first look at the gone rank,
    # whose wait status may already be reaped (no signal yet).
    recorded = read_rank_failure(pod.supervisor_file)
    assert recorded is not None and (recorded.rank, recorded.pid) == (1, first[1])
    assert recorded.signal == "SIGKILL"
    # In place: the same pod, no new attempt.
    pods = pods_of(cluster, namespace, RUN)
    assert [p["metadata"]["uid"] for p in pods] == [bound["metadata"]["uid"]]
    assert status_of(cluster, namespace, RUN).get("attempt") == 1
    eventually(
        lambda: status_of(cluster, namespace, RUN).get("verdict") == "Healthy", 60, "Healthy again"
    )
    # Both ranks of the restart resumed from one step: from L0 (pod memory, about every step),
    # else the newest verified L1 checkpoint at the death, as the supervisor recorded it.
    supervisor = read_json(pod.supervisor_file)
    assert supervisor is not None
    log = (pod_directory(cluster.root, bound) / "trainer.log").read_text()
    resumed = re.findall(r"rank (\d) resumed from \S*step-(\d{8}) \(layer (l0|l1)\)", log)
    assert sorted(rank for rank, _, _ in resumed) == ["0", "1"], log[-4000:]
    [step] = {int(step) for _, step, _ in resumed}
    assert step >= supervisor["checkpoint_step"], (step, supervisor["checkpoint_step"])


FINISHING_RUN = "ranks-finish"
FINISH_STEPS = 60


def test_two_ranks_that_finish_complete_the_run_with_no_death_recorded(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    """The ranks of a launch end one after the other at the last step: that is no death."""
    run = reference_run(
        FINISHING_RUN,
        make_shards(tmp_path / "shards"),
        EVERY_STEPS,
        {
            "trainer": {"resources": {"gpus": RANKS}, "procsPerNode": RANKS},
            "monitor": {"startupGraceSeconds": 5, "intervalSeconds": 1},
        },
        steps=FINISH_STEPS,
    )
    apply(cluster, namespace, run)
    bound = eventually(lambda: bound_pod(cluster, namespace, FINISHING_RUN), what="the pod bound")
    pod = PodEnv(state_dir=state_dir(cluster.root, bound), procs_per_node=RANKS)

    def completed() -> dict[str, Any] | None:
        status = status_of(cluster, namespace, FINISHING_RUN)
        return status if status.get("phase") == "Completed" else None

    status = eventually(completed, START_S + 60, "the run Completed", 0.2)
    supervisor = read_json(pod.supervisor_file)
    assert supervisor is not None and supervisor.get("rank_failure") is None, supervisor
    assert "lastFailure" not in status, json.dumps(status["lastFailure"])
    assert not status.get("restarts") and not status.get("backoffRestarts"), json.dumps(status)
    reasons = [event["reason"] for event in events_of(cluster, namespace, FINISHING_RUN)]
    assert not [reason for reason in reasons if "Dead" in reason], reasons
    beats = rank_beats(pod)
    assert [beat and beat["step"] for beat in beats] == [FINISH_STEPS] * RANKS, beats


GHOST_GPU = 2
GHOST_MIB = 8192


def test_four_ranks_on_four_gpus_read_healthy_and_ghost_memory_on_one_gpu_is_named(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    ranks = 4
    name = "ranks-four"
    run = reference_run(
        name,
        make_shards(tmp_path / "shards"),
        EVERY_STEPS,
        {
            "trainer": {"resources": {"gpus": ranks}},  # procsPerNode: one per GPU by default
            "monitor": {"startupGraceSeconds": 5},
            "recovery": {"backoff": {"initialSeconds": 1, "maxSeconds": 2}},
        },
    )
    apply(cluster, namespace, run)
    bound = eventually(lambda: bound_pod(cluster, namespace, name), what="the pod bound")
    sick = bound["spec"]["nodeName"]
    state = state_dir(cluster.root, bound)
    pod = PodEnv(state_dir=state, procs_per_node=ranks)

    def all_training() -> bool:
        pids = read_rank_pids(pod.supervisor_file)
        beats = [read_json(pod.rank_heartbeat(rank)) for rank in range(ranks)]
        own = all(
            b is not None and b["pid"] == pids.get(r) and b["step"] for r, b in enumerate(beats)
        )
        return own and checkpointed(state, EVERY_STEPS)

    # Five processes import torch on two cores: the launcher and four ranks.
    eventually(all_training, 2 * START_S, "four ranks training past a checkpoint", 0.1)
    # Each rank is its GPU's one process: four processes on four GPUs, no memory unaccounted.
    eventually(
        lambda: status_of(cluster, namespace, name).get("verdict") == "Healthy", 30, "Healthy"
    )
    readings = read_published(pod.gpu)
    assert readings is not None and [len(g.processes) for g in readings.gpus] == [1, 1, 1, 1]

    # The node's simulated driver now reports memory on GPU 2 that no live process holds.
    node_dir = cluster.root / "procnodes" / sick
    (node_dir / GPU_SIM_FILENAME).write_text(json.dumps({"ghost_mib": {str(GHOST_GPU): GHOST_MIB}}))

    def ghost_recorded() -> dict[str, Any] | None:
        failure = status_of(cluster, namespace, name).get("lastFailure") or {}
        return failure if failure.get("cause") == "GhostMemory" else None

    failure = eventually(ghost_recorded, 90, "ghost memory in the status", 0.2)
    evidence = json.loads(failure["message"])
    assert evidence.get("gpu") == str(GHOST_GPU), evidence
    status = status_of(cluster, namespace, name)
    assert [n["node"] for n in status.get("excludedNodes", [])] == [sick], status
    # Attempt 2 runs on another node.
    moved = eventually(lambda: bound_pod(cluster, namespace, name, attempt=2), 120, "attempt 2")
    assert moved["spec"]["nodeName"] != sick
