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

A gang (`spec.trainer.nodes` = N > 1) has N member pods per attempt, `<run>-<k>-<m>`, created
together; member 0 stands for the attempt where one pod is meant (escalation, init-step
reports), so what the ladder decides for member 0 (a reschedule, a spec change, suspend)
moves the whole gang. A member of the current attempt that is gone (deleted, its node lost:
`lost_members`, or its node sick by its own agent's word: `sick_members`) or Failed (a member
other than 0) is replaced alone, under its own name in
the same attempt (`Decision.replace`, a restart): the other members keep their pods, and their
trainers restart in place when the collective breaks; member m's stable name follows its new
pod. The gone member is re-read from the apiserver first, so a member created moments ago that
a watch has not delivered yet is not taken for gone (and re-applying it would be harmless).
A gang with a member the scheduler has not placed for `GANG_UNSCHEDULABLE_SECONDS` is taken
down whole, so no partial gang holds nodes (or trains) while it waits: the state says
`Unschedulable`, naming the gang and how many members could not be placed, and the next attempt
is tried `GANG_RETRY_SECONDS` later (`status.gangRetryTime`), not counted as a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from trainguard.api import TrainingRun, TrainingRunStatus
from trainguard.api.constants import ConditionStatus, ConditionType, NetworkVolumes, Reason
from trainguard.api.status import Member
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
from trainguard.operator.policies import inputs, ladder, signals
from trainguard.operator.policies.inputs import Waiting
from trainguard.operator.policies.placement import PlacementDecision
from trainguard.operator.policies.signals import LeaseView

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
# A gang member the scheduler could not place for this long takes its gang down: long enough
# for the scheduler's own retries and a node that was NotReady for a moment (a large gang's
# members are still being created meanwhile), short enough not to hold the placed members'
# nodes idle for long.
GANG_UNSCHEDULABLE_SECONDS = 30.0
# A gang taken down for want of nodes is tried again this much later.
GANG_RETRY_SECONDS = 30.0


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
    unschedulable_since: datetime | None = None  # the scheduler's first word of it
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
    # A gang member's index (its node rank); None for a one-pod run's pod.
    member: int | None = None
    # When the apiserver created the pod: a member's Lease renewed before it is its predecessor's.
    created: datetime | None = None
    # The env ConfigMap its containers take the shared variables from (`build.envconfig`).
    env_config: str | None = None


@dataclass(frozen=True)
class Unplaced:
    """A gang taken down because members could not be placed: how many, and why."""

    members: int  # members the scheduler could not place
    total: int
    message: str  # the scheduler's words about the first of them


@dataclass(frozen=True)
class Decision:
    """The cycle's actions: create the pod(s) of `attempt`, delete pods, or wait."""

    attempt: int | None
    create: bool = False
    delete: tuple[PodView, ...] = ()
    current: PodView | None = None
    cause: Reason = Reason.CREATED
    waiting: tuple[PodView, ...] = ()
    complete: bool = False
    failed: bool = False
    # A gang's live members of the current attempt, by index (a one-pod run: none).
    members: tuple[PodView, ...] = ()
    # A gang whose members could not all be placed: taken down now (`Unplaced`), or held
    # until `retry_time` before its next attempt.
    unplaced: Unplaced | None = None
    retry_time: datetime | None = None
    # A gang's members (re)created in the current attempt (`create` with `attempt` unchanged):
    # those gone or Failed; () with `create` means every member of a new attempt.
    replace: tuple[int, ...] = ()


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


def gang_size(run: TrainingRun) -> int:
    """Members per attempt: 1 for a one-pod run."""
    return run.spec.trainer.nodes


def broken_members(run: TrainingRun, members: tuple[PodView, ...]) -> tuple[int, ...]:
    """A gang's members to replace: missing from its attempt, or Failed (but member 0).

    () for a one-pod run. A Failed member 0 is the attempt's failure: the ladder's.
    """
    if gang_size(run) == 1 or not members:
        return ()
    present = {p.member for p in members if p.phase != FAILED or not p.member}
    return tuple(m for m in range(gang_size(run)) if m not in present)


def lost_members(
    run: TrainingRun,
    members: tuple[PodView, ...],
    leases: tuple[LeaseView, ...],
    now: datetime,
) -> tuple[PodView, ...]:
    """Members (but member 0) whose agent's Lease of this attempt expired: their node may be lost.

    The caller reads their nodes: a member on a node NotReady or gone is replaced elsewhere.
    Member 0's Lease is the run's own: the escalation ladder judges it, for the whole gang.
    """
    expired = {
        lease.member
        for lease in leases
        if lease.member and signals.expired(lease, now) and lease.holder is not None
    }
    return tuple(
        p
        for p in members
        if p.member in expired
        and p.node is not None
        and any(lease.member == p.member and lease.holder == p.name for lease in leases)
    )


# The resolution of a pod's `creationTimestamp`.
CREATION_RESOLUTION = timedelta(seconds=1)


def sick_members(
    members: tuple[PodView, ...], leases: tuple[LeaseView, ...]
) -> tuple[tuple[PodView, str], ...]:
    """Members (but member 0) whose own agent says their node is sick, with the cause.

    A verdict of `ladder.NODE_CAUSES` (ghost memory, stuck I/O) in the member's Lease, renewed
    by this very pod: a replacement keeps its predecessor's name, and its predecessor's Lease
    (renewed before the replacement was created) says nothing about the new node. Member 0's
    Lease is the run's own: the escalation ladder judges it, for the whole gang.
    """
    sick = []
    for pod in members:
        if not pod.member or pod.node is None or pod.deleting:
            continue
        # `creationTimestamp` has whole seconds: a renewal within the second the pod was made
        # may be its predecessor's, made moments before it (its own agent cannot run yet).
        since = None if pod.created is None else pod.created + CREATION_RESOLUTION
        for lease in leases:
            renewed = lease.renewed
            fresh = renewed is not None and (since is None or renewed >= since)
            if (
                lease.member == pod.member
                and lease.holder == pod.name
                and fresh
                and lease.verdict is not None
                and lease.verdict.value in ladder.NODE_CAUSES
            ):
                sick.append((pod, lease.verdict.value))
    return tuple(sick)


def unplaced(run: TrainingRun, members: tuple[PodView, ...], now: datetime) -> Unplaced | None:
    """A gang with a member the scheduler could not place for the bound, else None."""
    waiting = [p for p in members if p.unschedulable is not None]
    bound = timedelta(seconds=GANG_UNSCHEDULABLE_SECONDS)
    if gang_size(run) == 1 or not any(
        p.unschedulable_since is not None and now - p.unschedulable_since >= bound for p in waiting
    ):
        return None
    return Unplaced(len(waiting), gang_size(run), waiting[0].unschedulable or "")


def member_order(pod: PodView) -> int:
    """Sort key of an attempt's pods: member 0 (or a one-pod run's pod) first."""
    return pod.member or 0


def decide(
    run: TrainingRun,
    pods: tuple[PodView, ...],
    desired_hash: str,
    now: datetime | None = None,
) -> Decision:
    """The actions that move the run's pods toward the pod (or gang) the spec asks for.

    `now` times a gang's wait for nodes (None: the gang's bounds never run out).
    """
    status = run.status or TrainingRunStatus()
    latest = max([status.attempt or 0, *(p.attempt for p in pods)])
    attempt = latest or None
    live = [p for p in pods if not p.deleting]
    # The attempt's pods, member 0 first: one, or a gang's members (also after the spec
    # changed the gang's size, so that every one of them is deleted at once).
    attempt_pods = tuple(sorted((p for p in live if p.attempt == latest), key=member_order))
    current = attempt_pods[0] if attempt_pods else None
    superseded = tuple(p for p in live if p.attempt < latest)
    members = attempt_pods if gang_size(run) > 1 else ()
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
        every = attempt_pods
        if status.gang_retry_time is not None and latest == (status.attempt or 0):
            # This attempt's gang was taken down for a member it could not place: pods still
            # listed are its members seen before their deletion reached the watch. They are
            # deleted again and the retry time kept; judged as members, the placed ones would
            # read as a gang to keep, and the next cycle, finding none, would start the next
            # attempt at once instead of at the retry time.
            return Decision(
                attempt,
                delete=(*every, *superseded),
                cause=Reason.SCHEDULING,
                retry_time=status.gang_retry_time,
            )
        if moving_off(status, current):
            return Decision(
                attempt,
                delete=(*every, *superseded),
                current=current,
                cause=Reason.RESCHEDULING,
                members=members,
            )
        if current.spec_hash != desired_hash:
            return Decision(
                attempt,
                delete=(*every, *superseded),
                current=current,
                cause=Reason.SPEC_CHANGED,
                members=members,
            )
        # A member whose pod is still terminating is replaced once it is gone: its name is
        # taken until then.
        leaving = {p.member for p in pods if p.deleting and p.attempt == latest}
        replace = tuple(m for m in broken_members(run, members) if m not in leaving)
        if replace:
            failed = tuple(p for p in members if p.member in replace)
            return Decision(
                attempt,
                create=True,
                delete=(*failed, *superseded),
                current=current,
                cause=Reason.POD_DELETED,
                members=tuple(p for p in members if p not in failed),
                replace=replace,
            )
        gone = unplaced(run, members, now) if now is not None else None
        if gone is not None:
            return Decision(
                attempt,
                delete=(*every, *superseded),
                current=current,
                cause=Reason.SCHEDULING,
                members=members,
                unplaced=gone,
                retry_time=now + timedelta(seconds=GANG_RETRY_SECONDS) if now else None,
            )
        return Decision(attempt, current=current, delete=superseded, members=members)
    cause = _cause(status, latest)
    terminating = tuple(p for p in pods if p.deleting) + superseded
    if terminating:
        return Decision(
            attempt,
            delete=superseded,
            cause=cause,
            waiting=terminating,
            retry_time=status.gang_retry_time,
        )
    retry = status.gang_retry_time
    if retry is not None and (now is None or now < retry):
        return Decision(attempt, cause=Reason.SCHEDULING, retry_time=retry)
    if retry is not None:
        cause = Reason.SCHEDULING  # a gang's retry after waiting for nodes: not a restart
    return Decision(latest + 1, create=True, cause=cause)


def _cause_text(cause: Reason, run: str, attempt: int, gang: bool) -> str:
    previous = pod_name(run, attempt - 1) if attempt > 1 else ""
    if gang:
        return {
            Reason.RESUMED: " after resume",
            Reason.SPEC_CHANGED: " for the changed spec",
            Reason.POD_DELETED: f" because attempt {attempt - 1} lost a member",
            Reason.RESCHEDULING: f" after the failure of attempt {attempt - 1}",
            Reason.SCHEDULING: " after its gang waited for nodes",
        }.get(cause, "")
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


# Pods a message names at most; a gang's others are counted.
NAMED_PODS = 4


def pods_text(pods: tuple[PodView, ...] | list[PodView]) -> str:
    """Pod names for a message: a few, then how many more (a gang may have thousands)."""
    names = [p.name for p in pods[:NAMED_PODS]]
    more = len(pods) - len(names)
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def _at(moment: datetime) -> str:
    return moment.strftime("%H:%M:%S")


def _gang_state(run: TrainingRun, decision: Decision) -> RunState | None:
    """A gang's own states: taken down or waiting for nodes, broken, and its members' state."""
    name = run.metadata.name or ""
    status = run.status or TrainingRunStatus()
    total = gang_size(run)
    gone = decision.unplaced
    if gone is not None and decision.retry_time is not None:
        return RunState(
            OperatorReason.UNSCHEDULABLE,
            f"gang {name} (attempt {decision.attempt}): {gone.members} of {gone.total} members "
            f"could not be placed ({gone.message}); every member deleted so that no partial gang "
            f"holds nodes, next attempt not before {_at(decision.retry_time)} UTC",
            warning=True,
        )
    if decision.current is None and not decision.create and decision.retry_time is not None:
        previous = find(status.conditions, ConditionType.PROGRESSING)
        if state_reason(status) == OperatorReason.UNSCHEDULABLE and previous is not None:
            return RunState(OperatorReason.UNSCHEDULABLE, previous.message, warning=True)
        return RunState(
            OperatorReason.UNSCHEDULABLE,
            f"gang {name} could not be placed whole; next attempt not before "
            f"{_at(decision.retry_time)} UTC",
            warning=True,
        )
    if decision.replace:
        indices = ", ".join(str(m) for m in decision.replace[:NAMED_PODS])
        count = len(decision.replace)
        more = f" and {count - NAMED_PODS} more" if count > NAMED_PODS else ""
        return RunState(
            Reason.POD_DELETED,
            f"gang {name} (attempt {decision.attempt}): replacing member {indices}{more} (pod "
            "gone or failed); the other members keep their pods",
            progressing=True,
        )
    if decision.current is None or decision.current in decision.delete or not decision.members:
        return None
    members = decision.members
    waiting = [p for p in members if p.unschedulable is not None]
    if waiting:
        return RunState(
            OperatorReason.UNSCHEDULABLE,
            f"gang {name} (attempt {decision.attempt}): {len(waiting)} of {total} members cannot "
            f"be scheduled yet ({pods_text(waiting)}): {waiting[0].unschedulable}",
            warning=True,
        )
    for pod in members:
        # A placed member that lacks an input (an image, a Secret) says what it lacks.
        lacking = inputs.state(run.spec, run.metadata.namespace or "", pod) if pod.node else None
        if lacking is not None:
            return lacking
    if any(p.phase == FAILED for p in members):
        return None  # a Failed member 0 (the others are replaced): its own state tells it
    running = [p for p in members if p.phase == RUNNING]
    if len(running) == total:
        return RunState(
            Reason.TRAINING,
            f"gang {name} (attempt {decision.attempt}): all {total} members running",
            ready=True,
            progressing=True,
        )
    placed = [p for p in members if p.node is not None]
    if len(placed) < total:
        return RunState(
            Reason.SCHEDULING,
            f"gang {name} (attempt {decision.attempt}): {len(placed)} of {total} members placed",
            progressing=True,
        )
    return RunState(
        OperatorReason.STARTING,
        f"gang {name} (attempt {decision.attempt}): {len(running)} of {total} members running",
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
    gang = gang_size(run) > 1
    if gang:
        told = _gang_state(run, decision)
        if told is not None:
            return told
    if decision.current is not None and decision.current in decision.delete:
        what = "spec changed" if decision.cause is Reason.SPEC_CHANGED else "rescheduling"
        deleting = pods_text(decision.members or (decision.current,))
        return RunState(
            decision.cause,
            f"{what}: deleting pod {deleting}; a new attempt follows",
            progressing=True,
        )
    if decision.waiting:
        return RunState(
            decision.cause,
            f"waiting for pod {pods_text(decision.waiting)} to be deleted before the next attempt",
            progressing=True,
        )
    if decision.create and decision.attempt is not None:
        cause = _cause_text(decision.cause, name, decision.attempt, gang)
        if gang:
            first = pod_name(name, decision.attempt, 0)
            last = pod_name(name, decision.attempt, gang_size(run) - 1)
            return RunState(
                Reason.SCHEDULING,
                f"created the {gang_size(run)} members of gang {name}, pods {first} to {last} "
                f"(attempt {decision.attempt}){cause}; waiting for nodes",
                progressing=True,
            )
        pod = pod_name(name, decision.attempt)
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
        if blocked(placement) and not decision.replace:
            attempt = (attempt or 1) - 1 or None
        elif decision.cause is Reason.POD_DELETED and not blocked(placement):
            restarts += 1
    current = decision.current
    on_node = current is not None and not current.deleting and current not in decision.delete
    members: tuple[Member, ...] = ()
    ready = None
    if gang_size(run) > 1:
        kept = () if current in decision.delete or decision.unplaced else decision.members
        members = tuple(
            Member(index=p.member or 0, pod=p.name, node=p.node, phase=p.phase) for p in kept
        )
        running = sum(1 for p in kept if p.phase == RUNNING)
        ready = f"{running}/{gang_size(run)}"
    started = on_node and current is not None and current.phase == RUNNING
    if members:
        started = all(m.phase == RUNNING for m in members) and len(members) == gang_size(run)
    return Observed(
        attempt=attempt,
        node=current.node if on_node and current is not None else None,
        restarts=restarts,
        started=started,
        members=members,
        members_ready=ready,
        gang_retry_time=None if decision.create else decision.retry_time,
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
