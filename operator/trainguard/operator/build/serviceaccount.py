"""The ServiceAccount a training pod runs as (its agent renews the Lease with it)."""

from __future__ import annotations

from typing import Any

from trainguard.api import TrainingRun
from trainguard.api.constants import COMPONENT_RBAC
from trainguard.operator.build.meta import child_meta, run_name
from trainguard.operator.build.names import rbac_name, run_labels


def service_account(run: TrainingRun) -> dict[str, Any]:
    """The run's ServiceAccount."""
    name = run_name(run)
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": child_meta(run, rbac_name(name), run_labels(name, COMPONENT_RBAC)),
    }
