"""A gang's restart generation, pure: when every member must restart its ranks, and why.

A gang (`spec.trainer.nodes` > 1) trains as one world of ranks, so it restarts as one: every
member's ranks restart in place and meet again at member 0's rendezvous. The operator numbers
these restarts, the gang's restart generation (`status.gangRestart.generation`, 0 before the
first), and tells every member the generation it must run: the operator writes it on every
member's Lease (`trainguard.dev/gang-generation`), each member's agent copies it for its
supervisor (`gang.json`), and a supervisor whose ranks run an older generation ends them at
once and starts them again, without a back-off (it is not that member's failure).

The generation goes up by one, once per failure of the gang, when
- a member is replaced in its attempt, its node lost or sick (`reconcile.replace_lost`): the
  other members' ranks wait on a peer that will not answer, which the order ends at once rather
  than at the hang bound;
- a member's agent reports a rank `Dead` or `Hung` about a launch of the current generation (or
  a newer one: a failure the operator missed). The agent says which launch its verdict is
  about (`trainguard.dev/verdict-generation`: the failed launch's for Dead, the running one's
  otherwise). A verdict about an older launch is a consequence of a restart already ordered
  (the other members' ranks that failed with the broken collective, the ordered stops
  themselves) and orders nothing.

A member's own failure makes its supervisor run the next generation after its restart already,
so the order that failure brings restarts every member but that one: no member restarts twice
for one failure. Of several failures seen in one cycle, the one whose verdict began first names
the cause (with the agents' clocks, which on one cluster agree to well under a step; a rank that
failed only because its peer died usually reports a moment later). The order is recorded once:
`status.gangRestart` (generation, member, cause, time) and one Warning Event `GangRestart`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from trainguard.api import TrainingRun, TrainingRunStatus
from trainguard.api.constants import Reason, Verdict
from trainguard.api.status import GangRestart
from trainguard.operator.policies.signals import LeaseView, renewed_by

# Verdicts of a member's ranks that order a gang restart; node causes replace the member.
RANK_FAILURES = frozenset({Verdict.DEAD, Verdict.HUNG})
MAX_MESSAGE = 900


@dataclass(frozen=True)
class Replaced:
    """A member replaced in its attempt this cycle: its index, the cause, its old node."""

    member: int
    cause: str
    node: str | None


def generation(status: TrainingRunStatus | None) -> int:
    """The gang's restart generation: 0 before the operator ordered any restart."""
    last = None if status is None else status.gang_restart
    return 0 if last is None else last.generation


def failing(
    run: str, attempt: int | None, leases: Iterable[LeaseView], current: int
) -> list[LeaseView]:
    """Members' Leases (this attempt's agents') reporting a rank failure not yet ordered on."""
    return [
        lease
        for lease in leases
        if lease.member is not None
        and lease.verdict in RANK_FAILURES
        and lease.generation is not None
        and lease.generation >= current
        and renewed_by(lease, run, attempt)
    ]


def order(
    run: TrainingRun,
    leases: Iterable[LeaseView],
    replaced: Sequence[Replaced],
    now: datetime,
) -> GangRestart | None:
    """The gang restart this cycle orders, or None (a one-pod run never has one)."""
    if run.spec.trainer.nodes == 1:
        return None
    status = run.status or TrainingRunStatus()
    current = generation(status)
    name = run.metadata.name or ""
    if replaced:
        first = replaced[0]
        others = f" (and member {', '.join(str(r.member) for r in replaced[1:])})"
        what = "lost its node" if first.cause == Reason.NODE_LOST else f"found {first.cause}"
        return GangRestart(
            generation=current + 1,
            member=first.member,
            cause=first.cause,
            time=now,
            message=_message(
                f"gang {name}: member {first.member} {what}"
                f"{' on ' + first.node if first.node else ''}"
                f"{others if len(replaced) > 1 else ''}: it is replaced, and every member "
                f"restarts its ranks (generation {current + 1})"
            ),
        )
    found = failing(name, status.attempt, leases, current)
    if not found:
        return None
    # The earliest-begun failure is the likeliest cause; then the lowest member.
    first_lease = min(found, key=lambda lease: (lease.since or now, lease.member or 0))
    reported = first_lease.generation or 0
    new = max(current, reported) + 1
    evidence = first_lease.evidence[:300]
    return GangRestart(
        generation=new,
        member=first_lease.member or 0,
        cause=str(first_lease.verdict),
        time=now,
        message=_message(
            f"gang {name}: member {first_lease.member} reported {first_lease.verdict} "
            f"(generation {reported}): every member restarts its ranks (generation {new})"
            f"{'; evidence: ' + evidence if evidence else ''}"
        ),
    )


def _message(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def unsent(run: TrainingRun, leases: Iterable[LeaseView]) -> list[int]:
    """Members whose Lease does not carry the gang's generation yet (none before the first)."""
    current = generation(run.status)
    if run.spec.trainer.nodes == 1 or current == 0:
        return []
    seen = {lease.member: lease.ordered_generation for lease in leases if lease.member is not None}
    return [m for m in range(run.spec.trainer.nodes) if seen.get(m) != current]


def member_generations(
    run: str, attempt: int | None, leases: Iterable[LeaseView]
) -> dict[int, int]:
    """Each member's generation as its agent (of this attempt) reports it."""
    return {
        lease.member: lease.generation
        for lease in leases
        if lease.member is not None
        and lease.generation is not None
        and renewed_by(lease, run, attempt)
    }
