"""What the recovery scenarios on process-backed nodes share beyond `trainguard_dev.testing`.

A run of the reference trainer (`reference_run`) reads synthetic shards staged from a
file:// source and is pinned to the process-backed nodes, so its pod runs as real local
processes; the test reaches the trainer through the pod's state directory (`pods.state_dir`:
heartbeat, supervisor state, stack dumps) on the node's directory. These two read the
apiserver: the pod of an attempt once it is bound, and the run's status.
"""

from __future__ import annotations

from typing import Any

from operator_proc import get_json, pods_of

from trainguard.api.constants import LABEL_ATTEMPT
from trainguard_dev.cluster.cluster import Cluster


def bound_pod(cluster: Cluster, namespace: str, run: str, attempt: int = 1) -> Any:
    """The run's pod of `attempt` once it is bound to a node, else None."""
    for pod in pods_of(cluster, namespace, run):
        labels = pod["metadata"].get("labels") or {}
        if labels.get(LABEL_ATTEMPT) == str(attempt) and pod["spec"].get("nodeName"):
            return pod
    return None


def status_of(cluster: Cluster, namespace: str, run: str) -> dict[str, Any]:
    """The run's status (empty until the operator wrote one)."""
    status: dict[str, Any] = get_json(cluster, "tr", run, "-n", namespace).get("status") or {}
    return status
