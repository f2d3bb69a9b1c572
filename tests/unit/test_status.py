"""Status arithmetic: conditions, transition times, the derived phase, events, one write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainguard.api import Condition, TrainingRunStatus
from trainguard.api.constants import ConditionStatus, Phase
from trainguard.status import (
    MAX_EVENT_BYTES,
    EventSpec,
    Observed,
    RunState,
    advance,
    changed,
    derive_phase,
    find,
    set_condition,
    shorten,
    transition_events,
)

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE


def test_set_condition_adds_then_keeps_the_transition_time_while_status_holds() -> None:
    conditions = set_condition([], "Ready", FALSE, "Scheduling", "waiting", 1, T0)
    assert [(c.type, c.status, c.last_transition_time) for c in conditions] == [
        ("Ready", FALSE, T0)
    ]
    same = set_condition(conditions, "Ready", FALSE, "Starting", "starting", 2, T1)
    assert same[0].last_transition_time == T0  # status unchanged: reason and message only
    assert (same[0].reason, same[0].message, same[0].observed_generation) == (
        "Starting",
        "starting",
        2,
    )
    moved = set_condition(same, "Ready", TRUE, "Training", "running", 2, T1)
    assert moved[0].last_transition_time == T1


def test_set_condition_leaves_other_types_alone() -> None:
    conditions = set_condition([], "Preflight", TRUE, "PreflightPassed", "", 1, T0)
    conditions = set_condition(conditions, "Ready", TRUE, "Training", "", 1, T1)
    assert [c.type for c in conditions] == ["Preflight", "Ready"]
    assert find(conditions, "Preflight") == find(
        set_condition([], "Preflight", TRUE, "PreflightPassed", "", 1, T0), "Preflight"
    )


def conditions_of(**truth: bool) -> list[Condition]:
    result: list[Condition] = []
    for kind, holds in truth.items():
        result = set_condition(result, kind, TRUE if holds else FALSE, "Why", "", 1, T0)
    return result


@pytest.mark.parametrize(
    ("truth", "phase"),
    [
        ({}, Phase.PENDING),
        ({"Ready": False, "Progressing": True}, Phase.PENDING),
        ({"Ready": True, "Progressing": True}, Phase.RUNNING),
        ({"Ready": False, "Degraded": True}, Phase.RECOVERING),
        ({"Ready": True, "Suspended": True}, Phase.SUSPENDED),
        ({"Complete": True, "Suspended": True}, Phase.COMPLETED),
        ({"Failed": True, "Complete": True}, Phase.FAILED),
    ],
)
def test_phase_is_derived_from_the_conditions(truth: dict[str, bool], phase: Phase) -> None:
    assert derive_phase(conditions_of(**truth)) is phase


TRAINING = RunState("Training", "pod llm-1 is running on node gpu-0", ready=True, progressing=True)


def test_advance_sets_every_standard_condition_and_the_observed_fields() -> None:
    new = advance(TrainingRunStatus(), TRAINING, Observed(1, "gpu-0", 0, started=True), 3, T0)
    assert {c.type: c.status for c in new.conditions} == {
        "Ready": TRUE,
        "Progressing": TRUE,
        "Degraded": FALSE,
        "Suspended": FALSE,
        "Complete": FALSE,
        "Failed": FALSE,
    }
    assert all(c.reason == "Training" and c.observed_generation == 3 for c in new.conditions)
    assert (new.phase, new.attempt, new.node, new.observed_generation) == (
        Phase.RUNNING,
        1,
        "gpu-0",
        3,
    )
    assert new.start_time == T0 and new.completion_time is None


def test_the_same_cycle_twice_writes_nothing_the_second_time() -> None:
    observed = Observed(1, "gpu-0", 0, started=True)
    first = advance(TrainingRunStatus(), TRAINING, observed, 1, T0)
    again = advance(first, TRAINING, observed, 1, T1)
    assert changed(TrainingRunStatus(), first)
    assert not changed(first, again)
    # Parsed back from the apiserver's JSON, it is still the same status.
    assert not changed(TrainingRunStatus.from_object(first.to_object()), again)


def test_start_and_completion_times_are_set_once() -> None:
    started = advance(TrainingRunStatus(), TRAINING, Observed(1, "n", 0, started=True), 1, T0)
    later = advance(started, TRAINING, Observed(1, "n", 0, started=True), 1, T1)
    assert later.start_time == T0
    done = advance(later, RunState("Completed", "done", complete=True), Observed(1), 1, T1)
    assert done.completion_time == T1 and done.phase is Phase.COMPLETED


def test_advance_keeps_fields_it_does_not_own() -> None:
    old = TrainingRunStatus(step=1200, checkpoint_step=1150)
    new = advance(old, TRAINING, Observed(1, "n"), 1, T0)
    assert (new.step, new.checkpoint_step) == (1200, 1150)


def test_events_follow_changes_of_the_states_reason() -> None:
    scheduling = RunState("Scheduling", "created pod llm-1", progressing=True)
    before = advance(TrainingRunStatus(), scheduling, Observed(1), 1, T0)
    assert transition_events(TrainingRunStatus(), scheduling) == [
        EventSpec("Scheduling", "created pod llm-1")
    ]
    assert transition_events(before, scheduling) == []
    unschedulable = RunState("Unschedulable", "no node", warning=True)
    assert transition_events(before, unschedulable) == [EventSpec("Unschedulable", "no node", True)]


@pytest.mark.parametrize("text", ["x" * 5000, "ü" * 5000, "volume /données/" * 400])
def test_event_messages_stay_under_one_kibibyte(text: str) -> None:
    [event] = transition_events(TrainingRunStatus(), RunState("Unschedulable", text))
    assert len(event.message.encode()) <= MAX_EVENT_BYTES < 1024
    assert event.message.endswith("...")
    assert shorten("short", 10) == "short"
