"""Node health on the cluster: suspect, check, taint, re-check, untaint (the policy: `nodehealth`).

A run's report of a sick node reaches `report_node` (from the escalation ladder). The node is
then labelled `trainguard.dev/node-health=suspect|unhealthy` with the reason as an annotation,
and `health_pass` (every few seconds, from the operator's loop) looks at the labelled nodes
only: it starts a node's check pod (`trainguard.operator.build.nodecheck`) when one is due,
reads it when it ends, deletes it, and taints, untaints or keeps the node. Every step is an
Event on the Node, and the node's annotations say why it is held and when it was last checked
(`kubectl describe node`). A taint someone else set (another key, or ours without the label)
is never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainguard.api.constants import (
    ANNOTATION_CHECKED_NODE,
    ANNOTATION_NODE_CHECKED_BOOT_ID,
    ANNOTATION_NODE_FAILED_CHECKS,
    ANNOTATION_NODE_LAST_CHECK,
    ANNOTATION_NODE_LAST_CHECK_TIME,
    ANNOTATION_NODE_REASON,
    ANNOTATION_UNHEALTHY_SINCE,
    COMPONENT_NODE_CHECK,
    GPU_RESOURCE,
    LABEL_COMPONENT,
    LABEL_NODE_HEALTH,
    TAINT_EFFECT,
    TAINT_UNHEALTHY,
    Reason,
)
from trainguard.api.status import RFC3339
from trainguard.operator.build.constants import FIELD_MANAGER
from trainguard.operator.build.nodecheck import check_pod, check_pod_name
from trainguard.operator.k8s.client import MERGE_PATCH, Kube, KubeError, object_path
from trainguard.operator.k8s.nodes import ready_condition
from trainguard.operator.k8s.pods import create_pod
from trainguard.operator.policies import nodehealth
from trainguard.operator.policies.nodehealth import (
    Action,
    CheckResult,
    Health,
    NodeRecord,
    Outcome,
    TaintPolicy,
)

log = logging.getLogger(__name__)
MESSAGE_LIMIT = 900
# The apiserver keeps Events about cluster-scoped objects (Nodes) in this namespace only.
NODE_EVENTS_NAMESPACE = "default"


@dataclass(frozen=True)
class NodeChecks:
    """The operator's settings for node health."""

    policy: TaintPolicy
    namespace: str  # where check pods go: the operator's own
    image: str
    recheck_seconds: float = nodehealth.DEFAULT_RECHECK_SECONDS
    gpu_max_used_mib: float = nodehealth.DEFAULT_CHECK_GPU_MAX_USED_MIB
    instance: str = FIELD_MANAGER


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, RFC3339).replace(tzinfo=UTC)
    except ValueError:
        return None


def _stamp(moment: datetime) -> str:
    return moment.strftime(RFC3339)


def _node_path(name: str) -> str:
    return object_path("v1", "nodes", None, name)


def record_of(node: dict[str, Any]) -> NodeRecord | None:
    """The node's health record, None when trainguard holds nothing of it."""
    meta = node.get("metadata") or {}
    label = (meta.get("labels") or {}).get(LABEL_NODE_HEALTH)
    if label not in set(Health):
        return None
    notes = meta.get("annotations") or {}
    ready = ready_condition(node)
    last = notes.get(ANNOTATION_NODE_LAST_CHECK, "")
    outcome = next((o for o in Outcome if last.startswith(o.value + ":")), None)
    failed = notes.get(ANNOTATION_NODE_FAILED_CHECKS, "0")
    return NodeRecord(
        health=Health(label),
        ready=ready.get("status") == "True",
        boot_id=str(((node.get("status") or {}).get("nodeInfo") or {}).get("bootID") or ""),
        ready_since=_time(ready.get("lastTransitionTime")),
        last_check=_time(notes.get(ANNOTATION_NODE_LAST_CHECK_TIME)),
        last_outcome=outcome,
        checked_boot_id=notes.get(ANNOTATION_NODE_CHECKED_BOOT_ID, ""),
        failed_checks=int(failed) if failed.isdigit() else 0,
    )


def node_event(
    kube: Kube,
    checks: NodeChecks,
    node: dict[str, Any],
    reason: str,
    message: str,
    warning: bool,
) -> None:
    """An Event on the Node (`kubectl describe node` lists it)."""
    meta = node["metadata"]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}",
            "namespace": NODE_EVENTS_NAMESPACE,
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": meta["name"],
            "uid": meta.get("uid", ""),
        },
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "type": "Warning" if warning else "Normal",
        "source": {"component": FIELD_MANAGER},
        "reportingComponent": FIELD_MANAGER,
        "reportingInstance": checks.instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        kube.request("POST", object_path("v1", "events", NODE_EVENTS_NAMESPACE, None), body)
    except KubeError as err:  # an Event is worth a log line, never a failed pass
        log.warning("Event %s on node %s: %s", reason, meta["name"], err)


def _patch_node(
    kube: Kube,
    node: dict[str, Any],
    labels: dict[str, str | None],
    annotations: dict[str, str | None],
    taints: list[dict[str, Any]] | None = None,
) -> None:
    # The resourceVersion makes a concurrent change of the node's taints a conflict
    # (retried by the next pass) instead of a lost write.
    patch: dict[str, Any] = {
        "metadata": {
            "resourceVersion": node["metadata"]["resourceVersion"],
            "labels": labels,
            "annotations": annotations,
        }
    }
    if taints is not None:
        patch["spec"] = {"taints": taints}
    kube.request("PATCH", _node_path(node["metadata"]["name"]), patch, None, MERGE_PATCH)


def _taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def _with_taint(node: dict[str, Any], cause: str) -> list[dict[str, Any]]:
    taints = _taints(node)
    if any(t.get("key") == TAINT_UNHEALTHY for t in taints):
        return taints
    return [*taints, {"key": TAINT_UNHEALTHY, "value": cause, "effect": TAINT_EFFECT}]


def _without_taint(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in _taints(node) if t.get("key") != TAINT_UNHEALTHY]


def _cause(node: dict[str, Any]) -> str:
    reason = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_NODE_REASON)
    return (reason or Reason.NODE_TAINTED.value).split(" ", 1)[0]


def report_node(
    kube: Kube, checks: NodeChecks, name: str, cause: str, reporter: str, now: datetime
) -> Health | None:
    """A run (`reporter`: namespace/name, attempt) found node `name` sick, for `cause`.

    Returns what the node now is cluster-wide (None: nothing, by the policy, or it is gone).
    A node already held keeps its first reason.
    """
    health = nodehealth.on_report(checks.policy, cause)
    if health is None:
        return None
    node = kube.get(_node_path(name))
    if node is None:
        return None
    held = record_of(node)
    if held is not None and (held.health is Health.UNHEALTHY or health is Health.SUSPECT):
        return held.health
    reason = f"{cause} reported by {reporter} at {_stamp(now)}"
    annotations: dict[str, str | None] = {ANNOTATION_NODE_REASON: reason}
    if health is Health.UNHEALTHY:
        annotations[ANNOTATION_UNHEALTHY_SINCE] = _stamp(now)
        _patch_node(
            kube, node, {LABEL_NODE_HEALTH: health.value}, annotations, _with_taint(node, cause)
        )
        why = "the node is lost" if cause in nodehealth.CONTROL_PLANE_CAUSES else "policy"
        node_event(
            kube, checks, node, Reason.NODE_TAINTED, f"{reason}; tainted at once ({why})", True
        )
    else:
        # A fresh suspicion: the node's earlier checks say nothing about it.
        annotations[ANNOTATION_NODE_LAST_CHECK] = None
        annotations[ANNOTATION_NODE_LAST_CHECK_TIME] = None
        annotations[ANNOTATION_NODE_FAILED_CHECKS] = None
        _patch_node(kube, node, {LABEL_NODE_HEALTH: health.value}, annotations)
        node_event(
            kube,
            checks,
            node,
            Reason.NODE_SUSPECTED,
            f"{reason}; checking the node before tainting it for every run",
            True,
        )
    log.info("node %s: %s (%s)", name, health.value, reason)
    return health


def _check_pod_path(checks: NodeChecks, node: str) -> str:
    return object_path("v1", "pods", checks.namespace, check_pod_name(node))


def _start_check(kube: Kube, checks: NodeChecks, node: dict[str, Any]) -> None:
    name = node["metadata"]["name"]
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    gpus = str(allocatable.get(GPU_RESOURCE, "0"))
    pod = check_pod(
        name,
        checks.namespace,
        checks.image,
        int(gpus) if gpus.isdigit() else 0,
        checks.gpu_max_used_mib,
    )
    create_pod(kube, pod)  # one already there is read on the next pass
    log.info("node %s: node check started", name)


def _finish_check(
    kube: Kube,
    checks: NodeChecks,
    node: dict[str, Any],
    record: NodeRecord,
    result: CheckResult,
    now: datetime,
) -> Action:
    name = node["metadata"]["name"]
    action = nodehealth.after_check(record.health, result)
    # Consecutive failed checks drive the back-off; a check that did not run changes nothing.
    failed = {
        Outcome.FAILED: record.failed_checks + 1,
        Outcome.NOT_RUN: record.failed_checks,
    }.get(result.outcome, 0)
    annotations: dict[str, str | None] = {
        ANNOTATION_NODE_LAST_CHECK: f"{result.outcome.value}: {result.message}"[:MESSAGE_LIMIT],
        ANNOTATION_NODE_LAST_CHECK_TIME: _stamp(now),
        ANNOTATION_NODE_CHECKED_BOOT_ID: record.boot_id,
        ANNOTATION_NODE_FAILED_CHECKS: str(failed),
    }
    cause = _cause(node)
    if action is Action.TAINT:
        annotations[ANNOTATION_UNHEALTHY_SINCE] = _stamp(now)
        labels: dict[str, str | None] = {LABEL_NODE_HEALTH: Health.UNHEALTHY.value}
        _patch_node(kube, node, labels, annotations, _with_taint(node, cause))
        node_event(
            kube,
            checks,
            node,
            Reason.NODE_TAINTED,
            f"{cause} confirmed by the node check: {result.message}; tainted "
            f"{TAINT_UNHEALTHY}={cause}:{TAINT_EFFECT}",
            True,
        )
    elif action in (Action.UNTAINT, Action.CLEAR):
        annotations.update({ANNOTATION_NODE_REASON: None, ANNOTATION_UNHEALTHY_SINCE: None})
        taints = _without_taint(node) if action is Action.UNTAINT else None
        _patch_node(kube, node, {LABEL_NODE_HEALTH: None}, annotations, taints)
        if action is Action.UNTAINT:
            node_event(
                kube,
                checks,
                node,
                Reason.NODE_UNTAINTED,
                f"node check passed: {result.message}; taint {TAINT_UNHEALTHY} removed",
                False,
            )
        else:
            node_event(
                kube,
                checks,
                node,
                Reason.NODE_CHECK_PASSED,
                f"{cause} not confirmed by the node check: {result.message}; not tainted",
                False,
            )
    else:
        _patch_node(kube, node, {}, annotations)
        if result.outcome is Outcome.FAILED:
            after = nodehealth.recheck_delay(
                dataclasses.replace(record, failed_checks=failed), checks.recheck_seconds
            )
            node_event(
                kube,
                checks,
                node,
                Reason.NODE_CHECK_FAILED,
                f"still unhealthy: {result.message}; next check in {after:g} s or after a reboot",
                True,
            )
        elif record.last_outcome is not Outcome.NOT_RUN:  # told once, not every retry
            node_event(kube, checks, node, Reason.NODE_CHECK_NOT_RUN, result.message, True)
    log.info("node %s: check %s (%s): %s", name, result.outcome.value, result.message, action)
    return action


def check_node(kube: Kube, checks: NodeChecks, node: dict[str, Any], now: datetime) -> None:
    """One step of one held node: read its running check, or start one when due."""
    record = record_of(node)
    if record is None:
        return
    path = _check_pod_path(checks, node["metadata"]["name"])
    pod = kube.get(path)
    if pod is not None:
        started = _time((pod.get("metadata") or {}).get("creationTimestamp"))
        result = nodehealth.judge(pod, now, started)
        if result.outcome is Outcome.RUNNING:
            return
        kube.request("DELETE", path, {"gracePeriodSeconds": 0})
        _finish_check(kube, checks, node, record, result, now)
        return
    if nodehealth.check_due(record, now, checks.recheck_seconds):
        _start_check(kube, checks, node)


def health_pass(kube: Kube, checks: NodeChecks, held_before: frozenset[str]) -> frozenset[str]:
    """Look at every node trainguard holds (labelled): check, taint, untaint as due.

    Returns the nodes held now; `held_before` is the last pass's answer: check pods are
    listed (to remove those whose node was released, by a pass or by hand) only while some
    node is or was held, so an idle operator costs the apiserver one list of nodes a pass.
    """
    listed = kube.request(
        "GET", object_path("v1", "nodes", None, None), query={"labelSelector": LABEL_NODE_HEALTH}
    )
    items = listed.get("items") or []
    held = frozenset(node["metadata"]["name"] for node in items)
    for node in items:
        try:
            check_node(kube, checks, node, datetime.now(UTC))
        except KubeError as err:  # one node's trouble never stops the others'
            log.warning("node %s: %s", node["metadata"]["name"], err)
    if held or held_before:
        _remove_orphans(kube, checks, held)
    return held


def _remove_orphans(kube: Kube, checks: NodeChecks, held: frozenset[str]) -> None:
    # A check pod whose node is no longer held has nobody to read it.
    pods = kube.request(
        "GET",
        object_path("v1", "pods", checks.namespace, None),
        query={"labelSelector": f"{LABEL_COMPONENT}={COMPONENT_NODE_CHECK}"},
    )
    for pod in pods.get("items") or []:
        node = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_CHECKED_NODE)
        if node not in held:
            with contextlib.suppress(KubeError):
                kube.request(
                    "DELETE",
                    object_path("v1", "pods", checks.namespace, pod["metadata"]["name"]),
                    {"gracePeriodSeconds": 0},
                )
