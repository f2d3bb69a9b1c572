"""Nodes: whether one is Ready (tainting and untainting: `trainguard.operator.k8s.nodehealth`)."""

from __future__ import annotations

from typing import Any

from trainguard.operator.k8s.client import Kube, KubeError, object_path


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
    return ready_condition(node).get("status") == "True"


def ready_condition(node: dict[str, Any]) -> dict[str, Any]:
    """The node's Ready condition ({} when it reports none)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    return ready
