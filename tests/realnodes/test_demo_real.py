"""`trainguard demo --real-nodes --json` on real nodes: the same story, and honest figures.

One cluster with real nodes runs on a host at a time, and the session's is it: the demo runs
on that cluster (`--name`), as a user runs it on theirs. It installs its own release of the
chart (`trainguard-demo`, watching only the demo's namespace, so the session's operator and
this one never reconcile the same runs), its namespace and its two claims; the test removes
them afterwards. The images it imports are the session's, found by content.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from demo_story import assert_story
from realnodes.conftest import RealCluster
from trainguard.api.constants import LABEL_NODE_HEALTH, TAINT_UNHEALTHY
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.procnode import claim_dir
from trainguard_dev.demo import env as demo_env
from trainguard_dev.demo.nodes import RELEASE, SHARDS_CLAIM, RealNodes
from trainguard_dev.testing import chart

pytestmark = [pytest.mark.realnodes, pytest.mark.timeout(1500)]

TRAINGUARD = Path(sys.executable).parent / "trainguard"
# A cold image build takes minutes; a warm demo a few.
DEMO_TIMEOUT_SECONDS = 1200
NAMESPACE = "trainguard-demo"
# From the kill (sent with `kubectl exec`, whose start counts) to Dead in the status.
DEAD_DETECT_BOUND_S = 15.0
# Ghost memory is judged once the dead trainer's memory outlives
# monitor.ghostMemory.releaseTimeoutSeconds (30 s by default), or earlier by a new trainer.
GHOST_DETECT_BOUND_S = 30.0 + 20.0
LOG_TAIL_CHARS = 6000


def _remove_demo(cluster: Cluster) -> None:
    """The demo's run, release, namespace and volumes, its ghost memory and its taint.

    The cluster and its nodes stay, healthy again, for the session's other tests.
    """
    cluster.kubectl(
        "delete", "trainingruns", "--all", "-n", NAMESPACE, "--ignore-not-found",
        "--timeout=120s", timeout=150, check=False,
    )  # fmt: skip
    with contextlib.suppress(subprocess.CalledProcessError):
        chart.uninstall_chart(cluster, RELEASE, demo_env.OPERATOR_NAMESPACE)
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    volumes = [
        claim_dir(cluster.root, NAMESPACE, c).name for c in (demo_env.backup_claim(), SHARDS_CLAIM)
    ]
    cluster.kubectl("delete", "pv", *volumes, "--ignore-not-found", "--wait=false", check=False)
    nodes = RealNodes(cluster)
    for node in nodes.names():
        nodes.reset(node)
        cluster.kubectl("taint", "node", node, f"{TAINT_UNHEALTHY}-", check=False)
        cluster.kubectl("label", "node", node, f"{LABEL_NODE_HEALTH}-", check=False)


def _demo(cluster: Cluster) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [str(TRAINGUARD), "demo", "--real-nodes", "--json", "--name", cluster.name],
        capture_output=True, text=True, timeout=DEMO_TIMEOUT_SECONDS, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        log = cluster.root / "demo" / "operator.log"
        tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if log.exists() else ""
        pytest.fail(
            f"demo failed ({done.returncode}):\n{done.stderr[-8000:]}\n--- operator ---\n{tail}"
        )
    summary: dict[str, Any] = json.loads(done.stdout)  # nothing else on stdout
    return summary, done.stderr


def test_demo_on_real_nodes_shows_both_recoveries(real_cluster: RealCluster) -> None:
    cluster = real_cluster.cluster
    try:
        summary, narration = _demo(cluster)
        selector = f"app.kubernetes.io/instance={RELEASE}"
        listed = cluster.kubectl(
            "get", "pods", "-n", demo_env.OPERATOR_NAMESPACE, "-l", selector, "-o", "json"
        )
        operator = json.loads(listed.stdout)["items"]
    finally:
        _remove_demo(cluster)
    assert_story(summary, dead_bound_s=DEAD_DETECT_BOUND_S, ghost_bound_s=GHOST_DETECT_BOUND_S)
    real = {n.name for n in cluster.real_nodes.nodes()}
    for recovery in summary["recoveries"]:
        assert {recovery["node_before"], recovery["node_after"]} <= real, recovery
    # The operator ran in-cluster, from the chart, on a real node.
    (pod,) = operator
    assert pod["spec"]["nodeName"] in real
    assert "real nodes" in narration and "in-cluster" in narration
    assert "silent death" in narration and "ghost VRAM" in narration
