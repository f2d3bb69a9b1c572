"""The operator's own node check: a pod on one node, in the operator's namespace.

It runs `trainguard preflight` from the agent's image on a scratch volume of the node's local
disk (a test file written, fsynced, read back and hashed: integrity and bandwidth) and on all
the node's GPUs (memory in use while no pod holds them: what a dead process left behind).
Nothing of a tenant runs in it, so its verdict is evidence the tenant does not control
(`trainguard.operator.policies.nodehealth`). Pinned by `nodeName` and tolerating every taint:
it runs on a tainted node, which is the point of a re-check. It holds no credentials; its
result is its exit code and termination message, which the kubelet reports.
"""

from __future__ import annotations

import hashlib
from typing import Any

from trainguard.api.constants import (
    ANNOTATION_CHECKED_NODE,
    COMPONENT_NODE_CHECK,
    GPU_RESOURCE,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)
from trainguard.contract import env
from trainguard.operator.build.constants import TMP_DIR

CHECK_DIR = "/trainguard/check"
CHECK_VOLUME_BYTES = "512Mi"
CHECK_TEST_SIZE = "64Mi"
CHECK_MARGIN = "64Mi"
NAME_PREFIX = "trainguard-check-"
MAX_NAME = 63


def check_pod_name(node: str) -> str:
    """The check pod of `node` (one at a time): readable where the name allows, else hashed."""
    name = NAME_PREFIX + node
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{name[: MAX_NAME - 11].rstrip('-.')}-{digest}"


def check_pod(
    node: str, namespace: str, image: str, gpus: int, gpu_max_used_mib: float
) -> dict[str, Any]:
    """The check pod of `node`; `gpus`: the node's allocatable GPUs, all requested."""
    resources: dict[str, Any] = {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }
    if gpus > 0:
        resources["requests"][GPU_RESOURCE] = str(gpus)
        resources["limits"][GPU_RESOURCE] = str(gpus)
    command = [
        "trainguard", "preflight",
        "--l1", CHECK_DIR,
        "--test-size", CHECK_TEST_SIZE,
        "--keep", "0",
        "--margin", CHECK_MARGIN,
        "--gpu-max-used-mib", f"{gpu_max_used_mib:g}",
    ]  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": check_pod_name(node),
            "namespace": namespace,
            "labels": {LABEL_COMPONENT: COMPONENT_NODE_CHECK, LABEL_MANAGED_BY: MANAGED_BY},
            "annotations": {ANNOTATION_CHECKED_NODE: node},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 5,
            "tolerations": [{"operator": "Exists"}],
            "securityContext": {
                "runAsNonRoot": True,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": COMPONENT_NODE_CHECK,
                    "image": image,
                    "command": command,
                    # Its report lands on the scratch volume; the verdict is the exit code.
                    "env": [{"name": env.STATE_DIR, "value": f"{CHECK_DIR}/state"}],
                    "resources": resources,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "runAsNonRoot": True,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "volumeMounts": [
                        {"name": "check", "mountPath": CHECK_DIR},
                        {"name": "tmp", "mountPath": TMP_DIR},
                    ],
                }
            ],
            "volumes": [
                {"name": "check", "emptyDir": {"sizeLimit": CHECK_VOLUME_BYTES}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
            ],
        },
    }
