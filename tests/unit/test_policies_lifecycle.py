"""The reconcile decision: one pod per run, the right attempt after any crash, and the report."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from run_factory import make_run

from trainguard.api import TrainingRun
from trainguard.api.constants import NetworkVolumes, Reason
from trainguard.operator.build.pod import spec_hash
from trainguard.operator.policies.lifecycle import (
    Decision,
    PodView,
    decide,
    extra_events,
    observed,
    state,
)
from trainguard.operator.policies.placement import Finding, PlacementDecision

pytestmark = pytest.mark.unit

HASH = spec_hash(make_run().spec)
T0 = "2026-01-01T00:00:00Z"


def cond(kind: str, status: str, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": T0,
    }


def run_with(
    attempt: int | None = None, reason: str | None = None, suspended: bool = False, **spec: Any
) -> TrainingRun:
    conditions = []
    if reason is not None:
        conditions.append(cond("Progressing", "True", reason))
    if suspended:
        conditions.append(cond("Suspended", "True", "Suspended"))
    status: dict[str, Any] = {"conditions": conditions}
    if attempt is not None:
        status["attempt"] = attempt
    return make_run(spec, status)


def pod(attempt: int, **view: Any) -> PodView:
    return PodView(name=f"llm-{attempt}", attempt=attempt, spec_hash=HASH, **view)


RUNNING = {"phase": "Running", "node": "gpu-0"}

# name, run, pods, expected (attempt, create, deleted names, current name, cause, waiting names)
DECISIONS: list[tuple[str, TrainingRun, tuple[PodView, ...], tuple[Any, ...]]] = [
    ("first cycle creates attempt 1", run_with(), (), (1, True, [], None, Reason.CREATED, [])),
    (
        "crash after the create, before the status: adopt, never duplicate",
        run_with(),
        (pod(1),),
        (1, False, [], "llm-1", Reason.CREATED, []),
    ),
    (
        "steady state",
        run_with(1, "Training"),
        (pod(1, **RUNNING),),
        (1, False, [], "llm-1", Reason.CREATED, []),
    ),
    (
        "status written, pod listed late: same name again (idempotent apply)",
        run_with(None, "Scheduling"),
        (),
        (1, True, [], None, Reason.CREATED, []),
    ),
    (
        "pod vanished: next attempt, a restart",
        run_with(1, "Training"),
        (),
        (2, True, [], None, Reason.POD_DELETED, []),
    ),
    (
        "pod being deleted: wait for it",
        run_with(1, "Training"),
        (pod(1, deleting=True),),
        (1, False, [], None, Reason.POD_DELETED, ["llm-1"]),
    ),
    (
        "newer pod than status (crash after the next create): adopt it",
        run_with(1, "PodDeleted"),
        (pod(2),),
        (2, False, [], "llm-2", Reason.CREATED, []),
    ),
    (
        "a stray older pod is deleted",
        run_with(2, "Training"),
        (pod(1, **RUNNING), pod(2, **RUNNING)),
        (2, False, ["llm-1"], "llm-2", Reason.CREATED, []),
    ),
    (
        "spec changed: delete the pod",
        run_with(1, "Training"),
        (replace(pod(1, **RUNNING), spec_hash="old"),),
        (1, False, ["llm-1"], "llm-1", Reason.SPEC_CHANGED, []),
    ),
    (
        "spec changed, old pod terminating: wait, keeping the cause",
        run_with(1, "SpecChanged"),
        (replace(pod(1), spec_hash="old", deleting=True),),
        (1, False, [], None, Reason.SPEC_CHANGED, ["llm-1"]),
    ),
    (
        "spec changed, old pod gone: next attempt, not a restart",
        run_with(1, "SpecChanged"),
        (),
        (2, True, [], None, Reason.SPEC_CHANGED, []),
    ),
    (
        "suspend deletes the pod",
        run_with(1, "Training", suspend=True),
        (pod(1, **RUNNING),),
        (1, False, ["llm-1"], None, Reason.SUSPENDED, []),
    ),
    (
        "suspended and gone: nothing to do",
        run_with(1, "Suspended", suspended=True, suspend=True),
        (),
        (1, False, [], None, Reason.SUSPENDED, []),
    ),
    (
        "resume creates the next attempt",
        run_with(1, "Suspended", suspended=True),
        (),
        (2, True, [], None, Reason.RESUMED, []),
    ),
    (
        "resume while the old pod terminates: wait",
        run_with(1, "Suspended", suspended=True),
        (pod(1, deleting=True),),
        (1, False, [], None, Reason.RESUMED, ["llm-1"]),
    ),
    (
        "succeeded: keep it, nothing more",
        run_with(1, "Training"),
        (pod(1, phase="Succeeded", node="gpu-0"),),
        (1, False, [], "llm-1", Reason.CREATED, []),
    ),
]


@pytest.mark.parametrize(
    ("run", "pods", "expected"), [c[1:] for c in DECISIONS], ids=[c[0] for c in DECISIONS]
)
def test_decide(run: TrainingRun, pods: tuple[PodView, ...], expected: tuple[Any, ...]) -> None:
    decision = decide(run, pods, HASH)
    attempt, create, deleted, current, cause, waiting = expected
    assert decision.attempt == attempt
    assert decision.create is create
    assert [p.name for p in decision.delete] == deleted
    assert (decision.current.name if decision.current else None) == current
    assert decision.cause is cause
    assert [p.name for p in decision.waiting] == waiting


def test_a_completed_run_never_starts_again() -> None:
    run = make_run(status={"attempt": 1, "conditions": [cond("Complete", "True", "Completed")]})
    decision = decide(run, (), HASH)
    assert decision.complete and not decision.create


def test_at_most_one_live_pod_whatever_was_observed() -> None:
    # Any mix of pods and recorded attempts: after the decision's deletions, at most one
    # live pod remains, and a create only happens when no pod is left at all.
    for recorded in (None, 1, 2, 3):
        for present in ((), (1,), (2,), (1, 2), (1, 3), (2, 3), (1, 2, 3)):
            for deleting in (False, True):
                pods = tuple(pod(a, deleting=deleting and a == min(present)) for a in present)
                decision = decide(run_with(recorded, "Training"), pods, HASH)
                gone = {p.name for p in decision.delete}
                live = [p for p in pods if not p.deleting and p.name not in gone]
                assert len(live) <= 1, (recorded, present, deleting)
                if decision.create:
                    assert not pods, (recorded, present, deleting)
                    assert decision.attempt == max([recorded or 0, *present]) + 1


FORBID = PlacementDecision(
    NetworkVolumes.FORBID,
    (Finding("data", "/trainguard/data", "shards", "a network filesystem: PV p is nfs"),),
)
WARN = replace(FORBID, action=NetworkVolumes.WARN)

# name, run, decision, placement,
# (reason, ready, progressing, degraded, suspended, complete, warning)
STATES: list[tuple[str, TrainingRun, Decision, PlacementDecision | None, tuple[Any, ...]]] = [
    (
        "created",
        run_with(),
        Decision(1, create=True),
        None,
        ("Scheduling", False, True, False, False, False, False),
    ),
    (
        "forbidden",
        run_with(),
        Decision(1, create=True),
        FORBID,
        ("NetworkVolumeOnHotPath", False, False, False, False, False, True),
    ),
    (
        "waiting for a node",
        run_with(1),
        Decision(1, current=pod(1)),
        None,
        ("Scheduling", False, True, False, False, False, False),
    ),
    (
        "unschedulable",
        run_with(1),
        Decision(
            1,
            current=pod(
                1, unschedulable="0/3 nodes are available: 3 Insufficient ephemeral-storage."
            ),
        ),
        None,
        ("Unschedulable", False, False, False, False, False, True),
    ),
    (
        "starting",
        run_with(1),
        Decision(1, current=pod(1, node="gpu-0")),
        None,
        ("Starting", False, True, False, False, False, False),
    ),
    (
        "training",
        run_with(1),
        Decision(1, current=pod(1, **RUNNING)),
        None,
        ("Training", True, True, False, False, False, False),
    ),
    (
        "pod failed",
        run_with(1),
        Decision(1, current=pod(1, phase="Failed", node="gpu-0")),
        None,
        ("PodFailed", False, False, True, False, False, True),
    ),
    (
        "completed",
        run_with(1),
        Decision(1, current=pod(1, phase="Succeeded"), complete=True),
        None,
        ("Completed", False, False, False, False, True, False),
    ),
    (
        "suspended",
        run_with(1, suspend=True),
        Decision(1, delete=(pod(1),), cause=Reason.SUSPENDED),
        None,
        ("Suspended", False, False, False, True, False, False),
    ),
    (
        "spec changed",
        run_with(1),
        Decision(1, current=pod(1), delete=(pod(1),), cause=Reason.SPEC_CHANGED),
        None,
        ("SpecChanged", False, True, False, False, False, False),
    ),
    (
        "waiting for the previous attempt",
        run_with(1),
        Decision(1, cause=Reason.POD_DELETED, waiting=(pod(1, deleting=True),)),
        None,
        ("PodDeleted", False, True, False, False, False, False),
    ),
]


@pytest.mark.parametrize(
    ("run", "decision", "placement", "expected"),
    [c[1:] for c in STATES],
    ids=[c[0] for c in STATES],
)
def test_state(
    run: TrainingRun,
    decision: Decision,
    placement: PlacementDecision | None,
    expected: tuple[Any, ...],
) -> None:
    found = state(run, decision, placement)
    assert (
        found.reason,
        found.ready,
        found.progressing,
        found.degraded,
        found.suspended,
        found.complete,
        found.warning,
    ) == expected
    assert found.message


def test_unschedulable_surfaces_the_schedulers_message() -> None:
    message = "0/3 nodes are available: 3 Insufficient ephemeral-storage."
    found = state(run_with(1), Decision(1, current=pod(1, unschedulable=message)), None)
    assert message in found.message


def test_forbidden_names_volume_and_mount() -> None:
    found = state(run_with(), Decision(1, create=True), FORBID)
    assert "volume data (claim shards, mounted at /trainguard/data)" in found.message


def test_observed_attempt_is_recorded_only_for_a_pod_that_was_applied() -> None:
    assert observed(run_with(), Decision(1, create=True), None).attempt == 1
    assert observed(run_with(), Decision(1, create=True), FORBID).attempt is None
    assert (
        observed(run_with(3), Decision(4, create=True, cause=Reason.RESUMED), FORBID).attempt == 3
    )


def test_restarts_count_vanished_pods_only() -> None:
    run = make_run(status={"attempt": 1, "restarts": 2})
    assert observed(run, Decision(2, create=True, cause=Reason.POD_DELETED), None).restarts == 3
    assert observed(run, Decision(2, create=True, cause=Reason.SPEC_CHANGED), None).restarts == 2
    assert observed(run, Decision(2, create=True, cause=Reason.RESUMED), None).restarts == 2


def test_observed_node_and_start() -> None:
    found = observed(run_with(1), Decision(1, current=pod(1, **RUNNING)), None)
    assert (found.node, found.started) == ("gpu-0", True)
    leaving = pod(1, **RUNNING)
    found = observed(run_with(1), Decision(1, current=leaving, delete=(leaving,)), None)
    assert (found.node, found.started) == (None, False)


def test_warn_sends_a_warning_with_the_created_pod() -> None:
    [event] = extra_events(Decision(1, create=True), WARN)
    assert event.warning and event.reason == "NetworkVolumeOnHotPath"
    assert "mounted at /trainguard/data" in event.message
    assert extra_events(Decision(1, create=True), None) == []
    assert extra_events(Decision(1, current=pod(1)), WARN) == []
