"""Placement: network volumes on the hot path are refused or warned about.

And a run that fits no node says why instead of sitting silently in Pending.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from operator_proc import apply, condition, events_of, get_json, pods_of, pool_run

from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
pytest_plugins = ("operator_fixtures",)

# How a volume source looks in a PersistentVolume, per network filesystem under test.
SOURCES: dict[str, dict[str, Any]] = {
    "nfs": {"nfs": {"server": "nas.example", "path": "/export/shards"}},
    "moosefs": {"csi": {"driver": "csi.moosefs.com", "volumeHandle": "shards"}},
}


def _bound_claim(cluster: Cluster, namespace: str, claim: str, source: str) -> str:
    """A PVC bound to a PersistentVolume of the given source; returns the PV's name."""
    pv = f"{namespace}-{claim}"
    size = {"storage": "100Gi"}
    objects = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": size,
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "claimRef": {"namespace": namespace, "name": claim},
                **SOURCES[source],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": size},
            },
        },
    ]
    apply(cluster, namespace, *objects)
    return pv


@pytest.fixture
def network_claims(cluster: Cluster, namespace: str) -> Iterator[None]:
    """PVCs `nfs-shards` and `moosefs-shards`, bound to PVs of those filesystems."""
    pvs = [_bound_claim(cluster, namespace, f"{s}-shards", s) for s in SOURCES]
    eventually(
        lambda: all(
            get_json(cluster, "pvc", f"{s}-shards", "-n", namespace)["status"].get("phase")
            == "Bound"
            for s in SOURCES
        ),
        30,
        "the claims to bind",
    )
    try:
        yield
    finally:
        cluster.kubectl("delete", "pv", *pvs, "--wait=false", check=False)


def _run(name: str, pool: str, claim: str, mode: str) -> dict[str, Any]:
    data = {"source": {"pvc": {"claimName": claim}}, "stage": False}
    return pool_run(pool, name, {"data": data, "placement": {"networkVolumes": mode}})


def _progressing(cluster: Cluster, namespace: str, name: str, reason: str) -> dict[str, Any] | None:
    run = get_json(cluster, "trainingrun", name, "-n", namespace)
    found = condition(run, "Progressing")
    return run if found is not None and found["reason"] == reason else None


@pytest.mark.usefixtures("network_claims")
def test_network_volumes_on_the_hot_path(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    apply(
        cluster,
        namespace,
        _run("nfs-forbid", node_pool, "nfs-shards", "Forbid"),
        _run("moosefs-forbid", node_pool, "moosefs-shards", "Forbid"),
        _run("nfs-warn", node_pool, "nfs-shards", "Warn"),
    )
    for name, evidence in (
        ("nfs-forbid", f"PV {namespace}-nfs-shards is nfs"),
        ("moosefs-forbid", "CSI driver csi.moosefs.com is on the network list"),
    ):
        run = eventually(
            lambda n=name: _progressing(cluster, namespace, n, "NetworkVolumeOnHotPath"),
            30,
            f"{name} to be refused",
        )
        found = condition(run, "Progressing")
        assert found is not None and found["status"] == "False"
        claim = name.split("-")[0] + "-shards"
        assert f"volume data (claim {claim}, mounted at /trainguard/data)" in found["message"]
        assert evidence in found["message"]
        assert run["status"]["phase"] == "Pending"
        assert pods_of(cluster, namespace, name) == []
        warnings = [e for e in events_of(cluster, namespace, name) if e["type"] == "Warning"]
        assert [e["reason"] for e in warnings] == ["NetworkVolumeOnHotPath"]

    [pod] = eventually(lambda: pods_of(cluster, namespace, "nfs-warn"), 30, "the warned pod")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "nfs-shards", "readOnly": True}
    warnings = eventually(
        lambda: [
            e
            for e in events_of(cluster, namespace, "nfs-warn")
            if e["type"] == "Warning" and e["reason"] == "NetworkVolumeOnHotPath"
        ],
        30,
        "the Warning event",
    )
    assert "mounted at /trainguard/data" in warnings[0]["message"]
    # The refused runs stay refused: no pod appeared meanwhile.
    assert pods_of(cluster, namespace, "nfs-forbid") == []


def test_a_run_no_node_can_hold_says_why(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    # 3 x 1 TiB of checkpoints on local disk; the pool's nodes have 400 GiB each.
    run = pool_run(node_pool, "huge", {"checkpoints": {"size": "1Ti"}})
    apply(cluster, namespace, run)
    found_run = eventually(
        lambda: _progressing(cluster, namespace, "huge", "Unschedulable"), 60, "Unschedulable"
    )
    found = condition(found_run, "Progressing")
    assert found is not None and found["status"] == "False"
    assert "Insufficient ephemeral-storage" in found["message"]
    assert found["message"].startswith("pod huge-1 cannot be scheduled: ")
    assert found_run["status"]["phase"] == "Pending"
    assert found_run["status"]["attempt"] == 1
    events = events_of(cluster, namespace, "huge")
    assert any(
        e["type"] == "Warning"
        and e["reason"] == "Unschedulable"
        and "ephemeral-storage" in e["message"]
        for e in events
    )
