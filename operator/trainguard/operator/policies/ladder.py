"""The escalation ladder (pure): a failure observed -> the action the operator takes.

- Dead or Hung on a healthy node: restart in place (the supervisor restarts the trainer; the
  agent kills a hung one first), up to `recovery.inPlaceRestarts`; then reschedule.
- GhostMemory, IOStuck, GPU memory not released, preflight failed, or the Lease expired with
  the node NotReady or gone: taint the node, exclude it, reschedule elsewhere.
- The Lease expired on a Ready node, or the pod failed (the supervisor gave up): reschedule,
  keeping the node.
- A failure within `recovery.sameStepWindow` steps of the previous one: condition
  RepeatedFailureAtStep, then stop or continue per `recovery.onRepeatedFailure`.
- More than `recovery.maxRestarts` restarts in a row without progress (no verified checkpoint
  newer than the one of the previous failure): Failed. A run that keeps saving newer
  checkpoints between its failures keeps going however many it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from trainguard.api.constants import OnRepeatedFailure, Reason, Verdict
from trainguard.api.spec import Recovery


class Action(StrEnum):
    """What the operator does about a failure."""

    RESTART_IN_PLACE = "RestartInPlace"
    RESCHEDULE = "Reschedule"
    FAIL = "Fail"


# Causes that say the node itself is sick: the run must leave it and never come back.
NODE_CAUSES = frozenset(
    {
        Verdict.GHOST_MEMORY.value,
        Verdict.IO_STUCK.value,
        Reason.GPU_MEMORY_NOT_RELEASED.value,
        Reason.PREFLIGHT_FAILED.value,
        Reason.NODE_LOST.value,
    }
)
SOFTWARE_CAUSES = frozenset({Verdict.DEAD.value, Verdict.HUNG.value})


@dataclass(frozen=True)
class Failure:
    """One failure as observed: its cause (a verdict or a reason) and where it happened."""

    cause: str
    step: int | None
    node_ready: bool | None  # None: the node is gone


@dataclass(frozen=True)
class History:
    """What the run's status remembers of earlier failures."""

    restarts_without_progress: int  # before this failure; 0 when it made progress since the last
    in_place_restarts: int
    last_failure_step: int | None


@dataclass(frozen=True)
class Decision:
    """The ladder's answer."""

    action: Action
    taint_node: bool
    reason: str
    message: str
    repeated: bool


def is_repeated(failure: Failure, history: History, window: int) -> bool:
    """Twice in the same place is a pattern: a failure within `window` steps of the last."""
    if window <= 0 or failure.step is None or history.last_failure_step is None:
        return False
    return abs(failure.step - history.last_failure_step) <= window


def decide(failure: Failure, history: History, recovery: Recovery) -> Decision:
    """Choose the action for one failure."""
    repeated = is_repeated(failure, history, recovery.same_step_window)
    where = f"at step {failure.step}" if failure.step is not None else "before any step"
    if history.restarts_without_progress + 1 > recovery.max_restarts:
        return Decision(
            Action.FAIL,
            False,
            Reason.MAX_RESTARTS_EXCEEDED,
            f"{failure.cause} {where}: {history.restarts_without_progress} restarts already "
            f"without a newer verified checkpoint, maxRestarts is {recovery.max_restarts}",
            repeated,
        )
    if repeated and recovery.on_repeated_failure is OnRepeatedFailure.STOP:
        return Decision(
            Action.FAIL,
            False,
            Reason.REPEATED_FAILURE_AT_STEP,
            f"{failure.cause} {where}, within {recovery.same_step_window} steps of the previous "
            f"failure (step {history.last_failure_step}): a pattern, not bad luck; stopping",
            repeated,
        )
    node_sick = failure.cause in NODE_CAUSES or (
        failure.cause == Reason.LEASE_EXPIRED and failure.node_ready is not True
    )
    if node_sick:
        return Decision(
            Action.RESCHEDULE,
            True,
            Reason.RESCHEDULING,
            f"{failure.cause} {where}: the node is unhealthy; excluding it and moving the run",
            repeated,
        )
    if failure.cause in SOFTWARE_CAUSES and history.in_place_restarts < recovery.in_place_restarts:
        return Decision(
            Action.RESTART_IN_PLACE,
            False,
            Reason.RESTARTING_IN_PLACE,
            f"{failure.cause} {where}: restart in place "
            f"{history.in_place_restarts + 1}/{recovery.in_place_restarts}, resume from L1",
            repeated,
        )
    return Decision(
        Action.RESCHEDULE,
        False,
        Reason.RESCHEDULING,
        f"{failure.cause} {where}: restarting on a fresh pod",
        repeated,
    )
