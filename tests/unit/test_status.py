"""Status arithmetic: conditions, transition times, the derived phase, events, one write."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from trainguard.api import Condition, TrainingRunStatus
from trainguard.api.constants import (
    CheckResult,
    ConditionStatus,
    FoundBy,
    Phase,
    StagingPhase,
    Verdict,
)
from trainguard.api.status import (
    InvalidCheckpoint,
    InvalidCheckpointCount,
    LayerCheckpoint,
    Preflight,
    Staging,
)
from trainguard.operator.conditions import (
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
    step_conditions,
    step_events,
    transition_events,
)
from trainguard.operator.policies import initsteps
from trainguard.operator.policies.lifecycle import PodView
from trainguard.operator.policies.signals import LeaseView

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


def test_a_new_attempt_starts_without_the_previous_attempts_verdict() -> None:
    backup = LayerCheckpoint(layer="backup", step=1100, verified=True)
    old = TrainingRunStatus(
        attempt=1,
        verdict=Verdict.GHOST_MEMORY,
        step=1200,
        checkpoint_step=1150,
        checkpoints=[backup],
    )
    scheduling = RunState("Scheduling", "created pod llm-2 (attempt 2)", progressing=True)
    moved = advance(old, scheduling, Observed(attempt=2), 1, T0)
    assert moved.verdict is None
    assert "verdict" not in moved.to_object()
    # The run's progress is not the pod's: it carries over to the new attempt.
    assert (moved.step, moved.checkpoint_step, moved.checkpoints) == (1200, 1150, [backup])
    # Until the new agent renews the Lease, cycles of the new attempt keep no verdict.
    assert advance(moved, scheduling, Observed(attempt=2), 1, T1).verdict is None
    renewed = advance(moved, TRAINING, Observed(attempt=2, verdict=Verdict.HEALTHY), 1, T1)
    assert renewed.verdict is Verdict.HEALTHY


def test_the_verdict_stays_within_an_attempt_between_renewals() -> None:
    old = TrainingRunStatus(attempt=2, verdict=Verdict.SLOW)
    assert advance(old, TRAINING, Observed(attempt=2), 1, T0).verdict is Verdict.SLOW


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


# ----- init steps: Preflight and DataStaged ------------------------------------------------

PASSED = Preflight(
    attempt=2,
    node="node-b",
    passed=True,
    write_mbps=850.5,
    read_mbps=1200.0,
    free_bytes=100 * 2**30,
    need_bytes=3 * 2**30,
    gpu=CheckResult.PASS,
    gpu_used_mib=0.0,
    gpu_total_mib=143771.0,
    message="every check passed",
)
FAILED = Preflight(
    attempt=1,
    node="node-a",
    passed=False,
    failure="StorageCorrupt",
    write_mbps=80.0,
    read_mbps=600.0,
    message="integrity l1: read back with another hash: the disk corrupts data",
)


def staging_at(phase: StagingPhase, done: int, **more: object) -> Staging:
    return Staging.model_validate(
        {
            "attempt": 2,
            "phase": phase,
            "files_done": done,
            "files_total": 200,
            "bytes_done": done * 2**20,
            "bytes_total": 200 * 2**20,
            "bytes_per_second": 50e6,
            "eta_seconds": (200 - done) * 2**20 / 50e6,
            **more,
        }
    )


@pytest.mark.parametrize(
    ("preflight", "staging", "expected"),
    [
        (
            PASSED,
            None,
            {
                "Preflight": (
                    TRUE,
                    "PreflightPassed",
                    "passed (attempt 2 on node-b): write 850.5 MB/s, read 1200 MB/s; "
                    "100.0 GiB free, 3.0 GiB needed; GPU check pass (0 of 143771 MiB used)",
                )
            },
        ),
        (
            FAILED,
            None,
            {
                "Preflight": (
                    FALSE,
                    "PreflightFailed",
                    "StorageCorrupt (attempt 1 on node-a): integrity l1: read back with another "
                    "hash: the disk corrupts data; write 80 MB/s, read 600 MB/s",
                )
            },
        ),
        (
            None,
            staging_at(StagingPhase.COPYING, 50),
            {
                "DataStaged": (
                    FALSE,
                    "StagingData",
                    "copying (attempt 2): 50/200 files, 50.0 MiB of 200.0 MiB (25%), "
                    "50.0 MB/s, ETA 3 s",
                )
            },
        ),
        (
            None,
            staging_at(StagingPhase.COMPLETE, 200, copied=199, recopies=1),
            {
                "DataStaged": (
                    TRUE,
                    "DataStaged",
                    "verified (attempt 2): 200/200 files, 200.0 MiB of 200.0 MiB (100%), "
                    "50.0 MB/s; copied 199, re-copied 1",
                )
            },
        ),
        (
            None,
            staging_at(StagingPhase.SKIPPED, 200),
            {
                "DataStaged": (
                    TRUE,
                    "DataStagingSkipped",
                    "already staged and verified here (attempt 2): 200/200 files, 200.0 MiB of "
                    "200.0 MiB (100%), 50.0 MB/s",
                )
            },
        ),
        (
            None,
            staging_at(StagingPhase.FAILED, 7, message="shard-7: no answer within 60 s"),
            {
                "DataStaged": (
                    FALSE,
                    "StagingFailed",
                    "failed (attempt 2): shard-7: no answer within 60 s; 7/200 files, 7.0 MiB of "
                    "200.0 MiB (4%), 50.0 MB/s",
                )
            },
        ),
        (None, None, {}),
    ],
    ids=["passed", "failed", "copying", "complete", "skipped", "staging-failed", "none"],
)
def test_step_conditions_carry_the_figures(
    preflight: Preflight | None,
    staging: Staging | None,
    expected: dict[str, tuple[ConditionStatus, str, str]],
) -> None:
    conditions = step_conditions([], preflight, staging, 3, T0)
    assert {c.type: (c.status, c.reason, c.message) for c in conditions} == expected
    assert all(c.observed_generation == 3 for c in conditions)


def test_advance_keeps_the_step_reports_until_new_ones_come() -> None:
    state = RunState("Training", "running", ready=True, progressing=True)
    first = advance(TrainingRunStatus(), state, Observed(attempt=2, preflight=PASSED), 1, T0)
    assert first.preflight == PASSED
    assert find(first.conditions, "Preflight") is not None
    again = advance(first, state, Observed(attempt=2), 1, T1)
    assert again.preflight == PASSED and not changed(first, again)


def test_the_last_invalid_checkpoint_stays_and_the_counts_are_the_current_attempts() -> None:
    state = RunState("Training", "running", ready=True, progressing=True)
    last = InvalidCheckpoint(
        layer="backup", step=142, reason="missing", found=FoundBy.SHIPPING, time=T0, attempt=1
    )
    counts = (InvalidCheckpointCount(layer="backup", attempt=1, count=3),)
    told = Observed(attempt=1, invalid_counts=counts, last_invalid=last)
    first = advance(TrainingRunStatus(), state, told, 1, T0)
    assert (first.last_invalid_checkpoint, first.invalid_checkpoints) == (last, list(counts))
    # Not renewed yet by attempt 2's agent: the status keeps what it holds.
    moved = advance(first, state, Observed(attempt=2), 1, T1)
    assert (moved.last_invalid_checkpoint, moved.invalid_checkpoints) == (last, list(counts))
    # Attempt 2's agent found nothing: its counts are none; the last finding stays.
    clean = advance(moved, state, Observed(attempt=2, invalid_counts=()), 1, T1)
    assert (clean.last_invalid_checkpoint, clean.invalid_checkpoints) == (last, [])


def test_step_events_tell_each_outcome_once_per_attempt() -> None:
    empty = TrainingRunStatus()
    copying = empty.model_copy(update={"staging": staging_at(StagingPhase.COPYING, 10)})
    further = empty.model_copy(update={"staging": staging_at(StagingPhase.COPYING, 90)})
    staged = empty.model_copy(
        update={"staging": staging_at(StagingPhase.COMPLETE, 200), "preflight": PASSED}
    )
    assert [e.reason for e in step_events(empty, copying)] == ["StagingData"]
    assert step_events(copying, further) == []  # progress is in the condition, not in Events
    assert [(e.reason, e.warning) for e in step_events(further, staged)] == [
        ("PreflightPassed", False),
        ("DataStaged", False),
    ]
    assert step_events(staged, staged) == []
    # A failed preflight is told by the failure path (PreflightFailed with its evidence).
    assert step_events(empty, empty.model_copy(update={"preflight": FAILED})) == []
    failed = empty.model_copy(update={"staging": staging_at(StagingPhase.FAILED, 7)})
    assert [(e.reason, e.warning) for e in step_events(copying, failed)] == [
        ("StagingFailed", True)
    ]
    # The next attempt staging again is a new story.
    next_attempt = staging_at(StagingPhase.COPYING, 0).model_copy(update={"attempt": 3})
    again = [
        e.reason for e in step_events(staged, empty.model_copy(update={"staging": next_attempt}))
    ]
    assert again == ["StagingData"]


# ----- where the reports come from: Lease annotations, termination messages ------------------


def test_a_summary_parses_into_the_status_model_and_junk_reads_as_none() -> None:
    text = json.dumps({**PASSED.to_object(), "futureKey": 1})
    assert initsteps.parse(Preflight, text) == PASSED
    for junk in (None, "", "not json", "[1]", '{"passed": "maybe"}', "{}"):
        assert initsteps.parse(Preflight, junk) is None, junk


def test_reports_speak_for_the_current_attempt_and_a_final_one_wins() -> None:
    live = json.dumps(staging_at(StagingPhase.COPYING, 10).to_object())
    final = json.dumps(staging_at(StagingPhase.COMPLETE, 200).to_object())
    lease = LeaseView(holder="llm-2", preflight=json.dumps(PASSED.to_object()), staging=live)
    pod = PodView("llm-2", 2, staging_report=final)
    preflight, staging = initsteps.reports("llm", 2, None, lease)
    assert (preflight, staging and staging.phase) == (PASSED, StagingPhase.COPYING)
    assert initsteps.reports("llm", 2, pod, lease)[1] == staging_at(StagingPhase.COMPLETE, 200)
    # The Lease of an earlier pod, or a pod of another attempt, speaks for nothing.
    assert initsteps.reports("llm", 3, pod, lease) == (None, None)
    status = TrainingRunStatus(attempt=2)
    assert initsteps.news("llm", lease, status)
    caught_up = status.model_copy(
        update={"preflight": PASSED, "staging": staging_at(StagingPhase.COPYING, 10)}
    )
    assert not initsteps.news("llm", lease, caught_up)
    assert not initsteps.news("llm", lease, TrainingRunStatus(attempt=3))
