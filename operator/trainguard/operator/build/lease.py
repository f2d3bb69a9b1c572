"""The run's heartbeat Lease, which the agent renews with its verdict.

The operator owns only the Lease's existence, labels and duration; the agent's renewals
(holder, renew time, verdict annotations) are written by the agent and never applied here,
so the operator's forced apply does not take them over.

Each member of a gang has its own Lease (member 0's is the run's `<run>-heartbeat`), labelled
with its index, so no two agents renew one Lease.
"""

from __future__ import annotations

from typing import Any

from trainguard.api import TrainingRun
from trainguard.api.constants import COMPONENT_HEARTBEAT, LABEL_MEMBER
from trainguard.contract.env import lease_name
from trainguard.operator.build.meta import child_meta, run_name
from trainguard.operator.build.names import run_labels


def lease(run: TrainingRun, member: int | None = None) -> dict[str, Any]:
    """The run's `<run>-heartbeat` Lease, or gang member `member`'s."""
    name = run_name(run)
    labels = run_labels(name, COMPONENT_HEARTBEAT)
    if member is not None:
        labels[LABEL_MEMBER] = str(member)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": child_meta(run, lease_name(name, member or 0), labels),
        "spec": {"leaseDurationSeconds": run.spec.monitor.lease_duration_seconds},
    }


def leases(run: TrainingRun) -> list[dict[str, Any]]:
    """Every heartbeat Lease of the run: its own, or one per gang member."""
    nodes = run.spec.trainer.nodes
    return [lease(run)] if nodes == 1 else [lease(run, m) for m in range(nodes)]
