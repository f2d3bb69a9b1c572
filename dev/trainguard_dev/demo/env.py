"""What `trainguard demo` sets up on the local control plane before the run starts.

The generated CRD; on process-backed nodes, the operator's identity exactly as the Helm chart
grants it (the chart's ServiceAccount and RBAC, rendered by the pinned helm and applied, and a
kubeconfig holding only that ServiceAccount's token) and the operator as a local process
watching the demo's namespace; the claims of the run (its remote layer's, and on real nodes
its data's), hostPath volumes every node reaches; and the run itself, from
``examples/demo.yaml`` with the demo's own data (synthetic token shards). The operator
process, the shards and the run's manifest are built by `trainguard_dev.testing`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from trainguard.api.constants import CRD_NAME
from trainguard_dev import crdgen
from trainguard_dev.cluster.cluster import Cluster, ClusterError
from trainguard_dev.cluster.procnode import claim_dir, shared_claim
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import example_run, file_data

Obj = dict[str, Any]

RELEASE = "trainguard"
OPERATOR_NAMESPACE = "trainguard-system"
# The chart's identity for the operator: its account, RBAC and the admission policies that
# keep each run's heartbeat Lease to the run's own agent.
RBAC_KINDS = (
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)
FIELD_MANAGER = "trainguard-demo"
TOKEN_DURATION = "24h"
# The operator re-reads every run this often: short, so the demo never waits on a resync.
RESYNC_SECONDS = 3
# Procnode ignores images; the agent and init steps run from this installation.
AGENT_IMAGE = "trainguard:demo"
HELM_TIMEOUT_SECONDS = 120
CLAIM_BOUND_TIMEOUT = "60s"


def source_tree() -> Path:
    """The repository root: the demo needs its chart and example manifest."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "charts" / "trainguard" / "Chart.yaml").exists():
        raise ClusterError(
            "trainguard demo runs from the trainguard source tree (it uses charts/trainguard "
            "and examples/demo.yaml); run it as ./hack/demo.sh from a clone"
        )
    return root


def install_crd(cluster: Cluster) -> None:
    """Apply the CRD generated from the API models and wait until it is Established."""
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
        "-f", "-", input=crdgen.crd_yaml(),
    )  # fmt: skip
    cluster.wait_established(CRD_NAME)


def ensure_namespace(cluster: Cluster, name: str) -> None:
    """Create the namespace unless it exists."""
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def chart_rbac(repo: Path, helm: Path, watch_namespace: str) -> list[Obj]:
    """The chart's account, RBAC and admission policies for an operator watching one namespace."""
    if not helm.exists():
        raise ClusterError(f"helm is missing in {helm.parent}; run ./hack/setup.sh first")
    values = {"operator": {"watchNamespaces": [watch_namespace]}}
    result = subprocess.run(
        [str(helm), "template", RELEASE, str(repo / "charts" / "trainguard"),
         "--namespace", OPERATOR_NAMESPACE, "--values", "-"],
        input=yaml.safe_dump(values), capture_output=True, text=True,
        timeout=HELM_TIMEOUT_SECONDS, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise ClusterError(f"helm template of charts/trainguard failed:\n{result.stderr}")
    objects = [o for o in yaml.safe_load_all(result.stdout) if o and o["kind"] in RBAC_KINDS]
    for obj in objects:
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            obj["metadata"].setdefault("namespace", OPERATOR_NAMESPACE)
    return objects


def token_kubeconfig(
    cluster: Cluster, namespace: str, account: str, path: Path, duration: str = TOKEN_DURATION
) -> Path:
    """Write a kubeconfig that authenticates with one ServiceAccount's token only."""
    token = cluster.kubectl(
        "create", "token", account, "-n", namespace, f"--duration={duration}"
    ).stdout.strip()
    admin = json.loads(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["name"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": server, "user": account}}],
        "current-context": "operator",
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def operator_identity(
    cluster: Cluster, repo: Path, namespace: str, workdir: Path
) -> tuple[str, Path]:
    """Apply the chart's RBAC for `namespace`; return its ServiceAccount and token kubeconfig."""
    ensure_namespace(cluster, OPERATOR_NAMESPACE)
    objects = chart_rbac(repo, cluster.bin_dir / "helm", namespace)
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
        "-f", "-", input=yaml.safe_dump_all(objects),
    )  # fmt: skip
    (account,) = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    path = token_kubeconfig(cluster, OPERATOR_NAMESPACE, account, workdir / "operator-kubeconfig")
    return account, path


def operator_process(kubeconfig: Path, namespace: str, log_path: Path) -> OperatorProcess:
    """The operator (not started yet), watching the demo's namespace only."""
    return OperatorProcess(
        kubeconfig,
        [namespace],
        log_path,
        resync_seconds=RESYNC_SECONDS,
        agent_image=AGENT_IMAGE,
        # Its node checks go where the chart's Role lets them: the operator's namespace.
        extra_args=[f"--node-check-namespace={OPERATOR_NAMESPACE}"],
    )


def demo_run(name: str, shards: Path) -> Obj:
    """examples/demo.yaml with the demo's run name and data source."""
    return example_run("demo", name, {"data": file_data(shards)})


def backup_claim() -> str:
    """The PVC of examples/demo.yaml's remote layer, which the demo creates."""
    (layer,) = example_run("demo")["spec"]["checkpoints"]["remote"]
    return str(layer["claimName"])


def backup_dir(cluster: Cluster, namespace: str) -> Path:
    """Where the remote layer's volume is kept: the demo's "remote storage"."""
    return claim_dir(cluster.root, namespace, backup_claim())


def create_claim(cluster: Cluster, namespace: str, claim: str) -> None:
    """Create `claim`, bound to a hostPath volume every node reaches, and wait until Bound."""
    objects = shared_claim(cluster.root, namespace, claim)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    cluster.kubectl(
        "wait", "--for=jsonpath={.status.phase}=Bound", f"pvc/{claim}", "-n", namespace,
        f"--timeout={CLAIM_BOUND_TIMEOUT}", timeout=90,
    )  # fmt: skip
