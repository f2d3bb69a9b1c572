"""The operator's settings: flags of `trainguard operator`, or environment under `kopf run`.

| flag | environment | default |
|---|---|---|
| `--agent-image` | `TRAINGUARD_AGENT_IMAGE` | the trainguard image of this version |
| `--network-csi-driver` (repeat) | `TRAINGUARD_NETWORK_CSI_DRIVERS` (comma-separated) | none |
| `--resync-seconds` | `TRAINGUARD_RESYNC_SECONDS` | 30 |
| `--workers` | `TRAINGUARD_WORKERS` | 16 |
| `--kubeconfig` | `KUBECONFIG` | in-cluster, else ~/.kube/config |
| `--taint-policy` | `TRAINGUARD_TAINT_POLICY` | `confirmed` (see `policies.nodehealth`) |
| `--node-check-namespace` | `TRAINGUARD_NODE_CHECK_NAMESPACE` | its own (in a pod), else default |
| `--node-recheck-seconds` | `TRAINGUARD_NODE_RECHECK_SECONDS` | 60 (doubled per failed check) |
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainguard.operator.build.constants import DEFAULT_AGENT_IMAGE
from trainguard.operator.policies.nodehealth import DEFAULT_RECHECK_SECONDS, TaintPolicy
from trainguard.operator.policies.placement import NetworkList

ENV_AGENT_IMAGE = "TRAINGUARD_AGENT_IMAGE"
ENV_NETWORK_CSI_DRIVERS = "TRAINGUARD_NETWORK_CSI_DRIVERS"
ENV_RESYNC_SECONDS = "TRAINGUARD_RESYNC_SECONDS"
ENV_WORKERS = "TRAINGUARD_WORKERS"
ENV_KUBECONFIG = "KUBECONFIG"
ENV_TAINT_POLICY = "TRAINGUARD_TAINT_POLICY"
ENV_NODE_CHECK_NAMESPACE = "TRAINGUARD_NODE_CHECK_NAMESPACE"
ENV_NODE_RECHECK_SECONDS = "TRAINGUARD_NODE_RECHECK_SECONDS"
# In a pod, the namespace of its service account (the operator's own).
IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DEFAULT_RESYNC_SECONDS = 30.0
DEFAULT_WORKERS = 16


@dataclass(frozen=True)
class OperatorConfig:
    """What the operator needs beyond the runs themselves."""

    agent_image: str = DEFAULT_AGENT_IMAGE
    network: NetworkList = field(default_factory=NetworkList)
    # Every run is reconciled again this often, to notice what no watch reports (a PVC
    # fixed under a refused run, a failed write that was not retried).
    resync_seconds: float = DEFAULT_RESYNC_SECONDS
    # Threads for the blocking client; one apiserver connection each.
    workers: int = DEFAULT_WORKERS
    kubeconfig: str | None = None
    # Reported in Events as the reporting instance.
    instance: str = field(default_factory=socket.gethostname)
    taint_policy: TaintPolicy = TaintPolicy.CONFIRMED
    node_check_namespace: str = field(default_factory=lambda: own_namespace())
    node_recheck_seconds: float = DEFAULT_RECHECK_SECONDS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> OperatorConfig:
        """Settings from the environment, defaults for what it leaves out."""
        drivers = [d.strip() for d in environ.get(ENV_NETWORK_CSI_DRIVERS, "").split(",")]
        return cls(
            agent_image=environ.get(ENV_AGENT_IMAGE) or DEFAULT_AGENT_IMAGE,
            network=NetworkList().with_csi_drivers(d for d in drivers if d),
            resync_seconds=float(environ.get(ENV_RESYNC_SECONDS) or DEFAULT_RESYNC_SECONDS),
            workers=int(environ.get(ENV_WORKERS) or DEFAULT_WORKERS),
            kubeconfig=environ.get(ENV_KUBECONFIG) or None,
            taint_policy=TaintPolicy(environ.get(ENV_TAINT_POLICY) or TaintPolicy.CONFIRMED),
            node_check_namespace=environ.get(ENV_NODE_CHECK_NAMESPACE) or own_namespace(),
            node_recheck_seconds=float(
                environ.get(ENV_NODE_RECHECK_SECONDS) or DEFAULT_RECHECK_SECONDS
            ),
        )


def own_namespace(path: str = IN_CLUSTER_NAMESPACE_FILE) -> str:
    """The namespace this process runs in as a pod, else `default`."""
    try:
        with open(path) as file:
            return file.read().strip() or "default"
    except OSError:
        return "default"
