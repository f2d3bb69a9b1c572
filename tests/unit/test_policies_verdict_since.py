"""A failure verdict that began anew is a new failure, even when no cycle saw it end.

The agent annotates when its current verdict began (`trainguard.dev/verdict-since`). A
Dead -> Healthy -> Dead that falls between two operator cycles leaves the status showing
Dead with the first death recorded: only the verdict's start tells the second death apart.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainguard.api import TrainingRunStatus
from trainguard.api.constants import ANNOTATION_VERDICT, ANNOTATION_VERDICT_SINCE, Verdict
from trainguard.api.spec import Backoff, Recovery
from trainguard.api.status import Failure as FailureRecord
from trainguard.operator.k8s.leases import lease_view
from trainguard.operator.policies import ladder
from trainguard.operator.policies.failures import Observation, detect, history, record
from trainguard.operator.policies.lifecycle import PodView
from trainguard.operator.policies.signals import LeaseView, same_failure, urgent

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
FIRST = T0 + timedelta(seconds=1, microseconds=250_000)
SECOND = T0 + timedelta(seconds=9, microseconds=500_000)
POD = PodView("llm-1", 1, phase="Running", node="gpu-a")


def dead(since: datetime | None, step: int = 120) -> LeaseView:
    return LeaseView(Verdict.DEAD, step, 100, "{}", T0, 15, holder="llm-1", since=since)


def recorded(since: datetime | None) -> TrainingRunStatus:
    """The status after the operator recorded the first death (the status shows Dead)."""
    last = FailureRecord(cause="Dead", step=120, time=T0, attempt=1, message="", since=since)
    return TrainingRunStatus(attempt=1, restarts=1, last_failure=last, verdict=Verdict.DEAD)


@pytest.mark.parametrize(
    ("status", "view", "new"),
    [
        # The same death, seen again by a later cycle (microseconds are not kept).
        (recorded(FIRST.replace(microsecond=0)), dead(FIRST), False),
        # Dead -> Healthy -> Dead between two cycles: a new start, a new failure.
        (recorded(FIRST.replace(microsecond=0)), dead(SECOND), True),
        # An agent that does not say when: as before, the same failure while the status
        # shows it.
        (recorded(None), dead(None), False),
        (recorded(FIRST), dead(None), False),
        (recorded(None), dead(SECOND), False),
    ],
)
def test_a_new_start_of_a_failure_verdict_is_a_new_failure(
    status: TrainingRunStatus, view: LeaseView, new: bool
) -> None:
    found = detect(status, Observation(1, POD, view, True, T0))
    assert (found is not None) == new
    assert urgent(view, status) == new


def test_the_recorded_start_makes_the_next_cycle_see_the_same_failure() -> None:
    view = dead(FIRST)
    status = TrainingRunStatus(attempt=1)
    found = detect(status, Observation(1, POD, view, True, T0))
    assert found is not None and found.since == FIRST
    decision = ladder.decide(found.failure, history(status), Recovery())
    after = record(status, found, decision, 1, 1, T0, Backoff())
    # Round trip through the API object, as the next cycle reads it.
    after = TrainingRunStatus.from_object(after.to_object())
    assert detect(after, Observation(1, POD, view, True, T0)) is None
    assert not urgent(view, after)
    # The second death, begun later while the status still shows Dead, is found.
    again = detect(after, Observation(1, POD, dead(SECOND, step=125), True, T0))
    assert again is not None and again.failure.step == 125
    assert ladder.is_repeated(again.failure, history(after), Recovery().same_step_window)


def test_lease_view_reads_the_verdict_start() -> None:
    lease = {
        "metadata": {
            "annotations": {
                ANNOTATION_VERDICT: "Dead",
                ANNOTATION_VERDICT_SINCE: "2026-01-01T12:00:01.250000Z",
            }
        },
        "spec": {"holderIdentity": "llm-1"},
    }
    assert lease_view(lease).since == FIRST
    broken = {"metadata": {"annotations": {ANNOTATION_VERDICT_SINCE: "yesterday"}}, "spec": {}}
    assert lease_view(broken).since is None


@pytest.mark.parametrize(
    ("last", "since", "same"),
    [
        (None, FIRST, True),
        (FIRST, None, True),
        (FIRST.replace(microsecond=0), FIRST, True),
        (FIRST, SECOND, False),
    ],
)
def test_same_failure_compares_starts_for_equality_at_the_second(
    last: datetime | None, since: datetime | None, same: bool
) -> None:
    assert same_failure(last, since) == same
