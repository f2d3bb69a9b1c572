"""trainguard installed from its Helm chart, as a user installs it, on a cluster with real nodes.

`install_chart` runs ``helm upgrade --install`` of ``charts/trainguard`` as it is, with the
operator image built here (already in the nodes: pull policy Never), watching the given
namespaces and pinned by a node selector; `restricted_namespace` makes a namespace that
enforces Pod Security `restricted`, where the release and the runs live. The real-node tests
and `trainguard demo --real-nodes` install trainguard this one way.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainguard_dev.cluster.cluster import Cluster

CHART = Path(__file__).resolve().parents[3] / "charts" / "trainguard"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
HOSTNAME_LABEL = "kubernetes.io/hostname"
HELM_TIMEOUT_SECONDS = 300
READY_TIMEOUT = "240s"


def restricted_namespace(cluster: Cluster, name: str) -> None:
    """Create (or relabel) a namespace that enforces Pod Security `restricted`."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": RESTRICTED},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def helm(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the pinned helm against the cluster; CalledProcessError when it fails."""
    return subprocess.run(
        [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True, text=True, check=True, timeout=HELM_TIMEOUT_SECONDS,
    )  # fmt: skip


def install_chart(
    cluster: Cluster,
    image_ref: str,
    *,
    release: str,
    namespace: str,
    watch_namespaces: Sequence[str],
    node_selector: Mapping[str, str],
    resync_seconds: int,
    node_recheck_seconds: int | None = None,
) -> None:
    """`helm upgrade --install` the chart as it is, with `image_ref`; wait until it is Ready.

    `node_recheck_seconds` shortens the chart's back-off of tainted nodes' re-checks.
    """
    recheck = [] if node_recheck_seconds is None else [
        "--set", f"operator.nodeRecheckSeconds={node_recheck_seconds}"
    ]  # fmt: skip
    repository, tag = image_ref.rsplit(":", 1)
    helm(
        cluster, "upgrade", "--install", release, str(CHART),
        "--namespace", namespace, "--wait", "--timeout", READY_TIMEOUT,
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", "image.pullPolicy=Never",
        "--set", f"operator.watchNamespaces={{{','.join(watch_namespaces)}}}",
        "--set", f"operator.resyncSeconds={resync_seconds}",
        "--set-json", f"nodeSelector={json.dumps(dict(node_selector))}",
        *recheck,
    )  # fmt: skip


def uninstall_chart(cluster: Cluster, release: str, namespace: str) -> None:
    """`helm uninstall` the release."""
    helm(cluster, "uninstall", release, "--namespace", namespace)
