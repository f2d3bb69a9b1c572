"""Fixtures of the operator's end-to-end tests (`pytest_plugins = ("operator_fixtures",)`).

- `trainingrun_crd` (session): the checked-in CRD, applied and Established;
- `node_pool`: kwok GPU nodes of the test's own, labelled with the test's namespace, so
  runs can be pinned to them (`pool_run(pool)`) and tests never disturb each other or
  the shared nodes; deleted afterwards;
- `process_nodes`: the shared process-backed nodes, restored after the test: control files
  (`down`, `gpu-sim.json`, ...) removed, the `trainguard.dev/unhealthy` taint lifted, and
  every node Ready again, so a scenario that breaks a node leaves nothing behind;
- `operator`: `trainguard operator` watching the test's namespace; on failure its log,
  `kubectl describe` of the namespace's runs and pods, and the Events are printed. Every
  scenario runs twice: as the cluster admin, and with only the token of the ServiceAccount
  the Helm chart installs (its RBAC, bound to the test's namespace), which shows the
  chart's RBAC suffices for everything the operator does. Its node checks run in the test's
  namespace (as the admin) or the release's (as the chart's account); the taint policy is
  the default (`confirmed`) unless the test is marked `taint_policy("immediate")`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from operator_proc import AGENT_IMAGE, CRD_FILE, POOL_LABEL, RESYNC_SECONDS, diagnostics

from chart import install, token_kubeconfig, uninstall
from trainguard.api.constants import CRD_NAME, LABEL_NODE_HEALTH, TAINT_UNHEALTHY
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.nodes import PROCESS_NODE_LABEL, gpu_node
from trainguard_dev.testing.processes import OperatorProcess

# Tainted nodes are checked again this soon (the product's default is a minute).
NODE_RECHECK_SECONDS = 3


def release_node(cluster: Cluster, name: str) -> None:
    """Whatever trainguard holds of a node (its taint, label, annotations) undone."""
    cluster.kubectl("taint", "node", name, f"{TAINT_UNHEALTHY}-", check=False)
    cluster.kubectl("label", "node", name, f"{LABEL_NODE_HEALTH}-", check=False)


@pytest.fixture(scope="session")
def trainingrun_crd(cluster: Cluster) -> str:
    """The TrainingRun CRD, installed (or updated) and Established."""
    cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=trainguard-tests",
        "-f",
        str(CRD_FILE),
    )
    cluster.wait_established(CRD_NAME)
    return CRD_NAME


@pytest.fixture
def node_pool(cluster: Cluster, namespace: str) -> Iterator[str]:
    """Two kwok GPU nodes of this test's own, labelled with its pool (= its namespace)."""
    names = [f"{namespace}-gpu-{i}" for i in range(2)]
    nodes = []
    for name in names:
        node = gpu_node(name)
        node["metadata"]["labels"][POOL_LABEL] = namespace
        nodes.append(node)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(nodes))
    try:
        yield namespace
    finally:
        cluster.kubectl("delete", "node", *names, "--wait=false", check=False)


@pytest.fixture
def process_nodes(cluster: Cluster) -> Iterator[list[str]]:
    """The process-backed nodes' names; whatever a test did to them is undone afterwards."""
    listed = cluster.kubectl(
        "get",
        "nodes",
        "-l",
        f"{PROCESS_NODE_LABEL}=true",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    )
    names = sorted(listed.stdout.split())
    try:
        yield names
    finally:
        for name in names:
            control = cluster.root / "procnodes" / name
            for entry in control.iterdir() if control.is_dir() else []:
                if entry.is_file():
                    entry.unlink()
            release_node(cluster, name)
        if names:
            cluster.kubectl(
                "wait", "--for=condition=Ready", *(f"node/{n}" for n in names), "--timeout=60s",
                timeout=90,
            )  # fmt: skip


@pytest.fixture(params=["admin", "chart-rbac"])
def operator(
    cluster: Cluster,
    namespace: str,
    trainingrun_crd: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[OperatorProcess]:
    """The operator, running, watching this test's namespace; diagnostics on failure."""
    release = None
    kubeconfig = None
    if request.param == "chart-rbac":
        release = install(cluster, {"operator": {"watchNamespaces": [namespace]}})
        kubeconfig = token_kubeconfig(cluster, release, tmp_path / "operator-kubeconfig")
    marker = request.node.get_closest_marker("taint_policy")
    policy = marker.args[0] if marker is not None else "confirmed"
    checks = release.namespace if release is not None else namespace
    process = OperatorProcess(
        kubeconfig or cluster.kubeconfig,
        [namespace],
        tmp_path / "operator.log",
        resync_seconds=RESYNC_SECONDS,
        agent_image=AGENT_IMAGE,
        extra_args=[
            f"--taint-policy={policy}",
            f"--node-check-namespace={checks}",
            f"--node-recheck-seconds={NODE_RECHECK_SECONDS}",
        ],
    )
    process.start()
    failed_before = request.session.testsfailed
    try:
        yield process
    finally:
        if request.session.testsfailed > failed_before or os.environ.get("TRAINGUARD_E2E_LOGS"):
            print(diagnostics(cluster, namespace, process))
        process.stop()
        if release is not None:
            uninstall(cluster, release)
