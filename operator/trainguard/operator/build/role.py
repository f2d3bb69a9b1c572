"""The Role of a run's pods: only what the agent needs, scoped to the run's own Leases."""

from __future__ import annotations

from typing import Any

from trainguard.api import TrainingRun
from trainguard.api.constants import COMPONENT_RBAC
from trainguard.contract.env import lease_name
from trainguard.operator.build.meta import child_meta, run_name
from trainguard.operator.build.names import rbac_name, run_labels


def role(run: TrainingRun) -> dict[str, Any]:
    """The run's Role: get/update/patch its Leases (by name), create Events. Nothing else.

    A gang's members share it (one ServiceAccount per run): it names every member's Lease.
    """
    name = run_name(run)
    names = [lease_name(name, m) for m in range(run.spec.trainer.nodes)]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": child_meta(run, rbac_name(name), run_labels(name, COMPONENT_RBAC)),
        "rules": [
            # The agent renews the heartbeat Lease with its verdict (a patch); `create` is not
            # granted: the operator creates the Lease before the pod.
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": names,
                "verbs": ["get", "update", "patch"],
            },
            # The agent reports what it sees (stack dumps of a hung trainer, shipping) as Events.
            {
                "apiGroups": ["", "events.k8s.io"],
                "resources": ["events"],
                "verbs": ["create"],
            },
        ],
    }
