"""A TrainingRun of two members x two ranks on the two real nodes, made by the chart's operator.

`spec.trainer.nodes: 2`, `procsPerNode: 2`: the operator creates the gang (member pods
`<run>-1-0` and `<run>-1-1`, one per real node, the headless Service, the contract's gang
variables); each member's supervisor runs its two ranks of the reference trainer under torchrun,
joined to member 0's rendezvous through the cluster's DNS, so one DDP world of four ranks (gloo)
spans the nodes. Each member's agent reads its node's two simulated GPUs, one rank on each.

One scenario, two failures (the gang's start-up is shared):

1. SIGKILL of rank 1 on member 1 (through `kubectl exec`, as a user could): member 0's ranks fail
   at their next collective, both supervisors restart their ranks in place (the pods stay,
   attempt 1), and all four resume from one verified step, member 1's from rank 0's copy. A
   second, identical run that nobody interrupts trains beside it on the same nodes: the
   interrupted run's loss at every step equals its loss at that step (bit for bit before the
   resume).
2. Ghost memory on member 1's node (the node's simulated GPU keeps memory no process holds):
   member 1's own agent says GhostMemory; the operator excludes that node alone, deletes member
   1's pod and places its replacement on the other node (beside member 0, whose pod stays);
   member 0's ranks restart in place when the collective breaks, and all four ranks resume from
   one step.

Each failure is one gang restart the operator records (`status.gangRestart`, generations 1 and
2) and every member follows without restarting twice.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from realnodes.conftest import (
    RUNS_NAMESPACE,
    Trainguard,
    apply_in_runs,
    exec_python,
    pod_state,
    real_run,
    run_events,
    run_pods,
    run_status,
)
from trainguard.api.constants import (
    LABEL_MEMBER,
    LABEL_NODE_HEALTH,
    TAINT_UNHEALTHY,
    Verdict,
)
from trainguard.contract.files import read_json
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.runs import reference_command

pytestmark = [pytest.mark.realnodes, pytest.mark.timeout(600, func_only=True)]

MEMBERS = 2
RANKS = 2
EVERY = 10
STEPS = 100_000
# Rank 0 of member 0 appends the mean loss of every step here (its pod's state volume).
LOSS_LOG = "/trainguard/state/loss.jsonl"
L1 = "/trainguard/l1"
# Memory no process holds, above the agent's default threshold (2048 MiB) for a live trainer.
GHOST_MIB = 8192
RESUMED = re.compile(r"rank (\d) resumed from \S*step-(\d{8})")


def losses(state: Path) -> list[tuple[int, float]]:
    path = state / "loss.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(record["step"], record["loss"]) for record in lines]


def member_pods(trainguard: Trainguard, name: str) -> dict[int, dict[str, Any]]:
    """The run's member pods by index, once each is bound to a node."""
    pods = run_pods(trainguard.cluster, name)
    return {
        int(p["metadata"]["labels"][LABEL_MEMBER]): p for p in pods if p["spec"].get("nodeName")
    }


def all_bound(trainguard: Trainguard, name: str) -> dict[int, dict[str, Any]] | None:
    """Every member pod by index once all are bound, else None."""
    found = member_pods(trainguard, name)
    return found if len(found) == MEMBERS else None


def rank_pids(state: Path) -> dict[int, int]:
    supervisor = read_json(state / "supervisor.json") or {}
    return {int(rank): int(pid) for rank, pid in (supervisor.get("rank_pids") or {}).items()}


def rank_steps(state: Path) -> list[int | None]:
    beats = [read_json(state / f"heartbeat-{rank}.json") for rank in range(RANKS)]
    return [beat.get("step") if beat else None for beat in beats]


def logs(trainguard: Trainguard, pod: str) -> str:
    out = trainguard.cluster.kubectl(
        "logs", "-n", RUNS_NAMESPACE, pod, "-c", "trainer", check=False
    )
    return str(out.stdout)


def test_an_operator_made_gang_restarts_in_place_then_moves_a_member_off_ghost_memory(
    trainguard: Trainguard, shards_claim: str, run_name: str
) -> None:
    cluster = trainguard.cluster
    command = [*reference_command(STEPS, 0.1), "--loss-log", LOSS_LOG]
    spec = {
        "trainer": {
            "nodes": MEMBERS,
            "procsPerNode": RANKS,
            "resources": {"gpus": RANKS},
            "command": command,
        },
        "monitor": {"startupGraceSeconds": 30},
    }
    # The uninterrupted reference: the same run under another name, beside it on the same nodes.
    reference = f"{run_name}-ref"
    apply_in_runs(
        cluster,
        real_run(trainguard, run_name, shards_claim, EVERY, spec),
        real_run(trainguard, reference, shards_claim, EVERY, spec),
    )
    try:
        pods, states = interrupted_gang(trainguard, run_name, reference)
    finally:
        cluster.kubectl(
            "delete", "trainingrun", reference, "-n", RUNS_NAMESPACE, "--wait=false", check=False
        )
    # The reference's members leave the nodes before one of them turns sick.
    eventually(lambda: not run_pods(cluster, reference), 120, "the reference's pods gone")
    ghost_moves_member_1(trainguard, run_name, pods, states)


def interrupted_gang(
    trainguard: Trainguard, run_name: str, reference: str
) -> tuple[dict[int, dict[str, Any]], list[Path]]:
    """The kill of a rank on member 1, the in-place restart, the losses; the pods, their states."""
    cluster = trainguard.cluster
    names = [f"{run_name}-1-{m}" for m in range(MEMBERS)]

    def detail() -> str:
        status = json.dumps(run_status(cluster, run_name))[:2000]
        return status + "\n" + "\n".join(f"{p}:\n{logs(trainguard, p)[-2500:]}" for p in names)

    pods = eventually(
        lambda: all_bound(trainguard, run_name), 120, "both members bound", detail=detail
    )
    assert sorted(p["metadata"]["name"] for p in pods.values()) == names
    assert len({p["spec"]["nodeName"] for p in pods.values()}) == MEMBERS  # one per real node
    states = [pod_state(trainguard, pods[m]) for m in range(MEMBERS)]

    def training_past_two_checkpoints() -> dict[int, int] | None:
        pids = [rank_pids(state) for state in states]
        steps = [s for state in states for s in rank_steps(state)]
        if any(len(p) != RANKS for p in pids) or any(s is None for s in steps):
            return None
        return pids[1] if min(s or 0 for s in steps) > 2 * EVERY + 2 else None

    first = eventually(
        training_past_two_checkpoints, 300, "four ranks past two checkpoints", 1.0, detail=detail
    )
    status = eventually(
        lambda: (
            (s := run_status(cluster, run_name)).get("verdict") == Verdict.HEALTHY
            and s.get("membersReady") == f"{MEMBERS}/{MEMBERS}"
            and s
        ),
        60,
        "Healthy, both members ready",
        detail=detail,
    )
    assert status["attempt"] == 1
    assert [(m["index"], m["pod"]) for m in status["members"]] == list(enumerate(names))
    before = [rank_pids(state) for state in states]

    # Rank 1 of member 1 dies, killed inside its own container as an OOM kill or crash would.
    exec_python(cluster, names[1], "trainer", f"import os; os.kill({first[1]}, 9)")

    def restarted() -> bool:
        now = [rank_pids(state) for state in states]
        fresh = all(
            len(p) == RANKS and not set(p.values()) & set(old.values())
            for p, old in zip(now, before, strict=True)
        )
        return fresh and all(s for state in states for s in rank_steps(state))

    eventually(restarted, 240, "every member's ranks restarted and training", 1.0, detail=detail)
    # In place: the same two pods of attempt 1, each supervisor on its second launch.
    assert sorted(p["metadata"]["name"] for p in run_pods(cluster, run_name)) == names
    assert run_status(cluster, run_name)["attempt"] == 1
    # One gang restart, recorded once by the operator and followed by both members: each
    # supervisor launched its ranks twice, not three times (its own failure already made it run
    # generation 1, so the order restarted nobody a second time).
    restart = eventually(
        lambda: run_status(cluster, run_name).get("gangRestart"), 30, "the gang restart recorded"
    )
    assert (restart["generation"], restart["cause"]) == (1, Verdict.DEAD.value), restart
    for state in states:
        supervisor = read_json(state / "supervisor.json") or {}
        assert len(supervisor["history"]) == 2
        assert supervisor["gang_generation"] == 1
    failure = (read_json(states[1] / "supervisor.json") or {})["rank_failure"]
    assert (failure["rank"], failure["pid"], failure["signal"]) == (1, first[1], "SIGKILL")
    # Rank 0 alone saves, in member 0's L1: member 1's ranks resume from rank 0's copy.
    kept = exec_python(cluster, names[1], "trainer", f"import os; print(os.listdir({L1!r}))")
    assert "step-" not in kept, kept

    def resumed() -> dict[str, str] | None:
        found: dict[str, str] = {}
        for name in names:
            found.update(RESUMED.findall(logs(trainguard, name)))
        return found if len(found) == MEMBERS * RANKS else None

    steps = eventually(resumed, 60, "every rank's resume in the logs", 1.0, detail=detail)
    assert len(set(steps.values())) == 1, steps  # all four from one step
    step = int(steps["0"])
    assert step >= 2 * EVERY

    # The reference's losses, up to well past the resume in both runs.
    reference_state = pod_state(trainguard, member_pods(trainguard, reference)[0])
    horizon = step + 2 * EVERY

    def past_the_resume() -> tuple[list[tuple[int, float]], dict[int, float]] | None:
        logged, expected = losses(states[0]), dict(losses(reference_state))
        reached = max((s for s, _ in logged), default=0)
        return (logged, expected) if reached >= horizon and max(expected) >= horizon else None

    logged, expected = eventually(
        past_the_resume, 120, f"both runs' losses past step {horizon}", 1.0, detail=detail
    )
    before_kill = [(s, loss) for s, loss in logged if s <= step]
    assert len(before_kill) >= step, (step, len(before_kill))
    # Before the resume: bit for bit. After it DDP rebuilds its bucket layout after its first
    # step, so the reduction order may differ in the last bits; consecutive steps' losses differ
    # by far more than that.
    assert all(loss == expected[s] for s, loss in before_kill)
    after = [(s, loss) for s, loss in logged if s > step and s <= horizon]
    assert [s for s, _ in after][-EVERY:] == list(range(horizon - EVERY + 1, horizon + 1))
    assert all(loss == pytest.approx(expected[s], rel=1e-5) for s, loss in after)
    verdict = eventually(
        lambda: (s := run_status(cluster, run_name)).get("verdict") == Verdict.HEALTHY and s,
        120,
        "Healthy again",
        detail=detail,
    )
    assert verdict["attempt"] == 1
    print(
        f"gang of {MEMBERS}x{RANKS} on real nodes: resumed from step {step}, "
        f"{len(after)} losses after it equal the uninterrupted run's, events: "
        + ", ".join(sorted({e.get("reason", "") for e in run_events(cluster, run_name)}))
    )
    return pods, states


def ghost_moves_member_1(
    trainguard: Trainguard,
    run_name: str,
    pods: dict[int, dict[str, Any]],
    states: list[Path],
) -> None:
    """Ghost memory on member 1's node: member 1 alone moved, the gang resumed from one step."""
    cluster = trainguard.cluster
    names = [f"{run_name}-1-{m}" for m in range(MEMBERS)]

    def detail() -> str:
        status = json.dumps(run_status(cluster, run_name))[:2000]
        return status + "\n" + "\n".join(f"{p}:\n{logs(trainguard, p)[-2500:]}" for p in names)

    sick = cluster.real_nodes.node(pods[1]["spec"]["nodeName"])
    other = pods[0]["spec"]["nodeName"]
    before = rank_pids(states[0])
    told = len(logs(trainguard, names[0]))  # member 0's log so far: its earlier resumes
    try:
        sick.gpusim_state.write_text(json.dumps({"ghost_mib": GHOST_MIB}))

        def replaced() -> dict[str, Any] | None:
            again = member_pods(trainguard, run_name).get(1)
            if again is None or again["metadata"]["uid"] == pods[1]["metadata"]["uid"]:
                return None
            return again if again["status"].get("phase") == "Running" else None

        again = eventually(replaced, 180, "member 1 replaced and running", 1.0, detail=detail)
        assert again["spec"]["nodeName"] == other  # the only node not excluded
        status = run_status(cluster, run_name)
        assert status["attempt"] == 1
        assert [(e["node"], e["reason"]) for e in status["excludedNodes"]] == [
            (sick.name, Verdict.GHOST_MEMORY.value)
        ]
        # Member 0 kept its pod; its ranks restarted in place when member 1's went.
        kept = member_pods(trainguard, run_name)[0]
        assert kept["metadata"]["uid"] == pods[0]["metadata"]["uid"]
        state_1 = pod_state(trainguard, again)

        def resumed() -> dict[str, str] | None:
            fresh = rank_pids(states[0])
            if not fresh or set(fresh.values()) & set(before.values()):
                return None
            found = dict(RESUMED.findall(logs(trainguard, names[0])[told:]))
            found.update(RESUMED.findall(logs(trainguard, names[1])))
            steps = [*rank_steps(states[0]), *rank_steps(state_1)]
            done = len(found) == MEMBERS * RANKS and all(steps)
            return found if done else None

        steps = eventually(resumed, 180, "all four ranks resumed", 1.0, detail=detail)
        assert len(set(steps.values())) == 1, steps  # one step for the whole gang
        assert int(steps["0"]) >= 2 * EVERY
        reasons = {e.get("reason") for e in run_events(cluster, run_name)}
        assert Verdict.GHOST_MEMORY.value in reasons, reasons
        # The move was the gang's second restart, caused by member 1's node; member 0 ran its
        # ranks once more for it, and the replacement started in generation 2 without a restart.
        restart = run_status(cluster, run_name)["gangRestart"]
        assert (restart["generation"], restart["member"], restart["cause"]) == (
            2,
            1,
            Verdict.GHOST_MEMORY.value,
        ), restart
        supervisor_0 = read_json(states[0] / "supervisor.json") or {}
        assert (len(supervisor_0["history"]), supervisor_0["gang_generation"]) == (3, 2)
        supervisor_1 = read_json(state_1 / "supervisor.json") or {}
        assert (supervisor_1["restarts"], supervisor_1["gang_generation"]) == (0, 2)
        print(
            f"ghost memory on {sick.name}: member 1 moved to {other}, "
            f"the gang resumed from step {steps['0']}"
        )
    finally:
        sick.gpusim_state.write_text("{}")
        cluster.kubectl("taint", "node", sick.name, f"{TAINT_UNHEALTHY}-", check=False)
        cluster.kubectl("label", "node", sick.name, f"{LABEL_NODE_HEALTH}-", check=False)
