"""Manifests of the simulated GPU nodes that kwok manages in the local control plane."""

from __future__ import annotations

from typing import Any

NODE_PREFIX = "gpu-node-"
PROCESS_NODE_PREFIX = "proc-node-"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
PROCESS_NODE_LABEL = "trainguard.dev/process-backed"
# One H200-class node, with room for several runs' local disk.
DEFAULT_CPU = "32"
DEFAULT_MEMORY = "256Gi"
DEFAULT_EPHEMERAL_STORAGE = "400Gi"
DEFAULT_PODS = "110"
GPU_PRODUCT = "NVIDIA-H200"
GPU_MEMORY_MIB = "143771"


def node_name(index: int) -> str:
    """The name of the index-th kwok GPU node."""
    return f"{NODE_PREFIX}{index}"


def process_node_name(index: int) -> str:
    """The name of the index-th process-backed GPU node."""
    return f"{PROCESS_NODE_PREFIX}{index}"


def gpu_node(
    name: str,
    gpus: int = 8,
    cpu: str = DEFAULT_CPU,
    memory: str = DEFAULT_MEMORY,
    ephemeral_storage: str = DEFAULT_EPHEMERAL_STORAGE,
    process_backed: bool = False,
) -> dict[str, Any]:
    """A Node with GPU capacity and the labels a GPU node carries.

    kwok simulates its kubelet, unless `process_backed`: then the process-backed node
    runtime (trainguard_dev.cluster.procnode) runs its pods as local processes.
    """
    resources = {
        "cpu": cpu,
        "memory": memory,
        "ephemeral-storage": ephemeral_storage,
        "pods": DEFAULT_PODS,
        "nvidia.com/gpu": str(gpus),
    }
    annotations = {} if process_backed else {KWOK_ANNOTATION: "fake"}
    labels = {PROCESS_NODE_LABEL: "true"} if process_backed else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": annotations,
            "labels": {
                **labels,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "node.kubernetes.io/instance-type": f"gpu-{gpus}x-h200",
                "topology.kubernetes.io/zone": "local",
                # Labels that NVIDIA's GPU feature discovery puts on a GPU node.
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.memory": GPU_MEMORY_MIB,
            },
        },
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
