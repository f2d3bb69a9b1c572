"""One reconcile cycle of a run: parse, decide, apply, report.

The steps are the pure functions of the lower layers glued to the API calls:
1. parse the run once (an invalid spec becomes `Failed=True, reason InvalidSpec`);
2. decide from the run and its observed pods which pod it should have (`policies.lifecycle`),
   and what a pod that cannot start lacks (`policies.inputs`);
3. when a pod is to be created, read the hot-path volumes and ask the placement guard;
4. server-side apply the companions (ServiceAccount, Role, RoleBinding, Lease) and the pod,
   delete superseded pods;
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
from trainguard.api.trainingrun import ObjectMeta
from trainguard.operator.build.lease import lease
from trainguard.operator.build.pod import PodInputs, spec_hash, training_pod
from trainguard.operator.build.role import role
from trainguard.operator.build.rolebinding import role_binding
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
from trainguard.operator.k8s import events
from trainguard.operator.k8s.apply import apply, apply_status
from trainguard.operator.k8s.client import Kube, KubeError
from trainguard.operator.k8s.nodehealth import NodeChecks, report_node
from trainguard.operator.k8s.nodes import node_ready
from trainguard.operator.k8s.pods import delete_pod, list_pods, with_mount_failures
from trainguard.operator.k8s.volumes import read_hot_path
from trainguard.operator.policies import (
    backoff,
    failures,
    fencing,
    findings,
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
    """The children besides the pod, in the order they must exist for the pod."""
    return [service_account(run), role(run), role_binding(run), lease(run)]


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
) -> Outcome:
    """Converge one run.

    `full` re-applies the companions even when no pod is created (on create, on a spec
    change and when the operator starts), which repairs drift in them. `written` is the
    status this operator wrote last for the run: only the operator writes status, so it is
    never older than the body's, which a watch may not have delivered yet. `lease` is the
    run's heartbeat Lease as last seen: its verdict and steps go to the status.
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
    decision = lifecycle.decide(run, pods, desired)
    if decision.create and (decision.attempt or 0) > 1:
        # The pods come from a watch, which can lag behind this operator's own writes under
        # load: a pod created moments ago may not be listed yet. Before moving to a next
        # attempt, ask the apiserver itself which pods the run has.
        decision = lifecycle.decide(
            run, list_pods(kube, namespace, run.metadata.name or ""), desired
        )
    now = datetime.now(UTC)
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
    converge(kube, run, decision, placement, settings, full)
    state = lifecycle.state(run, decision, placement)
    if wait > 0:
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
            lifecycle.observed(run, decision, placement), lease, run.metadata.name, decision
        ),
        [*warnings, *fence_events, *lifecycle.extra_events(decision, placement)],
        settings.instance,
    )
    return Outcome(status, retry_after=wait or None)


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
    current = next((p for p in pods if p.attempt == status.attempt and not p.deleting), None)
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
    observed: Observed, lease: LeaseView | None, run: str | None, decision: Decision
) -> Observed:
    preflight, staging = initsteps.reports(run or "", observed.attempt, decision.current, lease)
    observed = replace(observed, preflight=preflight, staging=staging)
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
    decision: Decision,
    placement: PlacementDecision | None,
    settings: Settings,
    full: bool,
) -> None:
    """Apply the companions and the pod the decision asks for; delete the pods it drops."""
    create = decision.create and not lifecycle.blocked(placement)
    namespace, name = run.metadata.namespace or "", run.metadata.name
    if full or create:
        for manifest in companions(run):
            apply(kube, manifest)
    for pod in decision.delete:
        log.info("%s/%s: deleting pod %s (%s)", namespace, name, pod.name, decision.cause)
        delete_pod(kube, namespace, pod.name)
    for pod in {*decision.delete, *decision.waiting}:
        # A pod on a node that is NotReady or gone is never confirmed deleted by a kubelet:
        # it would stay Terminating and block the next attempt forever.
        if pod.node is not None and node_ready(kube, pod.node) is not True:
            log.info(
                "%s/%s: force-deleting pod %s on lost node %s", namespace, name, pod.name, pod.node
            )
            delete_pod(kube, namespace, pod.name, force=True)
    if create and decision.attempt is not None:
        excluded = tuple(n.node for n in (run.status or TrainingRunStatus()).excluded_nodes)
        inputs = PodInputs(decision.attempt, excluded, settings.agent_image)
        manifest = training_pod(run, inputs)
        log.info(
            "%s/%s: creating pod %s (%s)",
            namespace,
            name,
            manifest["metadata"]["name"],
            decision.cause,
        )
        apply(kube, manifest)


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
