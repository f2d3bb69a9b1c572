"""The run's heartbeat Lease, which the agent renews with its verdict.

The operator owns only the Lease's existence, labels and duration; the agent's renewals
(holder, renew time, verdict annotations) are written by the agent and never applied here,
so the operator's forced apply does not take them over.
"""

from __future__ import annotations

from typing import Any

from trainguard.api import TrainingRun
from trainguard.api.constants import COMPONENT_HEARTBEAT
from trainguard.contract.env import lease_name
from trainguard.operator.build.meta import child_meta, run_name
from trainguard.operator.build.names import run_labels


def lease(run: TrainingRun) -> dict[str, Any]:
    """The run's `<run>-heartbeat` Lease."""
    name = run_name(run)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": child_meta(run, lease_name(name), run_labels(name, COMPONENT_HEARTBEAT)),
        "spec": {"leaseDurationSeconds": run.spec.monitor.lease_duration_seconds},
    }
