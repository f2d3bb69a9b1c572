"""Nodes: whether one is Ready, and the taint that keeps every run off an unhealthy one."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from trainguard.api.constants import ANNOTATION_UNHEALTHY_SINCE, TAINT_EFFECT, TAINT_UNHEALTHY
from trainguard.api.status import RFC3339
from trainguard.operator.k8s.client import MERGE_PATCH, Kube, KubeError, object_path


def _node(kube: Kube, name: str) -> dict[str, Any] | None:
    try:
        return kube.request("GET", object_path("v1", "nodes", None, name))
    except KubeError as err:
        if err.not_found:
            return None
        raise


def node_ready(kube: Kube, name: str | None) -> bool | None:
    """Whether the node is Ready; None when it is gone (or the pod has none)."""
    node = _node(kube, name) if name else None
    if node is None:
        return None
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def taint_unhealthy(kube: Kube, name: str, reason: str, now: datetime) -> bool:
    """Taint the node `trainguard.dev/unhealthy=<reason>:NoSchedule`; False if it is gone.

    Idempotent: a node that already carries the taint (with any reason) is left as it is.
    The patch names the node's resourceVersion, so a concurrent change of its taints makes
    it fail with a conflict (retried by the cycle) instead of dropping that change.
    """
    node = _node(kube, name)
    if node is None:
        return False
    taints = node.get("spec", {}).get("taints") or []
    if any(t.get("key") == TAINT_UNHEALTHY for t in taints):
        return True
    taint = {"key": TAINT_UNHEALTHY, "value": reason, "effect": TAINT_EFFECT}
    patch = {
        "metadata": {
            "resourceVersion": node["metadata"]["resourceVersion"],
            "annotations": {ANNOTATION_UNHEALTHY_SINCE: now.strftime(RFC3339)},
        },
        "spec": {"taints": [*taints, taint]},
    }
    kube.request("PATCH", object_path("v1", "nodes", None, name), patch, None, MERGE_PATCH)
    return True
