"""Failures of a run's current attempt, pure: observations -> a new Failure -> its record.

`detect` finds a new failure in what the cycle observed; `record` writes the ladder's
decision about it into the status.

A failure is one of (first match wins):
- the preflight init step exited 10-13 (a node problem): `PreflightFailed`;
- the pod failed (the supervisor gave up, or an init step failed), unless `stage-data` could
  not read the data source (bad input, `policies.inputs`: no new attempt): `PodFailed`;
- the agent of the current pod renews the Lease with a failure verdict (`Dead`, `Hung`,
  `GhostMemory`, `IOStuck`), or with the narrower cause its evidence names
  (`GPUMemoryNotReleased`, a GhostMemory verdict: memory a death left, still held);
- the current pod's Lease expired and its node is NotReady or gone: `LeaseExpired`.

It is new unless `status.lastFailure` already records it (same attempt and cause, and for a
verdict, the status still shows that verdict and it began at the recorded time: a verdict
that went back to Healthy and turns to a failure again is a new failure, even when both
changes fell between two cycles — the agent's `verdict-since` tells them apart). The record
and the status's verdict are written in the same status write, so an operator restarted
anywhere never counts a failure twice.

Progress is a verified checkpoint newer than the newest there was at the previous failure
(`lastFailure.checkpointStep`): a failure after progress starts `restartsWithoutProgress`,
the count `recovery.maxRestarts` bounds, over at one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from trainguard.api import TrainingRunStatus
from trainguard.api.constants import ConditionStatus, ConditionType, Reason, Verdict
from trainguard.api.spec import Backoff
from trainguard.api.status import ExcludedNode
from trainguard.api.status import Failure as FailureRecord
from trainguard.operator.conditions import derive_phase, set_condition
from trainguard.operator.policies import inputs, ladder
from trainguard.operator.policies.backoff import streak
from trainguard.operator.policies.ladder import Action, Failure, History
from trainguard.operator.policies.lifecycle import PodView
from trainguard.operator.policies.signals import (
    FAILURE_VERDICTS,
    NARROWED_CAUSES,
    LeaseView,
    expired,
    expiry,
    failure_cause,
    same_failure,
)

# Exit codes of the preflight step that name a node problem (storage corrupt or failing,
# insufficient space, GPU memory held, storage slow).
PREFLIGHT_NODE_EXITS = range(10, 14)


@dataclass(frozen=True)
class Observation:
    """What one cycle saw of the current attempt."""

    attempt: int | None
    pod: PodView | None
    lease: LeaseView | None
    node_ready: bool | None = True  # None: the node is gone
    now: datetime | None = None


@dataclass(frozen=True)
class Found:
    """A new failure, with what the status records about it."""

    failure: Failure
    node: str | None
    message: str
    since: datetime | None = None  # when the agent's failure verdict began
    # When the failure was first seen, where a clock says so: the agent's verdict start
    # (`verdict-since`), a Lease's expiry. None for a pod's failure (`detection_seconds`).
    began: datetime | None = None
    checkpoint_step: int | None = None  # the newest verified checkpoint when it was seen


def _cause(seen: Observation) -> tuple[str, str, datetime | None] | None:
    pod, lease = seen.pod, seen.lease
    if pod is None or pod.deleting or inputs.source_failed(pod):
        return None  # bad input is not a failure another attempt fixes (`policies.inputs`)
    if pod.preflight_exit in PREFLIGHT_NODE_EXITS:
        message = pod.message or f"preflight exited {pod.preflight_exit}"
        return Reason.PREFLIGHT_FAILED, message, None
    if pod.phase == "Failed":
        return Reason.POD_FAILED, pod.message or f"pod {pod.name} failed", None
    if lease is None or lease.holder != pod.name:
        return None  # the Lease still speaks of an earlier pod
    cause = failure_cause(lease)
    if cause is not None:
        return cause, lease.evidence, lease.since
    if seen.now is not None and expired(lease, seen.now) and seen.node_ready is not True:
        message = f"Lease not renewed since {lease.renewed}; node not Ready"
        return Reason.LEASE_EXPIRED, message, expiry(lease)
    return None


def detect(status: TrainingRunStatus, seen: Observation) -> Found | None:
    """The new failure of the current attempt, or None (none, or already handled)."""
    found = _cause(seen)
    if found is None or seen.pod is None:
        return None
    cause, message, began = found
    last = status.last_failure
    handled = last is not None and last.attempt == seen.attempt and last.cause == cause
    since = seen.lease.since if seen.lease is not None and cause in FAILURE_VERDICTS else None
    if handled and last is not None and cause in FAILURE_VERDICTS:
        # The verdict's start tells a new failure from the one recorded, even when the
        # Healthy in between came and went between two cycles.
        handled = status.verdict == cause and same_failure(last.since, since)
    if handled:
        return None
    step = seen.lease.step if seen.lease is not None else status.step
    failure = Failure(str(cause), step, seen.node_ready)
    return Found(failure, seen.pod.node, message, since, began, newest_checkpoint(status, seen))


def newest_checkpoint(status: TrainingRunStatus, seen: Observation) -> int | None:
    """The run's newest verified checkpoint step: the status's, or newer on the pod's Lease."""
    lease, pod = seen.lease, seen.pod
    steps = [status.checkpoint_step]
    if lease is not None and pod is not None and lease.holder == pod.name:
        steps.append(lease.saved_step)  # the status takes it only at the end of the cycle
    return max((step for step in steps if step is not None), default=None)


def progressed(last: FailureRecord | None, checkpoint: int | None) -> bool:
    """Whether `checkpoint` is newer than the newest verified one at the last failure."""
    if checkpoint is None:
        return False
    return last is None or last.checkpoint_step is None or checkpoint > last.checkpoint_step


def detection_seconds(found: Found, written: datetime) -> float | None:
    """Seconds from the failure's first sight to the status write that recorded it.

    The start is the agent's clock (its verdict start, the renewal a Lease's expiry counts
    from), the write the operator's: a skew that puts the start after the write reads 0.
    None when no clock says when the failure began (a failed pod).
    """
    if found.began is None:
        return None
    return max((written - found.began).total_seconds(), 0.0)


def history(status: TrainingRunStatus, found: Found | None = None) -> History:
    """What the ladder needs from the status.

    Restarts without progress start over when `found` comes after a verified checkpoint newer
    than the last failure's (`progressed`).
    A node cause found on the attempt whose software death was the last failure (memory the
    dead trainer left behind, seen once it was restarted in place) is that death's aftermath,
    not a second failure at the same step: it does not count toward `RepeatedFailureAtStep`.
    """
    last = status.last_failure
    step = last.step if last else None
    if (
        last is not None
        and found is not None
        and last.attempt == status.attempt
        and last.cause in ladder.SOFTWARE_CAUSES
        and found.failure.cause in ladder.NODE_CAUSES
    ):
        step = None
    counted = status.restarts_without_progress
    if found is not None and progressed(last, found.checkpoint_step):
        counted = 0
    return History(counted, status.in_place_restarts, step)


def record(
    status: TrainingRunStatus,
    found: Found,
    decision: ladder.Decision,
    attempt: int | None,
    generation: int | None,
    now: datetime,
    backoff: Backoff,
) -> TrainingRunStatus:
    """The status with the failure and the ladder's decision recorded (before the cycle's state).

    A reschedule carries `Rescheduling` as the state's reason, so the wait for the old pod
    and the next attempt are reported as such; a failure sets the terminal `Failed`. A
    restart counts in `restarts`, in `restartsWithoutProgress` (`history`) and in
    `backoffRestarts` (`backoff.streak`: the run's `backoff` says when the count starts over).
    """
    failure = found.failure
    conditions = list(status.conditions)
    if decision.repeated:
        conditions = set_condition(
            conditions,
            ConditionType.REPEATED_FAILURE_AT_STEP,
            ConditionStatus.TRUE,
            Reason.REPEATED_FAILURE_AT_STEP,
            decision.message,
            generation,
            now,
        )
    state = {
        Action.RESCHEDULE: (ConditionType.PROGRESSING, ConditionStatus.TRUE),
        Action.FAIL: (ConditionType.FAILED, ConditionStatus.TRUE),
    }.get(decision.action)
    if state is not None:
        kind, truth = state
        conditions = set_condition(
            conditions, kind, truth, decision.reason, decision.message, generation, now
        )
    excluded = list(status.excluded_nodes)
    if decision.taint_node and found.node and all(e.node != found.node for e in excluded):
        excluded.append(ExcludedNode(node=found.node, reason=failure.cause, time=now))
    in_place = decision.action is Action.RESTART_IN_PLACE
    restarted = decision.action is not Action.FAIL
    return status.model_copy(
        update={
            # Written before the cycle's state (crash safety): the phase must already agree
            # with the conditions, as Argo CD and `kubectl get` may read this status.
            "phase": derive_phase(conditions),
            "conditions": conditions,
            "excluded_nodes": excluded,
            "restarts": status.restarts + restarted,
            "in_place_restarts": status.in_place_restarts + 1 if in_place else 0,
            "restarts_without_progress": (
                history(status, found).restarts_without_progress + restarted
            ),
            "backoff_restarts": streak(status, backoff, now) + restarted,
            "last_failure": FailureRecord(
                cause=failure.cause,
                step=failure.step,
                time=now,
                node=found.node,
                attempt=attempt,
                message=found.message,
                since=found.since,
                checkpoint_step=found.checkpoint_step,
            ),
            "verdict": Verdict(failure.cause)
            if failure.cause in set(Verdict)
            else NARROWED_CAUSES.get(failure.cause, status.verdict),
        }
    )
