"""The headless Service of a gang: its subdomain gives every member a stable name.

Member m's pod sets `hostname: <run>-<m>` and `subdomain: <run>-gang`, so the cluster DNS
answers `<run>-<m>.<run>-gang` with the address of whichever attempt's pod holds the index now
(the Kubernetes convention JobSet and Kubeflow Trainer use). The Service selects on the run's
label alone, so every attempt's members are found without re-applying it; it publishes members
that are not Ready yet, because member 0 must be reachable while the gang's rendezvous is still
forming (no pod is Ready before its trainer runs). A one-pod run has none.
"""

from __future__ import annotations

from typing import Any

from trainguard.api import TrainingRun
from trainguard.api.constants import COMPONENT_GANG, LABEL_RUN
from trainguard.contract.env import DEFAULT_MASTER_PORT
from trainguard.operator.build.meta import child_meta, run_name
from trainguard.operator.build.names import gang_service_name, run_labels

RENDEZVOUS_PORT_NAME = "rendezvous"


def gang_service(run: TrainingRun) -> dict[str, Any]:
    """The run's `<run>-gang` Service: headless, not-ready members published."""
    name = run_name(run)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_meta(run, gang_service_name(name), run_labels(name, COMPONENT_GANG)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_RUN: name},
            "ports": [
                {
                    "name": RENDEZVOUS_PORT_NAME,
                    "port": DEFAULT_MASTER_PORT,
                    "targetPort": DEFAULT_MASTER_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }
