"""Which pod a run should have, and what to report about it: the reconcile decision, pure.

A run has at most one live pod, the pod of its current attempt k, named `<run>-<k>`.
`status.attempt` records k once that pod has been applied, so an operator that crashes
anywhere in a cycle finds the same answer again: the highest attempt among the recorded
one and the pods that exist is the current attempt; its pod is kept if it exists, and
the next attempt (k + 1) is created only once the pod of k is gone and every earlier pod
has finished terminating. Deterministic names make a repeated create an idempotent apply.

Reasons for a new attempt: the first pod (`Created`), a resume after suspend (`Resumed`),
a spec change (`SpecChanged`: the old pod is deleted first), or a pod that vanished
(`PodDeleted`, counted as a restart). The reason survives the wait for a terminating pod
because the state written meanwhile carries it.

A pod that lacks an input (an image, a Secret, a claim, a readable data source) is kept, and
the state names what it lacks (`policies.inputs`): no new attempt while the input is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.api import TrainingRun, TrainingRunStatus
from trainguard.api.constants import ConditionStatus, ConditionType, NetworkVolumes, Reason
from trainguard.operator.build.constants import OperatorReason
from trainguard.operator.build.names import pod_name
from trainguard.operator.conditions import (
    EventSpec,
    Observed,
    RunState,
    find,
    is_true,
    state_reason,
)
from trainguard.operator.policies import inputs
from trainguard.operator.policies.inputs import Waiting
from trainguard.operator.policies.placement import PlacementDecision

SUCCEEDED = "Succeeded"
FAILED = "Failed"
RUNNING = "Running"
# Reasons that explain a new attempt and are carried through the wait for it.
CARRIED_CAUSES = frozenset(
    {Reason.RESUMED, Reason.SPEC_CHANGED, Reason.POD_DELETED, Reason.RESCHEDULING}
)
# Reasons of a Failed condition the escalation ladder set: final, unlike InvalidSpec (fixed
# by a spec change).
LADDER_FAIL_REASONS = frozenset({Reason.MAX_RESTARTS_EXCEEDED, Reason.REPEATED_FAILURE_AT_STEP})


@dataclass(frozen=True)
class PodView:
    """What the operator needs to know about one of a run's pods."""

    name: str
    attempt: int
    phase: str = "Pending"
    node: str | None = None
    deleting: bool = False
    spec_hash: str | None = None
    # The scheduler's message while PodScheduled is False with reason Unschedulable.
    unschedulable: str | None = None
    # Exit code of the preflight init step once it terminated, and the pod's failure text
    # (the preflight's termination message, or the pod's own message).
    preflight_exit: int | None = None
    message: str | None = None
    # The init steps' termination messages: their final reports (`policies.initsteps`).
    preflight_report: str | None = None
    staging_report: str | None = None
    # Exit code of the stage-data init step once it terminated.
    staging_exit: int | None = None
    # Containers waiting for something other than their turn (an image, a config), the
    # kubelet's words; whether the pod is on a node with its volumes not set up yet, and then
    # the newest FailedMount Event about it (`policies.inputs`).
    waiting: tuple[Waiting, ...] = ()
    volumes_pending: bool = False
    mount_failure: str | None = None


@dataclass(frozen=True)
class Decision:
    """The cycle's actions: create the pod of `attempt`, delete pods, or wait."""

    attempt: int | None
    create: bool = False
    delete: tuple[PodView, ...] = ()
    current: PodView | None = None
    cause: Reason = Reason.CREATED
    waiting: tuple[PodView, ...] = ()
    complete: bool = False
    failed: bool = False


def given_up(status: TrainingRunStatus) -> bool:
    """Whether the escalation ladder gave up on the run (Failed, not by an invalid spec)."""
    failed = find(status.conditions, ConditionType.FAILED)
    return (
        failed is not None
        and failed.status is ConditionStatus.TRUE
        and failed.reason in LADDER_FAIL_REASONS
    )


def moving_off(status: TrainingRunStatus, current: PodView) -> bool:
    """Whether the escalation ladder chose to move the run off the current pod.

    Level-based: every cycle deletes the pod until it is gone, so an operator restarted
    after the record was written still acts on it.
    """
    last = status.last_failure
    return (
        last is not None
        and last.attempt == current.attempt
        and state_reason(status) == Reason.RESCHEDULING
    )


def _cause(status: TrainingRunStatus, latest: int) -> Reason:
    previous = state_reason(status)
    if previous in CARRIED_CAUSES:
        return Reason(previous)
    if is_true(status.conditions, ConditionType.SUSPENDED):
        return Reason.RESUMED
    return Reason.CREATED if latest == 0 else Reason.POD_DELETED


def decide(run: TrainingRun, pods: tuple[PodView, ...], desired_hash: str) -> Decision:
    """The actions that move the run's pods toward the one pod the spec asks for."""
    status = run.status or TrainingRunStatus()
    latest = max([status.attempt or 0, *(p.attempt for p in pods)])
    attempt = latest or None
    live = [p for p in pods if not p.deleting]
    current = next((p for p in live if p.attempt == latest), None)
    superseded = tuple(p for p in live if p.attempt < latest)
    complete = is_true(status.conditions, ConditionType.COMPLETE) or (
        current is not None and current.phase == SUCCEEDED
    )
    if complete:
        return Decision(attempt, current=current, delete=superseded, complete=True)
    if given_up(status):
        return Decision(attempt, delete=tuple(live), failed=True)
    if run.spec.suspend:
        return Decision(attempt, delete=tuple(live), cause=Reason.SUSPENDED)
    if current is not None:
        if moving_off(status, current):
            return Decision(
                attempt, delete=(current, *superseded), current=current, cause=Reason.RESCHEDULING
            )
        if current.spec_hash != desired_hash:
            return Decision(
                attempt, delete=(current, *superseded), current=current, cause=Reason.SPEC_CHANGED
            )
        return Decision(attempt, current=current, delete=superseded)
    cause = _cause(status, latest)
    terminating = tuple(p for p in pods if p.deleting) + superseded
    if terminating:
        return Decision(attempt, delete=superseded, cause=cause, waiting=terminating)
    return Decision(latest + 1, create=True, cause=cause)


def _cause_text(cause: Reason, run: str, attempt: int) -> str:
    previous = pod_name(run, attempt - 1) if attempt > 1 else ""
    return {
        Reason.CREATED: "",
        Reason.RESUMED: " after resume",
        Reason.SPEC_CHANGED: " for the changed spec",
        Reason.POD_DELETED: f" because pod {previous} was deleted",
        Reason.RESCHEDULING: f" after the failure of pod {previous}",
    }.get(cause, "")


def _pod_state(run: TrainingRun, current: PodView) -> RunState:
    name = current.name
    lacking = inputs.state(run.spec, run.metadata.namespace or "", current)
    if lacking is not None:
        return lacking
    if current.phase == FAILED:
        return RunState(Reason.POD_FAILED, f"pod {name} failed", degraded=True, warning=True)
    if current.unschedulable is not None:
        return RunState(
            OperatorReason.UNSCHEDULABLE,
            f"pod {name} cannot be scheduled: {current.unschedulable}",
            warning=True,
        )
    if current.node is None:
        return RunState(Reason.SCHEDULING, f"pod {name} is waiting for a node", progressing=True)
    if current.phase == RUNNING:
        return RunState(
            Reason.TRAINING,
            f"pod {name} is running on node {current.node}",
            ready=True,
            progressing=True,
        )
    return RunState(
        OperatorReason.STARTING,
        f"pod {name} is starting on node {current.node}",
        progressing=True,
    )


def state(run: TrainingRun, decision: Decision, placement: PlacementDecision | None) -> RunState:
    """The state the cycle reports, given its decision and the placement guard's answer."""
    name = run.metadata.name or ""
    status = run.status or TrainingRunStatus()
    if decision.complete:
        pod = decision.current.name if decision.current else "the run's pod"
        return RunState(Reason.COMPLETED, f"{pod} succeeded", complete=True)
    failed = find(status.conditions, ConditionType.FAILED)
    if decision.failed and failed is not None:
        return RunState(failed.reason, failed.message, failed=True, warning=True)
    if run.spec.suspend:
        deleting = ", ".join(p.name for p in decision.delete)
        message = f"deleting pod {deleting}" if deleting else "no pod runs"
        return RunState(
            Reason.SUSPENDED, f"suspended: {message}; checkpoints are kept", suspended=True
        )
    if placement is not None and placement.action is NetworkVolumes.FORBID:
        return RunState(
            OperatorReason.NETWORK_VOLUME_ON_HOT_PATH,
            f"no pod created: {placement.message()}",
            warning=True,
        )
    if decision.current is not None and decision.current in decision.delete:
        what = "spec changed" if decision.cause is Reason.SPEC_CHANGED else "rescheduling"
        return RunState(
            decision.cause,
            f"{what}: deleting pod {decision.current.name}; a new attempt follows",
            progressing=True,
        )
    if decision.waiting:
        names = ", ".join(p.name for p in decision.waiting)
        return RunState(
            decision.cause,
            f"waiting for pod {names} to be deleted before the next attempt",
            progressing=True,
        )
    if decision.create and decision.attempt is not None:
        pod = pod_name(name, decision.attempt)
        cause = _cause_text(decision.cause, name, decision.attempt)
        return RunState(
            Reason.SCHEDULING,
            f"created pod {pod} (attempt {decision.attempt}){cause}; waiting for a node",
            progressing=True,
        )
    if decision.current is None:
        return RunState(Reason.SCHEDULING, "no pod yet", progressing=True)
    return _pod_state(run, decision.current)


def blocked(placement: PlacementDecision | None) -> bool:
    """Whether the placement guard stops the pod from being created."""
    return placement is not None and placement.action is NetworkVolumes.FORBID


def observed(run: TrainingRun, decision: Decision, placement: PlacementDecision | None) -> Observed:
    """Status fields besides conditions: the attempt whose pod exists, node, restarts."""
    status = run.status or TrainingRunStatus()
    attempt = decision.attempt
    restarts = status.restarts
    if decision.create:
        if blocked(placement):
            attempt = (attempt or 1) - 1 or None
        elif decision.cause is Reason.POD_DELETED:
            restarts += 1
    current = decision.current
    on_node = current is not None and not current.deleting and current not in decision.delete
    return Observed(
        attempt=attempt,
        node=current.node if on_node and current is not None else None,
        restarts=restarts,
        started=on_node and current is not None and current.phase == RUNNING,
    )


def extra_events(decision: Decision, placement: PlacementDecision | None) -> list[EventSpec]:
    """Events beyond the state's own: the warning of a pod created next to a network volume."""
    if decision.create and placement is not None and placement.action is NetworkVolumes.WARN:
        return [
            EventSpec(
                OperatorReason.NETWORK_VOLUME_ON_HOT_PATH,
                f"pod created with a network volume on the hot path: {placement.message()}",
                warning=True,
            )
        ]
    return []
