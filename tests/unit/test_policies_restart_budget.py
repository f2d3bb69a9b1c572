"""The restart budget counts failures without progress; the back-off starts over after a while.

Each failure goes the way a reconcile cycle takes it: `detect` on the pod's Lease, the
ladder's decision on `history`, then `record` into the status the next failure starts from.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainguard.api import TrainingRunStatus
from trainguard.api.constants import Verdict
from trainguard.api.spec import Recovery
from trainguard.operator.policies import ladder
from trainguard.operator.policies.backoff import remaining
from trainguard.operator.policies.failures import Observation, detect, history, record
from trainguard.operator.policies.ladder import Action
from trainguard.operator.policies.lifecycle import PodView, given_up
from trainguard.operator.policies.signals import LeaseView

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = 3600.0
POD = PodView("llm-2", 2, phase="Running", node="gpu-a")
# Two restarts in a row without progress, each on the same node first.
TWO = Recovery.model_validate({"maxRestarts": 2, "inPlaceRestarts": 2})


def fail(
    status: TrainingRunStatus,
    at: float,
    step: int,
    saved: int | None,
    recovery: Recovery = TWO,
    via_lease: bool = True,
) -> tuple[ladder.Decision, TrainingRunStatus]:
    """The trainer dies `at` seconds after T0 at `step`; `saved`: the newest verified checkpoint.

    The run was Healthy since the last failure. `via_lease`: the newest checkpoint is on the
    failing pod's Lease only (the status still shows the one before); else in the status.
    """
    when = T0 + timedelta(seconds=at)
    before: dict[str, object] = {"verdict": Verdict.HEALTHY}
    if not via_lease:
        before["checkpoint_step"] = saved
    healthy = status.model_copy(update=before)
    view = LeaseView(
        Verdict.DEAD, step, saved if via_lease else None, "exit 1", when, 15, POD.name, since=when
    )
    found = detect(healthy, Observation(2, POD, view, True, when))
    assert found is not None and found.checkpoint_step == saved
    decision = ladder.decide(found.failure, history(healthy, found), recovery)
    return decision, record(healthy, found, decision, 2, 1, when, recovery.backoff)


@pytest.mark.parametrize("via_lease", [True, False])
def test_a_long_run_with_spaced_failures_and_progress_keeps_going(via_lease: bool) -> None:
    status = TrainingRunStatus(attempt=2)
    actions = []
    for day in range(12):  # a failure every 12 hours for six days, a newer checkpoint each time
        step = 10_000 * (day + 1)
        decision, status = fail(status, day * 12 * HOUR, step + 30, step, via_lease=via_lease)
        actions.append(decision.action)
        # Each counts as the first without progress, and waits the first delay only.
        assert (status.restarts_without_progress, status.backoff_restarts) == (1, 1)
        assert remaining(status, TWO.backoff, T0 + timedelta(seconds=day * 12 * HOUR)) == 5.0
    assert Action.FAIL not in actions
    assert status.restarts == 12  # every restart is still counted
    assert not given_up(status)


def test_failures_without_progress_stop_at_max_restarts() -> None:
    status = TrainingRunStatus(attempt=2)
    actions = []
    # Resumed from step 100 each time, dead before the next checkpoint: no progress.
    for at, step in [(0, 130), (30, 160), (60, 190)]:
        decision, status = fail(status, at, step, 100)
        actions.append(decision.action)
    assert actions == [Action.RESTART_IN_PLACE, Action.RESTART_IN_PLACE, Action.FAIL]
    assert decision.reason == "MaxRestartsExceeded"
    assert "2 restarts already without a newer verified checkpoint" in decision.message
    assert (status.restarts, status.restarts_without_progress) == (2, 2)
    assert given_up(status)


def test_the_budget_counts_from_the_last_progress() -> None:
    status = TrainingRunStatus(attempt=2)
    actions = []
    counted = []
    # Three failures each after a newer checkpoint, then the run stops getting anywhere.
    for at, saved in enumerate([100, 200, 300, 300, 300]):
        decision, status = fail(status, at * HOUR, saved + 30 + 40 * at, saved)
        actions.append(decision.action)
        counted.append(status.restarts_without_progress)
    assert actions[:4] == [Action.RESTART_IN_PLACE, Action.RESTART_IN_PLACE, Action.RESCHEDULE,
                           Action.RESTART_IN_PLACE]  # fmt: skip
    assert actions[4] is Action.FAIL  # the third restart in a row without progress
    assert counted == [1, 1, 1, 2, 2]
    assert status.restarts == 4


def test_a_first_failure_before_any_checkpoint_counts_and_a_checkpoint_then_is_progress() -> None:
    _, status = fail(TrainingRunStatus(attempt=2), 0, 20, None)
    assert status.restarts_without_progress == 1
    assert status.last_failure is not None and status.last_failure.checkpoint_step is None
    _, status = fail(status, 30, 40, None)
    assert status.restarts_without_progress == 2
    decision, status = fail(status, 60, 80, 50)  # the first checkpoint: progress
    assert decision.action is not Action.FAIL and status.restarts_without_progress == 1


def test_the_back_off_grows_while_failures_come_fast_and_starts_over_after_reset_after() -> None:
    recovery = Recovery.model_validate({"maxRestarts": 20, "inPlaceRestarts": 20})
    status = TrainingRunStatus(attempt=2)
    at, waits = 0.0, []
    for _ in range(4):  # a crash loop: each dies 10 s after its restart, with progress
        _, status = fail(status, at, int(at) + 1, int(at) + 1, recovery)
        wait = remaining(status, recovery.backoff, T0 + timedelta(seconds=at))
        waits.append(wait)
        at += wait + 10
    assert waits == [5.0, 10.0, 20.0, 40.0]
    # Ran 599 s after its last restart: not yet long enough, the delay doubles again.
    at += 599 - 10
    _, status = fail(status, at, int(at) + 1, int(at) + 1, recovery)
    assert status.backoff_restarts == 5
    assert remaining(status, recovery.backoff, T0 + timedelta(seconds=at)) == 80.0
    # Ran 600 s (resetAfterSeconds) after that restart: the first delay again.
    at += 80 + 600
    _, status = fail(status, at, int(at) + 1, int(at) + 1, recovery)
    assert status.backoff_restarts == 1
    assert remaining(status, recovery.backoff, T0 + timedelta(seconds=at)) == 5.0
    assert status.restarts == 6
