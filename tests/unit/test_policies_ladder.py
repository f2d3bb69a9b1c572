"""The escalation ladder, one row per rung."""

from __future__ import annotations

import pytest

from trainguard.api.spec import Recovery
from trainguard.operator.policies.ladder import Action, Failure, History, decide, is_repeated

pytestmark = pytest.mark.unit

R = Recovery.model_validate(
    {"inPlaceRestarts": 2, "maxRestarts": 5, "sameStepWindow": 10, "onRepeatedFailure": "Stop"}
)
CONTINUE = R.model_copy(update={"on_repeated_failure": "Continue"})
FRESH = History(restarts_without_progress=0, in_place_restarts=0, last_failure_step=None)

CASES = [
    # (name, failure, history, recovery, action, taint, reason)
    (
        "dead, first time",
        Failure("Dead", 100, True),
        FRESH,
        R,
        Action.RESTART_IN_PLACE,
        False,
        "RestartingInPlace",
    ),
    (
        "hung, first time",
        Failure("Hung", 100, True),
        FRESH,
        R,
        Action.RESTART_IN_PLACE,
        False,
        "RestartingInPlace",
    ),
    (
        "dead, in-place budget spent",
        Failure("Dead", 100, True),
        History(2, 2, 10),
        R,
        Action.RESCHEDULE,
        False,
        "Rescheduling",
    ),
    (
        "ghost memory",
        Failure("GhostMemory", 100, True),
        FRESH,
        R,
        Action.RESCHEDULE,
        True,
        "Rescheduling",
    ),
    ("io stuck", Failure("IOStuck", 100, True), FRESH, R, Action.RESCHEDULE, True, "Rescheduling"),
    (
        "memory not released",
        Failure("GPUMemoryNotReleased", 100, True),
        FRESH,
        R,
        Action.RESCHEDULE,
        True,
        "Rescheduling",
    ),
    (
        "preflight failed",
        Failure("PreflightFailed", None, True),
        FRESH,
        R,
        Action.RESCHEDULE,
        True,
        "Rescheduling",
    ),
    (
        "lease expired, node NotReady",
        Failure("LeaseExpired", 100, False),
        FRESH,
        R,
        Action.RESCHEDULE,
        True,
        "Rescheduling",
    ),
    (
        "lease expired, node gone",
        Failure("LeaseExpired", 100, None),
        FRESH,
        R,
        Action.RESCHEDULE,
        True,
        "Rescheduling",
    ),
    (
        "lease expired, node Ready",
        Failure("LeaseExpired", 100, True),
        FRESH,
        R,
        Action.RESCHEDULE,
        False,
        "Rescheduling",
    ),
    (
        "pod failed",
        Failure("PodFailed", 100, True),
        FRESH,
        R,
        Action.RESCHEDULE,
        False,
        "Rescheduling",
    ),
    (
        "same step twice, stop",
        Failure("Dead", 322, True),
        History(1, 1, 320),
        R,
        Action.FAIL,
        False,
        "RepeatedFailureAtStep",
    ),
    (
        "same step twice, continue",
        Failure("Dead", 322, True),
        History(1, 1, 320),
        CONTINUE,
        Action.RESTART_IN_PLACE,
        False,
        "RestartingInPlace",
    ),
    (
        "far apart steps",
        Failure("Dead", 500, True),
        History(1, 1, 322),
        R,
        Action.RESTART_IN_PLACE,
        False,
        "RestartingInPlace",
    ),
    (
        "max restarts reached",
        Failure("Dead", 900, True),
        History(5, 0, 100),
        R,
        Action.FAIL,
        False,
        "MaxRestartsExceeded",
    ),
    (
        # maxRestarts bounds the restarts in a row without progress, not those of the run's life.
        "one short of max restarts without progress",
        Failure("Dead", 900, True),
        History(4, 0, 100),
        R,
        Action.RESTART_IN_PLACE,
        False,
        "RestartingInPlace",
    ),
    (
        "ghost memory past max restarts",
        Failure("GhostMemory", 900, True),
        History(5, 0, 100),
        R,
        Action.FAIL,
        False,
        "MaxRestartsExceeded",
    ),
]


@pytest.mark.parametrize(
    ("name", "failure", "history", "recovery", "action", "taint", "reason"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_ladder(
    name: str,
    failure: Failure,
    history: History,
    recovery: Recovery,
    action: Action,
    taint: bool,
    reason: str,
) -> None:
    decision = decide(failure, history, recovery)
    assert (decision.action, decision.taint_node, decision.reason) == (action, taint, reason)
    assert failure.cause in decision.message


def test_repeated_rule_needs_both_steps_and_a_window() -> None:
    assert is_repeated(Failure("Dead", 322, True), History(1, 1, 322), 0) is False
    assert is_repeated(Failure("Dead", None, True), History(1, 1, 322), 10) is False
    assert is_repeated(Failure("Dead", 332, True), History(1, 1, 322), 10) is True
    assert is_repeated(Failure("Dead", 333, True), History(1, 1, 322), 10) is False
