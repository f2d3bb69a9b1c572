"""Restart back-off: the delay table, when it starts over, what is left of it, what it holds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainguard.api import TrainingRunStatus
from trainguard.api.constants import Reason
from trainguard.api.spec import Backoff
from trainguard.api.status import ExcludedNode
from trainguard.api.status import Failure as FailureRecord
from trainguard.operator.policies.backoff import delay, hold, remaining, streak
from trainguard.operator.policies.lifecycle import Decision

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FIVE_TO_300 = Backoff(initial_seconds=5, max_seconds=300)


@pytest.mark.parametrize(
    ("backoff", "restart", "seconds"),
    [
        (FIVE_TO_300, 0, 0.0),
        (FIVE_TO_300, -1, 0.0),
        (FIVE_TO_300, 1, 5.0),
        (FIVE_TO_300, 2, 10.0),
        (FIVE_TO_300, 3, 20.0),
        (FIVE_TO_300, 6, 160.0),
        (FIVE_TO_300, 7, 300.0),  # 320 capped
        (FIVE_TO_300, 10_000, 300.0),  # no overflow, still the cap
        (Backoff(initial_seconds=0, max_seconds=0), 4, 0.0),
        (Backoff(initial_seconds=1, max_seconds=1), 9, 1.0),
    ],
)
def test_delay_doubles_from_the_first_restart_up_to_the_cap(
    backoff: Backoff, restart: int, seconds: float
) -> None:
    assert delay(backoff, restart) == seconds


def failed(counted: int, ago: float, restarts: int | None = None) -> TrainingRunStatus:
    """A status whose last failure was `ago` seconds before T0, `counted` restarts in a row."""
    last = FailureRecord(
        cause="Dead", step=10, time=T0 - timedelta(seconds=ago), attempt=1, message=""
    )
    return TrainingRunStatus(
        attempt=1,
        restarts=counted if restarts is None else restarts,
        backoff_restarts=counted,
        last_failure=last,
    )


@pytest.mark.parametrize(
    ("status", "left"),
    [
        (TrainingRunStatus(), 0.0),  # never failed
        (failed(1, 0), 5.0),
        (failed(1, 2), 3.0),
        (failed(1, 7), 0.0),  # waited already
        (failed(3, 5), 15.0),  # third restart: 20 s
        (failed(0, 0), 0.0),  # failure recorded as Failed: no restart to wait for
        # Restarts before the back-off last started over add nothing: the first delay again.
        (failed(1, 0, restarts=7), 5.0),
    ],
)
def test_remaining_counts_from_the_recorded_failure(status: TrainingRunStatus, left: float) -> None:
    assert remaining(status, FIVE_TO_300, T0) == pytest.approx(left)


RESCHEDULE = Decision(3, create=True, cause=Reason.RESCHEDULING)


@pytest.mark.parametrize(
    ("decision", "status", "attempt", "create", "wait"),
    [
        # A rescheduled attempt waits while the back-off runs: the current attempt stays.
        (RESCHEDULE, failed(2, 1), 2, False, 9.0),
        (RESCHEDULE, failed(2, 30), 3, True, 0.0),
        # First pods, resumes and spec changes are never held.
        (Decision(1, create=True, cause=Reason.CREATED), failed(2, 1), 1, True, 0.0),
        (Decision(3, create=True, cause=Reason.SPEC_CHANGED), failed(2, 1), 3, True, 0.0),
        (Decision(3, create=True, cause=Reason.RESUMED), failed(2, 1), 3, True, 0.0),
        # Nothing to create: nothing to hold.
        (Decision(2, cause=Reason.RESCHEDULING), failed(2, 1), 2, False, 0.0),
    ],
)
def test_hold_keeps_a_rescheduled_attempt_back_until_the_delay_passed(
    decision: Decision, status: TrainingRunStatus, attempt: int, create: bool, wait: float
) -> None:
    held, left = hold(decision, status, FIVE_TO_300, T0)
    assert (held.attempt, held.create) == (attempt, create)
    assert left == pytest.approx(wait)


def moved_off(counted: int, cause: str, excluded: str | None) -> TrainingRunStatus:
    """A failure on node-a a second before T0, with `excluded` in the excluded nodes."""
    status = failed(counted, 1)
    assert status.last_failure is not None
    last = status.last_failure.model_copy(update={"cause": cause, "node": "node-a"})
    nodes = [] if excluded is None else [ExcludedNode(node=excluded, reason=cause, time=T0)]
    return status.model_copy(update={"last_failure": last, "excluded_nodes": nodes})


@pytest.mark.parametrize(
    ("status", "create", "wait"),
    [
        # The first move off the node the failure excluded is created at once...
        (moved_off(1, "GhostMemory", "node-a"), True, 0.0),
        (moved_off(1, "LeaseExpired", "node-a"), True, 0.0),
        # ... a second failure in a row waits as usual (the second delay, 10 s, less 1 s),
        (moved_off(2, "GhostMemory", "node-a"), False, 9.0),
        # and so does a reschedule that keeps the node, or leaves one excluded long ago.
        (moved_off(1, "LeaseExpired", None), False, 4.0),
        (moved_off(1, "GhostMemory", "node-b"), False, 4.0),
    ],
)
def test_the_first_move_off_a_node_its_failure_excluded_is_not_held(
    status: TrainingRunStatus, create: bool, wait: float
) -> None:
    held, left = hold(RESCHEDULE, status, FIVE_TO_300, T0)
    assert held.create is create
    assert left == pytest.approx(wait)


@pytest.mark.parametrize(
    ("status", "counted"),
    [
        (TrainingRunStatus(), 0),  # never failed
        # The third restart waited 20 s: the run restarted 20 s after the failure, and it
        # starts over once it then ran resetAfterSeconds (600) before failing again...
        (failed(3, 20 + 600), 0),
        (failed(3, 20 + 6000), 0),
        # ... not a second earlier, and never for a run of many restarts that keeps failing.
        (failed(3, 20 + 599), 3),
        (failed(3, 1), 3),
        (failed(9, 300 + 599, restarts=40), 9),
        (failed(9, 300 + 600, restarts=40), 0),
    ],
)
def test_the_back_off_starts_over_after_the_run_ran_reset_after_seconds(
    status: TrainingRunStatus, counted: int
) -> None:
    assert streak(status, FIVE_TO_300, T0) == counted


def test_reset_after_seconds_is_the_runs_own() -> None:
    quick = Backoff(initial_seconds=5, max_seconds=300, reset_after_seconds=60)
    assert streak(failed(2, 10 + 60), quick, T0) == 0
    assert streak(failed(2, 10 + 60), FIVE_TO_300, T0) == 2
