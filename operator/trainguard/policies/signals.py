"""The agent's signals, pure: what the run's heartbeat Lease says, and what the status takes.

The agent renews `<run>-heartbeat` with its verdict, the trainer's step, the newest saved
step and compact evidence. The operator copies verdict and steps into the status every
cycle, and a change to a failure verdict starts a cycle at once (so that a death is in the
status within about a second instead of at the next resync).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from trainguard.api.constants import Verdict

# Verdicts that are failures: the ladder acts on them.
FAILURE_VERDICTS = frozenset({Verdict.DEAD, Verdict.HUNG, Verdict.GHOST_MEMORY, Verdict.IO_STUCK})


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


def urgent(lease: LeaseView | None, previous: Verdict | None) -> bool:
    """Whether the Lease carries a failure verdict the status does not show yet."""
    return lease is not None and lease.verdict in FAILURE_VERDICTS and lease.verdict != previous


def expired(lease: LeaseView | None, now: datetime) -> bool:
    """Whether a Lease the agent renewed at least once has not been renewed within its duration."""
    if lease is None or lease.renewed is None or lease.duration_seconds is None:
        return False
    return (now - lease.renewed).total_seconds() > lease.duration_seconds
