"""Node loss, end to end: the node of a run vanishes; the run moves to another node.

The run ships each verified checkpoint to a `file://` remote layer on a PVC that both
process-backed nodes reach, as network storage (`shared_claim`). Its node A goes away (the
procnode `down` control file: every process on it dies at once and its heartbeats stop), so the
agent stops renewing the run's Lease, and after the cluster's node-monitor grace period
the controller-manager marks A NotReady. Lease expired with the node NotReady: the
operator taints A, lists it in `status.excludedNodes`, force-deletes the pod that no
kubelet will ever confirm deleted, and creates attempt 2, which the scheduler places on
node B; its restore step fetches the newest checkpoint from the remote layer and training
goes on there from that step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, events_of, get_json, pods_of
from recovery_helpers import bound_pod, status_of

from trainguard.api.constants import TAINT_UNHEALTHY
from trainguard.contract.files import read_json
from trainguard_dev.cluster.cluster import NODE_MONITOR_GRACE, Cluster
from trainguard_dev.cluster.procnode import claim_dir, shared_claim
from trainguard_dev.testing.pods import checkpointed, heartbeat, state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EVERY_STEPS = 20
LEASE_S = 5
# NotReady comes at most one node heartbeat after the grace period; then a resync cycle.
NOT_READY_BOUND_S = int(NODE_MONITOR_GRACE.rstrip("s")) + 30
BACKUP_CLAIM = "backup"


def _shipped(remote: Path) -> int | None:
    """The newest step in the remote layer with its manifest written (verified copy)."""
    steps = [
        int(d.name.split("-")[1]) for d in remote.glob("*/step-*") if (d / "MANIFEST.json").exists()
    ]
    steps += [
        int(d.name.split("-")[1]) for d in remote.glob("step-*") if (d / "MANIFEST.json").exists()
    ]
    return max(steps) if steps else None


def _ready(cluster: Cluster, node: str) -> bool:
    conditions = get_json(cluster, "node", node)["status"].get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture
def remote(cluster: Cluster, namespace: str) -> Iterator[Path]:
    """The remote layer's PVC, bound to a volume both nodes reach; yields its directory here."""
    volume, pvc = shared_claim(cluster.root, namespace, BACKUP_CLAIM)
    apply(cluster, namespace, volume, pvc)
    try:
        yield claim_dir(cluster.root, namespace, BACKUP_CLAIM)
    finally:
        cluster.kubectl("delete", "pv", volume["metadata"]["name"], "--wait=false", check=False)


@pytest.mark.parametrize("operator", ["chart-rbac"], indirect=True)
def test_a_lost_node_moves_the_run_to_another_node_restored_from_the_remote_layer(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
    remote: Path,
) -> None:
    assert len(process_nodes) >= 2, process_nodes
    shards = make_shards(tmp_path / "shards")
    layer = {
        "name": "backup",
        "uri": "file:///backup",
        "claimName": BACKUP_CLAIM,
        "contents": "full",
    }
    run = reference_run(
        "lost",
        shards,
        EVERY_STEPS,
        {
            "checkpoints": {"remote": [layer]},
            "monitor": {"startupGraceSeconds": 5, "leaseDurationSeconds": LEASE_S},
            "recovery": {"backoff": {"initialSeconds": 1, "maxSeconds": 2}},
        },
    )
    apply(cluster, namespace, run)
    pod = eventually(lambda: bound_pod(cluster, namespace, "lost"), what="attempt 1 bound")
    node_a = pod["spec"]["nodeName"]
    state = state_dir(cluster.root, pod)
    eventually(lambda: checkpointed(state, 2 * EVERY_STEPS), timeout=120, what="checkpoints")
    shipped = eventually(lambda: _shipped(remote), timeout=60, what="a checkpoint shipped")
    before = heartbeat(state)
    assert before is not None

    (cluster.root / "procnodes" / node_a / "down").touch()
    down_at = time.monotonic()

    eventually(lambda: not _ready(cluster, node_a), timeout=NOT_READY_BOUND_S, what="A NotReady")

    def moved() -> dict[str, Any] | None:
        status = status_of(cluster, namespace, "lost")
        last = status.get("lastFailure") or {}
        return status if last.get("cause") == "LeaseExpired" and last.get("attempt") == 1 else None

    status = eventually(moved, timeout=30, what="LeaseExpired recorded")
    assert status["lastFailure"]["node"] == node_a
    assert [e["node"] for e in status["excludedNodes"]] == [node_a], status
    taints = get_json(cluster, "node", node_a)["spec"].get("taints") or []
    assert any(t["key"] == TAINT_UNHEALTHY and t["value"] == "LeaseExpired" for t in taints)

    # The pod on the lost node is force-deleted; attempt 2 lands on another node.
    second = eventually(
        lambda: bound_pod(cluster, namespace, "lost", attempt=2), timeout=60, what="attempt 2 bound"
    )
    node_b = second["spec"]["nodeName"]
    assert node_b != node_a
    moved_s = time.monotonic() - down_at
    assert [p["metadata"]["name"] for p in pods_of(cluster, namespace, "lost")] == ["lost-2"]

    # Restored from the remote layer, and training on from there.
    state_b = state_dir(cluster.root, second)
    restore = eventually(lambda: read_json(state_b / "restore.json"), timeout=60, what="restore")
    assert restore["from_layer"] == "backup" and restore["step"] >= shipped, restore

    def training_on_b() -> dict[str, Any] | None:
        beat = heartbeat(state_b)
        return beat if beat and (beat.get("step") or 0) > restore["step"] else None

    eventually(training_on_b, timeout=90, what="training on node B")
    final = eventually(
        lambda: (s := status_of(cluster, namespace, "lost")).get("node") == node_b and s,
        timeout=30,
        what="status on node B",
    )
    assert final["attempt"] == 2 and final["restarts"] == 1, final
    reasons = {e["reason"] for e in events_of(cluster, namespace, "lost")}
    assert {"LeaseExpired", "Restored"} <= reasons, reasons
    print(f"node lost -> attempt 2 bound on {node_b}: {moved_s:.1f} s")
