"""The agent's signals, pure: what the run's heartbeat Lease says, and what the status takes.

The agent renews `<run>-heartbeat` with its verdict, the trainer's step, the newest saved
step and compact evidence. The operator copies verdict and steps into the status every
cycle, and a change to a failure verdict starts a cycle at once (so that a death is in the
status within about a second instead of at the next resync).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from trainguard.api import TrainingRunStatus
from trainguard.api.constants import Reason, Verdict
from trainguard.api.status import LayerCheckpoint
from trainguard.operator.build.names import pod_name

# Verdicts that are failures: the ladder acts on them.
FAILURE_VERDICTS = frozenset({Verdict.DEAD, Verdict.HUNG, Verdict.GHOST_MEMORY, Verdict.IO_STUCK})
# Causes narrower than a verdict that the agent may name in its evidence, and their verdict.
NARROWED_CAUSES = {Reason.GPU_MEMORY_NOT_RELEASED.value: Verdict.GHOST_MEMORY}


@dataclass(frozen=True)
class LeaseView:
    """What the operator reads from a run's heartbeat Lease."""

    verdict: Verdict | None = None  # None: not renewed yet, or a verdict we do not know
    step: int | None = None
    saved_step: int | None = None
    evidence: str = ""
    renewed: datetime | None = None
    duration_seconds: int | None = None
    holder: str | None = None  # the pod whose agent renewed it last
    # The agent's shipping report per remote layer (`trainguard.operator.policies.layers`).
    layers: tuple[LayerCheckpoint, ...] = ()
    # A cause narrower than the verdict, named in the evidence (a `NARROWED_CAUSES` key).
    cause: str | None = None
    # The init steps' summaries the agent carries, as JSON (`policies.initsteps`).
    preflight: str = ""
    staging: str = ""
    since: datetime | None = None  # when the verdict began, by the agent's clock
    # The invalid checkpoints the agent told of, as JSON (`policies.findings`).
    invalid_checkpoints: str = ""
    # The gang member whose agent renews it (its label); None: a one-pod run's Lease.
    member: int | None = None
    # The pod's last restore record, as JSON (`policies.layers.parse_restore`).
    restored: str = ""
    # A gang member's: the restart generation the operator ordered on this Lease, and the one
    # the agent's verdict is about (`policies.gang`).
    ordered_generation: int | None = None
    generation: int | None = None


def same_failure(last: datetime | None, since: datetime | None) -> bool:
    """Whether a failure verdict that began at `since` is the one recorded as begun at `last`.

    Compared for equality, never for order (the agent's clock is not the operator's), at the
    second the status keeps. Without both times the verdict's start is unknown: the same.
    """
    if last is None or since is None:
        return True
    return last.replace(microsecond=0) == since.replace(microsecond=0)


def renewed_by(lease: LeaseView, run: str, attempt: int | None) -> bool:
    """Whether the Lease was last renewed by the agent of the run's pod of this attempt.

    A gang member's Lease, by the agent of that member's pod of this attempt.
    """
    return attempt is not None and lease.holder == pod_name(run, attempt, lease.member)


def failure_cause(lease: LeaseView) -> str | None:
    """The failure a Lease reports: the narrower cause the agent names, else the verdict."""
    if lease.verdict not in FAILURE_VERDICTS:
        return None
    return lease.cause or lease.verdict


def urgent(lease: LeaseView | None, status: TrainingRunStatus) -> bool:
    """Whether the Lease carries a failure verdict the status does not show or has not handled.

    Handled: `status.lastFailure` records it for the current attempt, begun at the same time
    (a Dead -> Healthy -> Dead between two cycles is a new failure). A stale Lease of an
    earlier pod may pass (its cycle finds nothing to do); a new failure never waits.
    """
    if lease is None or lease.verdict not in FAILURE_VERDICTS:
        return False
    last = status.last_failure
    handled = (
        last is not None
        and last.attempt == status.attempt
        and last.cause == failure_cause(lease)
        and same_failure(last.since, lease.since)
    )
    return lease.verdict != status.verdict or not handled


def expiry(lease: LeaseView | None) -> datetime | None:
    """When a Lease the agent renewed at least once expires: its last renewal plus its duration."""
    if lease is None or lease.renewed is None or lease.duration_seconds is None:
        return None
    return lease.renewed + timedelta(seconds=lease.duration_seconds)


def expired(lease: LeaseView | None, now: datetime) -> bool:
    """Whether a Lease the agent renewed at least once has not been renewed within its duration."""
    end = expiry(lease)
    return end is not None and now > end
