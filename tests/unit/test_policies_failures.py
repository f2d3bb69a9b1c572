"""New failures of the current attempt, and how the ladder's decision is recorded in status."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from trainguard.api import TrainingRunStatus
from trainguard.api.constants import Phase, Verdict
from trainguard.api.spec import Backoff, Recovery
from trainguard.api.status import Failure as FailureRecord
from trainguard.operator.conditions import derive_phase
from trainguard.operator.k8s.leases import lease_view
from trainguard.operator.policies import ladder
from trainguard.operator.policies.failures import (
    Found,
    Observation,
    detect,
    detection_seconds,
    history,
    record,
)
from trainguard.operator.policies.ladder import Failure
from trainguard.operator.policies.lifecycle import PodView, given_up
from trainguard.operator.policies.signals import LeaseView, urgent

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POD = PodView("llm-2", 2, phase="Running", node="gpu-a")
HEALTHY = LeaseView(Verdict.HEALTHY, 50, 40, holder="llm-2", renewed=T0, duration_seconds=15)


def lease(verdict: Verdict, holder: str = "llm-2") -> LeaseView:
    return LeaseView(verdict, 120, 100, '{"reason":"x"}', T0, 15, holder)


def handled(cause: str, attempt: int = 2, verdict: Verdict | None = None) -> TrainingRunStatus:
    last = FailureRecord(cause=cause, step=120, time=T0, attempt=attempt, message="")
    return TrainingRunStatus(attempt=2, last_failure=last, verdict=verdict)


NONE = TrainingRunStatus(attempt=2)


@pytest.mark.parametrize(
    ("status", "pod", "view", "ready", "late", "cause"),
    [
        (NONE, POD, HEALTHY, True, 0, None),
        (NONE, POD, lease(Verdict.GHOST_MEMORY), True, 0, "GhostMemory"),
        (NONE, POD, lease(Verdict.DEAD), True, 0, "Dead"),
        (NONE, POD, lease(Verdict.SLOW), True, 0, None),
        # The Lease still speaks of the pod of the previous attempt.
        (NONE, POD, lease(Verdict.DEAD, holder="llm-1"), True, 0, None),
        # Handled already on this attempt (the status shows the verdict): not again...
        (handled("Dead", verdict=Verdict.DEAD), POD, lease(Verdict.DEAD), True, 0, None),
        # ... but after the verdict went back to Healthy, a new death is new.
        (handled("Dead", verdict=Verdict.HEALTHY), POD, lease(Verdict.DEAD), True, 0, "Dead"),
        (handled("Dead", attempt=1), POD, lease(Verdict.DEAD), True, 0, "Dead"),
        (NONE, PodView("llm-2", 2, phase="Failed", node="gpu-a"), None, True, 0, "PodFailed"),
        (handled("PodFailed"), PodView("llm-2", 2, phase="Failed"), None, True, 0, None),
        (NONE, PodView("llm-2", 2, "Failed", "gpu-a", preflight_exit=12), None, True, 0,
         "PreflightFailed"),
        (NONE, PodView("llm-2", 2, "Failed", "gpu-a", preflight_exit=1), None, True, 0,
         "PodFailed"),
        (NONE, PodView("llm-2", 2, "Pending", "gpu-a", preflight_exit=0), None, True, 0, None),
        (NONE, POD, HEALTHY, False, 60, "LeaseExpired"),
        (NONE, POD, HEALTHY, None, 60, "LeaseExpired"),  # node gone
        (NONE, POD, HEALTHY, True, 60, None),  # expired on a Ready node: not a node failure
        (NONE, POD, HEALTHY, False, 5, None),
        (NONE, PodView("llm-2", 2, "Running", "gpu-a", deleting=True), lease(Verdict.DEAD),
         True, 0, None),
        (NONE, None, lease(Verdict.DEAD), True, 0, None),
    ],
)  # fmt: skip
def test_detect(
    status: TrainingRunStatus,
    pod: PodView | None,
    view: LeaseView | None,
    ready: bool | None,
    late: int,
    cause: str | None,
) -> None:
    seen = Observation(2, pod, view, ready, T0 + timedelta(seconds=late))
    found = detect(status, seen)
    assert (found.failure.cause if found else None) == cause


def test_a_detected_failure_carries_step_node_and_evidence() -> None:
    found = detect(NONE, Observation(2, POD, lease(Verdict.IO_STUCK), True, T0))
    # The newest verified checkpoint: the one the pod's agent reports (none in the status yet).
    assert found == Found(
        Failure("IOStuck", 120, True), "gpu-a", '{"reason":"x"}', checkpoint_step=100
    )


# The agent's verdict start, to the microsecond its Lease annotation carries.
SINCE = T0 - timedelta(seconds=3, microseconds=250_000)
NOT_RELEASED = LeaseView(
    Verdict.GHOST_MEMORY, 120, 100, "", T0, 15, "llm-2", cause="GPUMemoryNotReleased"
)


@pytest.mark.parametrize(
    ("pod", "view", "ready", "began"),
    [
        (POD, replace(lease(Verdict.DEAD), since=SINCE), True, SINCE),
        (POD, replace(lease(Verdict.HUNG), since=SINCE), True, SINCE),
        (POD, replace(NOT_RELEASED, since=SINCE), True, SINCE),  # a narrower cause: the same
        (POD, lease(Verdict.DEAD), True, None),  # an agent that does not say when
        # The operator sees the expiry itself: from when the Lease ran out (renewal + 15 s).
        (POD, HEALTHY, False, T0 + timedelta(seconds=15)),
        # A failed pod is the pod's phase: no clock says when it began.
        (PodView("llm-2", 2, phase="Failed", node="gpu-a"),
         replace(lease(Verdict.DEAD), since=SINCE), True, None),
    ],
)  # fmt: skip
def test_a_failure_begins_at_its_first_sight(
    pod: PodView, view: LeaseView, ready: bool, began: datetime | None
) -> None:
    found = detect(NONE, Observation(2, pod, view, ready, T0 + timedelta(seconds=60)))
    assert found is not None and found.began == began


@pytest.mark.parametrize(
    ("began", "seconds"),
    [
        (SINCE, 3.25),  # the verdict's start to the write, to the microsecond
        (T0, 0.0),
        (T0 + timedelta(seconds=2), 0.0),  # the agent's clock ahead of the operator's
        (None, None),  # a failure no clock dates is not timed
    ],
)
def test_detection_is_timed_from_the_first_sight_to_the_write(
    began: datetime | None, seconds: float | None
) -> None:
    found = Found(Failure("Dead", 120, True), "gpu-a", "exit 1", began=began)
    assert detection_seconds(found, T0) == seconds


def _decide(status: TrainingRunStatus, found: Found, **recovery: object) -> TrainingRunStatus:
    decision = ladder.decide(found.failure, history(status), Recovery(**recovery))
    return record(status, found, decision, 2, 1, T0, Backoff())


def test_a_node_failure_excludes_the_node_and_carries_rescheduling() -> None:
    found = Found(Failure("GhostMemory", 120, True), "gpu-a", "held 3 GiB")
    new = _decide(NONE, found)
    assert [(e.node, e.reason) for e in new.excluded_nodes] == [("gpu-a", "GhostMemory")]
    assert (new.restarts, new.in_place_restarts, new.verdict) == (1, 0, Verdict.GHOST_MEMORY)
    assert new.last_failure is not None
    assert (new.last_failure.attempt, new.last_failure.message) == (2, "held 3 GiB")
    [progressing] = [c for c in new.conditions if c.type == "Progressing"]
    assert progressing.reason == "Rescheduling"
    again = _decide(new.model_copy(update={"last_failure": None}), found)
    assert len(again.excluded_nodes) == 1  # a node is excluded once


def test_deaths_restart_in_place_then_reschedule() -> None:
    status = NONE
    actions = []
    for step in (100, 200, 300):
        found = Found(Failure("Dead", step, True), "gpu-a", "exit 1")
        decision = ladder.decide(found.failure, history(status), Recovery(inPlaceRestarts=2))
        status = record(status, found, decision, 2, 1, T0, Backoff())
        actions.append((decision.action.value, status.in_place_restarts, status.restarts))
    assert actions == [("RestartInPlace", 1, 1), ("RestartInPlace", 2, 2), ("Reschedule", 0, 3)]
    assert not status.excluded_nodes  # a software failure keeps the node


def test_a_repeated_failure_with_stop_fails_the_run() -> None:
    first = _decide(NONE, Found(Failure("Dead", 120, True), "gpu-a", "exit 1"))
    second = _decide(first, Found(Failure("Dead", 125, True), "gpu-a", "exit 1"))
    kinds = {c.type: (c.status.value, c.reason) for c in second.conditions}
    assert kinds["RepeatedFailureAtStep"] == ("True", "RepeatedFailureAtStep")
    assert kinds["Failed"] == ("True", "RepeatedFailureAtStep")
    assert given_up(second) and not given_up(first)


def test_the_recorded_failure_carries_the_phase_its_conditions_say() -> None:
    # Recorded (and written) before the cycle's state: a status read in between must not say
    # Running beside Failed=True.
    running = NONE.model_copy(update={"phase": Phase.RUNNING})
    first = _decide(running, Found(Failure("Dead", 120, True), "gpu-a", "exit 1"))
    second = _decide(first, Found(Failure("Dead", 125, True), "gpu-a", "exit 1"))
    assert second.phase == derive_phase(second.conditions) == Phase.FAILED


@pytest.mark.parametrize(
    ("second_attempt", "first_cause", "expected"),
    [
        (2, "Dead", ("Reschedule", False)),  # the death's memory, left behind: its aftermath
        (2, "GhostMemory", ("Fail", True)),  # node cause twice at the step: a pattern
        (3, "Dead", ("Fail", True)),  # a later attempt failing at the step: a pattern
    ],
)
def test_memory_left_by_a_death_is_its_aftermath_not_a_repeat(
    second_attempt: int, first_cause: str, expected: tuple[str, bool]
) -> None:
    first = _decide(NONE, Found(Failure(first_cause, 120, True), "gpu-a", "exit 1"))
    status = first.model_copy(update={"attempt": second_attempt})
    found = Found(Failure("GhostMemory", 120, True), "gpu-a", "not released")
    decision = ladder.decide(found.failure, history(status, found), Recovery())
    assert (decision.action.value, decision.repeated) == expected


def _read_lease(annotations: dict[str, str]) -> LeaseView:
    return lease_view(
        {"metadata": {"annotations": annotations}, "spec": {"holderIdentity": "llm-2"}}
    )


def test_memory_not_released_is_its_own_cause_recorded_once() -> None:
    evidence = json.dumps({"reason": "1024 MiB still held", "cause": "GPUMemoryNotReleased"})
    annotations = {
        "trainguard.dev/verdict": "GhostMemory",
        "trainguard.dev/evidence": evidence,
        "trainguard.dev/step": "120",
    }
    view = lease_view(
        {"metadata": {"annotations": annotations}, "spec": {"holderIdentity": "llm-2"}}
    )
    assert (view.verdict, view.cause) == (Verdict.GHOST_MEMORY, "GPUMemoryNotReleased")
    after_death = _decide(NONE, Found(Failure("Dead", 120, True), "gpu-a", "exit 1"))
    found = detect(after_death, Observation(2, POD, view, True, T0))
    assert found is not None and found.failure.cause == "GPUMemoryNotReleased"
    decision = ladder.decide(found.failure, history(after_death, found), Recovery())
    assert (decision.action.value, decision.taint_node, decision.repeated) == (
        "Reschedule",
        True,
        False,
    )
    new = record(after_death, found, decision, 2, 1, T0, Backoff())
    assert [(e.node, e.reason) for e in new.excluded_nodes] == [("gpu-a", "GPUMemoryNotReleased")]
    assert new.verdict == Verdict.GHOST_MEMORY  # the verdict the agent reported
    assert detect(new, Observation(2, POD, view, True, T0)) is None  # handled
    assert not urgent(view, new)


@pytest.mark.parametrize(
    ("verdict", "cause"),
    [
        ("GhostMemory", "Dead"),  # not a cause that narrows GhostMemory
        ("Dead", "GPUMemoryNotReleased"),  # narrows GhostMemory, not Dead
        ("GhostMemory", "NoSuchCause"),
    ],
)
def test_only_a_cause_that_narrows_the_verdict_is_taken(verdict: str, cause: str) -> None:
    annotations = {
        "trainguard.dev/verdict": verdict,
        "trainguard.dev/evidence": json.dumps({"reason": "x", "cause": cause}),
    }
    view = lease_view(
        {"metadata": {"annotations": annotations}, "spec": {"holderIdentity": "llm-2"}}
    )
    assert view.cause is None
    found = detect(NONE, Observation(2, POD, view, True, T0))
    assert found is not None and found.failure.cause == verdict
