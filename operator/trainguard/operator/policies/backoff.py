"""Restart back-off, pure: how long a run waits before its next restart (`spec.recovery.backoff`).

The n-th restart waits `initialSeconds * 2^(n-1)`, capped at `maxSeconds`, where n counts
the restarts since the run last ran `resetAfterSeconds` after a restart before failing again
(`status.backoffRestarts`): like the kubelet's crash-loop back-off, a run that trained a while
starts over at the first delay instead of paying for every failure of its life. Both
restarts the operator makes and those the supervisor makes in place follow it: the
supervisor reads the run's `spec.recovery` from the env contract (`TRAINGUARD_RECOVERY`) and
waits the same delays between training processes, timing each process it ran; the operator
holds the next attempt of a rescheduled run until the delay since the recorded failure has
passed, and takes the run as restarted when the delay after its last failure ended.

One restart is no crash loop: the first of a streak that moves the run off the node its
failure excluded (ghost memory, stuck I/O, a lost node: `fresh_node_move`) is created at once.
The run leaves a sick node for a fresh one, which a delay would not make healthier; a second
failure in a row waits as usual (and the streak's reset is then counted from a restart taken
as later than it was: a conservative error of at most the first delay).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from trainguard.api import TrainingRunStatus
from trainguard.api.constants import Reason
from trainguard.api.spec import Backoff
from trainguard.operator.policies.lifecycle import Decision

# 2^62 seconds outlasts any cap: larger exponents add nothing but big integers.
MAX_EXPONENT = 62


def delay(backoff: Backoff, restart: int) -> float:
    """Seconds to wait before restart number `restart` (1-based); 0 for none."""
    if restart <= 0:
        return 0.0
    doubled = backoff.initial_seconds * 2 ** min(restart - 1, MAX_EXPONENT)
    return float(min(backoff.max_seconds, doubled))


def streak(status: TrainingRunStatus, backoff: Backoff, now: datetime) -> int:
    """Restarts the back-off counts before the one a failure at `now` asks for.

    The run restarted when the delay after its last failure ended; one that then ran
    `resetAfterSeconds` before this failure starts over (0). A hang counts as running until
    it is detected, as a crash loop's running time does for the kubelet.
    """
    last = status.last_failure
    if last is None:
        return 0
    restarted = last.time + timedelta(seconds=delay(backoff, status.backoff_restarts))
    if (now - restarted).total_seconds() >= backoff.reset_after_seconds:
        return 0
    return status.backoff_restarts


def remaining(status: TrainingRunStatus, backoff: Backoff, now: datetime) -> float:
    """Seconds still to wait before the restart that follows the recorded failure."""
    last = status.last_failure
    if last is None:
        return 0.0
    waited = (now - last.time).total_seconds()
    return max(0.0, delay(backoff, status.backoff_restarts) - waited)


def fresh_node_move(status: TrainingRunStatus) -> bool:
    """Whether the next restart is its streak's first and leaves the node its failure excluded."""
    last = status.last_failure
    if last is None or last.node is None or status.backoff_restarts > 1:
        return False
    return any(excluded.node == last.node for excluded in status.excluded_nodes)


def hold(
    decision: Decision, status: TrainingRunStatus, backoff: Backoff, now: datetime
) -> tuple[Decision, float]:
    """The decision with a rescheduled attempt held back while the back-off runs.

    Returns the decision to act on and the seconds left (0: act now). Only the ladder's
    reschedules wait, and not the first move off a node the failure excluded: a first pod, a
    resume or a spec change is created at once.
    """
    if not decision.create or decision.cause is not Reason.RESCHEDULING:
        return decision, 0.0
    if fresh_node_move(status):
        return decision, 0.0
    wait = remaining(status, backoff, now)
    if wait <= 0:
        return decision, 0.0
    previous = (decision.attempt or 1) - 1 or None
    return replace(decision, attempt=previous, create=False), wait
