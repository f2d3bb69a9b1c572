"""The RoleBinding that grants the run's Role to the run's ServiceAccount."""

from __future__ import annotations

from typing import Any

from trainguard.api import TrainingRun
from trainguard.api.constants import COMPONENT_RBAC
from trainguard.operator.build.meta import child_meta, run_name
from trainguard.operator.build.names import rbac_name, run_labels


def role_binding(run: TrainingRun) -> dict[str, Any]:
    """The run's RoleBinding."""
    name = run_name(run)
    rbac = rbac_name(name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": child_meta(run, rbac, run_labels(name, COMPONENT_RBAC)),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": rbac},
        "subjects": [{"kind": "ServiceAccount", "name": rbac, "namespace": run.metadata.namespace}],
    }
