"""One reconcile cycle of a run: parse, decide, apply, report.

The steps are the pure functions of the lower layers glued to the API calls:
1. parse the run once (an invalid spec becomes `Failed=True, reason InvalidSpec`);
2. decide from the run and its observed pods which pod it should have (`policies.lifecycle`),
   and what a pod that cannot start lacks (`policies.inputs`);
3. when a pod is to be created, read the hot-path volumes and ask the placement guard;
4. server-side apply the companions (ServiceAccount, Role, RoleBinding, Lease(s), a gang's
   headless Service) and the pod (a gang's members, applied concurrently), delete superseded
   pods;
5. write the status once, only if it changed, then send the Events.
Every step is idempotent, so a crash anywhere is repaired by the next cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from trainguard.api import TrainingRun, TrainingRunStatus
from trainguard.api.constants import Reason
from trainguard.api.status import ExcludedNode
from trainguard.api.trainingrun import ObjectMeta
from trainguard.operator.build.lease import leases
from trainguard.operator.build.pod import PodInputs, gang_pods, pods_env_config, spec_hash
from trainguard.operator.build.role import role
from trainguard.operator.build.rolebinding import role_binding
from trainguard.operator.build.service import gang_service
from trainguard.operator.build.serviceaccount import service_account
from trainguard.operator.conditions import (
    EventSpec,
    Observed,
    RunState,
    advance,
    changed,
    shorten_bytes,
    step_events,
    transition_events,
)
from trainguard.operator.k8s import envconfigs, events
from trainguard.operator.k8s.apply import apply, apply_all, apply_status
from trainguard.operator.k8s.client import Kube, KubeError, concurrently
from trainguard.operator.k8s.leases import order_generation
from trainguard.operator.k8s.nodehealth import NodeChecks, report_node
from trainguard.operator.k8s.nodes import node_ready
from trainguard.operator.k8s.pods import create_pod, current_pods, delete_pod, with_mount_failures
from trainguard.operator.k8s.volumes import read_hot_path
from trainguard.operator.policies import (
    backoff,
    failures,
    fencing,
    findings,
    gang,
    initsteps,
    ladder,
    lifecycle,
    signals,
)
from trainguard.operator.policies.layers import parse_restore
from trainguard.operator.policies.lifecycle import Decision, PodView
from trainguard.operator.policies.placement import (
    NetworkList,
    PlacementDecision,
    guard,
    hot_path_claims,
)
from trainguard.operator.policies.signals import LeaseView

log = logging.getLogger(__name__)
MAX_INVALID_MESSAGE = 2000
# Companions that need only the RBAC objects before them: applied together.
CONCURRENT_KINDS = frozenset({"Lease", "Service"})


@dataclass(frozen=True)
class Settings:
    """What a cycle needs from the operator's configuration."""

    agent_image: str
    network: NetworkList
    instance: str
    node_checks: NodeChecks
    # Told (namespace, seconds) when a status write records a failure whose first sight a
    # clock says (`failures.detection_seconds`): the detection latency metric.
    detected: Callable[[str, float], None] | None = None


def companions(run: TrainingRun) -> list[dict[str, Any]]:
    """The children besides the pods, in the order they must exist for the pods."""
    gang = [gang_service(run)] if run.spec.trainer.nodes > 1 else []
    return [service_account(run), role(run), role_binding(run), *leases(run), *gang]


@dataclass(frozen=True)
class Outcome:
    """What a cycle leaves behind: the status stored, an invalid spec's error, a due cycle."""

    status: TrainingRunStatus
    invalid: str | None = None
    retry_after: float | None = None  # seconds: a cycle is due then (a back-off is running)


def reconcile(
    kube: Kube,
    body: dict[str, Any],
    pods: Iterable[PodView],
    settings: Settings,
    full: bool,
    written: TrainingRunStatus | None = None,
    lease: LeaseView | None = None,
    member_leases: tuple[LeaseView, ...] = (),
) -> Outcome:
    """Converge one run.

    `full` re-applies the companions even when no pod is created (on create, on a spec
    change and when the operator starts), which repairs drift in them. `written` is the
    status this operator wrote last for the run: only the operator writes status, so it is
    never older than the body's, which a watch may not have delivered yet. `lease` is the
    run's heartbeat Lease as last seen (a gang's member 0's): its verdict and steps go to the
    status; `member_leases` are a gang's others, whose verdicts go to `status.members`.
    """
    old = written or TrainingRunStatus.from_object(body.get("status") or {})
    try:
        run = TrainingRun.from_object({**body, "status": old.to_object()})
    except ValidationError as err:
        message = f"invalid spec: {err}"[:MAX_INVALID_MESSAGE]
        meta = ObjectMeta.model_validate(body.get("metadata") or {})
        state = RunState(Reason.INVALID_SPEC, message, failed=True, warning=True)
        kept = Observed(old.attempt, old.node, old.restarts)
        return Outcome(report(kube, meta, old, state, kept, [], settings.instance), message)
    namespace = run.metadata.namespace or ""
    # A Secret that does not exist shows only in the pod's Events: read while its volumes wait.
    pods = with_mount_failures(kube, namespace, tuple(pods))
    recorded, warnings, found = escalate(kube, run, pods, lease, settings.node_checks)
    if recorded is not None and found is not None:
        # The record is stored before the ladder acts (the pod deleted below), so an operator
        # restarted in between neither counts the failure twice nor forgets to act on it.
        apply_status(kube, run.metadata, recorded)
        # Timed at the apiserver's answer: from here on the status tells the failure.
        latency = failures.detection_seconds(found, datetime.now(UTC))
        if latency is not None and settings.detected is not None:
            settings.detected(namespace, latency)
        old = recorded
        run = run.model_copy(update={"status": recorded})
    desired = spec_hash(run.spec)
    now = datetime.now(UTC)
    replaced, lost_events, pods, gone = replace_lost(
        kube, run, pods, member_leases, now, settings.node_checks
    )
    restart = gang.order(run, (*([] if lease is None else [lease]), *member_leases), gone, now)
    if restart is not None:
        # Recorded before any member is told it: an operator restarted in between tells them
        # (`gang.unsent`) and never orders the same failure twice.
        replaced = (replaced or run.status or old).model_copy(update={"gang_restart": restart})
        lost_events.append(EventSpec(Reason.GANG_RESTART, restart.message, warning=True))
        log.info("%s: %s", run.metadata.name, restart.message)
    if replaced is not None:
        # The node is excluded before the member's new pod, which avoids it, is created.
        apply_status(kube, run.metadata, replaced)
        old = replaced
        run = run.model_copy(update={"status": replaced})
    decision = lifecycle.decide(run, pods, desired, now)
    if decision.create and ((decision.attempt or 0) > 1 or decision.replace):
        # The pods come from a watch, which can lag behind this operator's own writes under
        # load: a pod created moments ago may not be listed yet. Before moving to a next
        # attempt, or taking a gang with a member missing down, ask the apiserver itself
        # which pods the run has.
        pods = current_pods(kube, namespace, run.metadata.name or "", pods)
        decision = lifecycle.decide(run, pods, desired, now)
    decision, wait = backoff.hold(decision, run.status or old, run.spec.recovery.backoff, now)
    placement = None
    fence_events: list[EventSpec] = []
    if decision.create:
        facts = read_hot_path(kube, namespace, hot_path_claims(run.spec))
        placement = guard(run.spec, facts, settings.network)
    if decision.create and decision.attempt is not None and not lifecycle.blocked(placement):
        # The fences are stored before the pod that is told them exists (policies.fencing).
        fenced, fence_events = fencing.record(
            run.status or old, decision.attempt, lease, run.metadata.name or "", now
        )
        if fence_events:
            apply_status(kube, run.metadata, fenced)
            old = fenced
            run = run.model_copy(update={"status": fenced})
    converge(kube, run, pods, decision, placement, settings, full)
    # After the replacement's pod exists: telling a thousand members takes seconds.
    tell_gang(kube, run, (*([] if lease is None else [lease]), *member_leases))
    state = lifecycle.state(run, decision, placement)
    if decision.retry_time is not None and not decision.create:
        # A gang waiting for nodes: a cycle is booked for when it is tried again.
        wait = max(wait, (decision.retry_time - now).total_seconds(), 0.0)
    elif wait > 0:
        # The reason stays Rescheduling: it carries the cause to the attempt that follows.
        at = (now + timedelta(seconds=wait)).strftime("%H:%M:%S")
        state = RunState(
            Reason.RESCHEDULING,
            f"restart back-off: attempt {(decision.attempt or 0) + 1} not before {at} UTC",
            progressing=True,
        )
    status = report(
        kube,
        run.metadata,
        old,
        state,
        _with_signals(
            lifecycle.observed(run, decision, placement),
            lease,
            run.metadata.name,
            decision,
            member_leases,
        ),
        [*warnings, *lost_events, *fence_events, *lifecycle.extra_events(decision, placement)],
        settings.instance,
    )
    return Outcome(status, retry_after=wait or None)


def tell_gang(kube: Kube, run: TrainingRun, leases: tuple[LeaseView, ...]) -> None:
    """Write the gang's restart generation on the Leases of members not told it yet."""
    members = gang.unsent(run, leases)
    if not members:
        return
    namespace, name = run.metadata.namespace or "", run.metadata.name or ""
    try:
        order_generation(kube, namespace, name, members, gang.generation(run.status))
    except KubeError as err:
        # Told again at the next cycle: the Leases' watch shows who has it.
        log.warning("%s/%s: telling the gang its generation: %s", namespace, name, err)


def replace_lost(
    kube: Kube,
    run: TrainingRun,
    pods: tuple[PodView, ...],
    member_leases: tuple[LeaseView, ...],
    now: datetime,
    node_checks: NodeChecks | None = None,
) -> tuple[TrainingRunStatus | None, list[EventSpec], tuple[PodView, ...], list[gang.Replaced]]:
    """Gang members whose node is lost or sick: their node excluded, their pods deleted.

    Lost: a member's Lease expired (`lifecycle.lost_members`) and its node NotReady or gone; no
    kubelet will confirm the deletion, so it is forced. Sick: a member's own agent reports a
    node cause, ghost memory or stuck I/O (`lifecycle.sick_members`); the node is reported as
    the escalation ladder reports member 0's (`report_node`, per the taint policy) and the pod
    deleted gracefully, its trainer flushing as it would on any move. Returns the status with
    the nodes excluded (None when no member is lost or sick), the Warning Events, the pods
    without those members, which the lifecycle then replaces on other nodes, and the members
    replaced (a gang restart: `policies.gang`). Only those members' nodes are excluded; the
    other members keep their pods.
    """
    status = run.status or TrainingRunStatus()
    members = tuple(
        p for p in pods if p.attempt == status.attempt and p.member is not None and not p.deleting
    )
    candidates = lifecycle.lost_members(run, members, member_leases, now)
    lost = [(p, Reason.NODE_LOST.value) for p in candidates if node_ready(kube, p.node) is not True]
    sick = [s for s in lifecycle.sick_members(members, member_leases) if s[0] not in candidates]
    if not lost and not sick:
        return None, [], pods, []
    excluded = list(status.excluded_nodes)
    events = []
    reporter = f"run {run.metadata.namespace}/{run.metadata.name} (attempt {status.attempt})"
    for pod, cause in (*lost, *sick):
        node = pod.node or ""
        if all(e.node != node for e in excluded):
            excluded.append(ExcludedNode(node=node, reason=cause, time=now))
        what = "lost its node" if cause == Reason.NODE_LOST else f"found {cause} on its node"
        events.append(
            EventSpec(
                cause,
                f"gang {run.metadata.name}: member {pod.member} (pod {pod.name}) {what} "
                f"{node}: replaced on another node; {node} excluded",
                warning=True,
            )
        )
        log.info("%s: member %s on node %s: %s", run.metadata.name, pod.name, node, cause)
        if cause != Reason.NODE_LOST and node_checks is not None:
            report_node(kube, node_checks, node, cause, reporter, now)
    namespace = run.metadata.namespace or ""
    forced = [p for p, _ in lost]
    removed = [p for p, _ in (*lost, *sick)]
    concurrently(lambda pod: delete_pod(kube, namespace, pod.name, force=pod in forced), removed)
    # A sick member's pod is Terminating until its kubelet confirms: replaced once it is gone.
    leaving = [p for p, _ in sick]
    kept = tuple(replace(p, deleting=True) if p in leaving else p for p in pods if p not in forced)
    gone = [gang.Replaced(p.member or 0, cause, p.node) for p, cause in (*lost, *sick)]
    return status.model_copy(update={"excluded_nodes": excluded}), events, kept, gone


def escalate(
    kube: Kube,
    run: TrainingRun,
    pods: tuple[PodView, ...],
    lease: LeaseView | None,
    node_checks: NodeChecks,
) -> tuple[TrainingRunStatus | None, list[EventSpec], failures.Found | None]:
    """Find a new failure of the current attempt and climb the escalation ladder.

    Returns the status with the failure and the decision recorded (None when there is no new
    failure), the Warning Event that tells it, and the failure found. Reporting the node
    (suspect, or tainted: `k8s.nodehealth`, per the taint policy) happens here; deleting the
    pod is the lifecycle's, from the recorded status (`lifecycle.moving_off`, Failed).
    """
    status = run.status or TrainingRunStatus()
    # A gang's member 0 stands for its attempt (`policies.lifecycle`).
    current = min(
        (p for p in pods if p.attempt == status.attempt and not p.deleting),
        key=lifecycle.member_order,
        default=None,
    )
    if current is None or lifecycle.given_up(status):
        return None, [], None
    now = datetime.now(UTC)
    ready: bool | None = True
    if lease is not None and lease.holder == current.name and signals.expired(lease, now):
        ready = node_ready(kube, current.node)  # read only then: cycles stay cheap
    seen = failures.Observation(status.attempt, current, lease, ready, now)
    found = failures.detect(status, seen)
    if found is None:
        return None, [], None
    decision = ladder.decide(found.failure, failures.history(status, found), run.spec.recovery)
    generation = run.metadata.generation
    recorded = failures.record(
        status, found, decision, status.attempt, generation, now, run.spec.recovery.backoff
    )
    if decision.taint_node and found.node is not None:
        reporter = f"run {run.metadata.namespace}/{run.metadata.name} (attempt {status.attempt})"
        report_node(kube, node_checks, found.node, found.failure.cause, reporter, now)
    log.info(
        "%s/%s: %s on attempt %s: %s",
        run.metadata.namespace,
        run.metadata.name,
        found.failure.cause,
        status.attempt,
        decision.action,
    )
    message = shorten_bytes(f"{decision.message}; evidence: {found.message}", 900)
    return recorded, [EventSpec(found.failure.cause, message, warning=True)], found


def _with_signals(
    observed: Observed,
    lease: LeaseView | None,
    run: str | None,
    decision: Decision,
    member_leases: tuple[LeaseView, ...] = (),
) -> Observed:
    preflight, staging = initsteps.reports(run or "", observed.attempt, decision.current, lease)
    observed = replace(observed, preflight=preflight, staging=staging)
    if observed.members:
        # Each member's verdict, from its own Lease once this attempt's agent renewed it.
        held = (*member_leases, *([] if lease is None else [lease]))
        verdicts = {
            view.member: view.verdict
            for view in held
            if view.member is not None and signals.renewed_by(view, run or "", observed.attempt)
        }
        generations = gang.member_generations(run or "", observed.attempt, held)
        members = tuple(
            m.model_copy(
                update={"verdict": verdicts.get(m.index), "generation": generations.get(m.index)}
            )
            for m in observed.members
        )
        observed = replace(observed, members=members)
    # Until the new pod's agent renews it, the Lease still speaks of the previous attempt.
    if lease is None or not signals.renewed_by(lease, run or "", observed.attempt):
        return observed
    invalid = findings.reported(run or "", observed.attempt, lease)
    return replace(
        observed,
        verdict=lease.verdict,
        step=lease.step,
        checkpoint_step=lease.saved_step,
        checkpoints=lease.layers,
        invalid_counts=None if invalid is None else invalid.counts,
        last_invalid=None if invalid is None else invalid.last,
        last_restore=parse_restore(lease.restored, observed.attempt),
    )


def converge(
    kube: Kube,
    run: TrainingRun,
    pods: tuple[PodView, ...],
    decision: Decision,
    placement: PlacementDecision | None,
    settings: Settings,
    full: bool,
) -> None:
    """Apply the companions and the pods the decision asks for; delete the pods it drops.

    Pods are created after the env ConfigMap they name; an env ConfigMap that only the
    deleted pods named goes with them (`k8s.envconfigs`).
    """
    create = decision.create and not lifecycle.blocked(placement)
    namespace, name = run.metadata.namespace or "", run.metadata.name
    # Its name and content do not depend on the attempt (`build.envconfig`).
    config = pods_env_config(run, decision.attempt or 1)
    if full or (create and not decision.replace):
        # A member replaced in its attempt finds them in place (a full cycle repairs drift).
        ordered = companions(run)
        leading = [m for m in ordered if m["kind"] not in CONCURRENT_KINDS]
        for manifest in leading:
            apply(kube, manifest)
        # A gang's Leases (one per member) and its Service depend only on the ones before.
        apply_all(kube, [m for m in ordered if m["kind"] in CONCURRENT_KINDS])
    if full or create:
        # Before the pods that name it; a full cycle puts back one deleted under live pods.
        apply(kube, config)
    if decision.delete:
        log.info(
            "%s/%s: deleting pod %s (%s)",
            namespace,
            name,
            lifecycle.pods_text(decision.delete),
            decision.cause,
        )
        concurrently(lambda pod: delete_pod(kube, namespace, pod.name), decision.delete)
    # A pod on a node that is NotReady or gone is never confirmed deleted by a kubelet: it
    # would stay Terminating and block the next attempt forever. Each node is read once.
    leaving = sorted({*decision.delete, *decision.waiting}, key=lambda pod: pod.name)
    nodes = {pod.node for pod in leaving if pod.node is not None}
    lost = {node for node in sorted(nodes) if node_ready(kube, node) is not True}
    stuck = [pod for pod in leaving if pod.node in lost]
    for pod in stuck:
        log.info(
            "%s/%s: force-deleting pod %s on lost node %s", namespace, name, pod.name, pod.node
        )
    concurrently(lambda pod: delete_pod(kube, namespace, pod.name, force=True), stuck)
    if create and decision.attempt is not None:
        excluded = tuple(n.node for n in (run.status or TrainingRunStatus()).excluded_nodes)
        inputs = PodInputs(decision.attempt, excluded, settings.agent_image)
        manifests = gang_pods(run, inputs, decision.replace)
        log.info(
            "%s/%s: creating pod %s%s (%s)",
            namespace,
            name,
            manifests[0]["metadata"]["name"],
            f" and {len(manifests) - 1} more members" if len(manifests) > 1 else "",
            decision.cause,
        )
        concurrently(lambda manifest: create_pod(kube, manifest), manifests)
    if decision.delete:
        dropped = {pod.name for pod in decision.delete}
        kept = [pod for pod in pods if pod.name not in dropped]
        unused = envconfigs.unused(pods, kept, config["metadata"]["name"])
        envconfigs.prune(kube, namespace, name or "", unused)


def report(
    kube: Kube,
    meta: ObjectMeta,
    old: TrainingRunStatus,
    state: RunState,
    observed: Observed,
    extra: list[EventSpec],
    instance: str,
) -> TrainingRunStatus:
    """Write the status once if it changed, then send the cycle's Events; return it."""
    new = advance(old, state, observed, meta.generation, datetime.now(UTC))
    if changed(old, new):
        apply_status(kube, meta, new)
    for event in [*transition_events(old, state, extra), *step_events(old, new)]:
        try:
            events.send(kube, meta, event, instance)
        except KubeError as err:
            # An Event is a report, not state: losing one must not fail the cycle.
            log.warning("could not send event %s: %s", event.reason, err)
    return new
