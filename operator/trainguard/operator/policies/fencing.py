"""Fences, pure: when the next attempt starts, bound what the superseded ones may contribute.

A pod the operator has given up on may still run: on a partitioned node the kubelet and the
agent cannot reach the API, the operator force-deletes the pod and starts the next attempt
elsewhere, and the old trainer and agent keep saving and shipping. So before it creates the
pod of attempt k+1 the operator records the fence of attempt k in `status.fences`: the newest
checkpoint step attempt k's agent reported verified on a remote layer, as its last Lease
renewal holds it (none when the Lease was never renewed by that attempt). The status is
written before the pod is created, and the pod is told every fence (`PodEnv.fences`):
`trainguard.layers.lineage` restores and prunes only below them.
"""

from __future__ import annotations

from datetime import datetime

from trainguard.api.status import MAX_FENCES, Fence, TrainingRunStatus
from trainguard.operator.conditions import EventSpec
from trainguard.operator.policies import signals
from trainguard.operator.policies.signals import LeaseView

REASON = "AttemptFenced"


def reported_step(lease: LeaseView | None, run: str, attempt: int) -> int | None:
    """The newest checkpoint step attempt `attempt` reported on any remote layer, if any."""
    if lease is None or not signals.renewed_by(lease, run, attempt):
        return None
    steps = [layer.step for layer in lease.layers if layer.step is not None]
    return max(steps, default=None)


def record(
    status: TrainingRunStatus,
    creating: int,
    lease: LeaseView | None,
    run: str,
    now: datetime,
) -> tuple[TrainingRunStatus, list[EventSpec]]:
    """The status with a fence for every attempt before `creating` that has none yet.

    Only the newest `MAX_FENCES` attempts are kept; an older attempt's checkpoints are then
    outside the lineage (every attempt re-ships the checkpoint it resumed from under its own
    name, so the lineage goes on in the newer ones).
    """
    fenced = {fence.attempt for fence in status.fences}
    first = max(1, creating - MAX_FENCES)
    new = [
        Fence(attempt=a, step=reported_step(lease, run, a), time=now)
        for a in range(first, creating)
        if a not in fenced
    ]
    if not new:
        return status, []
    fences = sorted([*status.fences, *new], key=lambda f: f.attempt)[-MAX_FENCES:]
    return status.model_copy(update={"fences": fences}), [_event(f) for f in new]


def _event(fence: Fence) -> EventSpec:
    if fence.step is None:
        message = (
            f"attempt {fence.attempt} superseded before it reported a checkpoint: "
            "nothing it ships is restored"
        )
    else:
        message = (
            f"attempt {fence.attempt} superseded: its checkpoints up to step {fence.step} stay "
            "in the run's lineage; anything it ships later is ignored"
        )
    return EventSpec(REASON, message)
