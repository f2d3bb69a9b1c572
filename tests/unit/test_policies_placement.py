"""The placement guard: which volumes are on the hot path, what makes one a network volume."""

from __future__ import annotations

from typing import Any

import pytest
from run_factory import make_run

from trainguard.api.constants import NetworkVolumes
from trainguard.operator.policies.placement import (
    HotPathClaim,
    HotPathVolume,
    NetworkList,
    guard,
    hot_path_claims,
    network_evidence,
)

pytestmark = pytest.mark.unit

NETWORK = NetworkList()
RWO = frozenset({"ReadWriteOnce"})


def volume(**facts: Any) -> HotPathVolume:
    return HotPathVolume(volume="data", mount_path="/trainguard/data", claim="shards", **facts)


EVIDENCE: list[tuple[str, HotPathVolume, str | None]] = [
    ("NFS PV", volume(pv="pv-1", pv_source="nfs", access_modes=RWO), "PV pv-1 is nfs"),
    ("CephFS PV", volume(pv="pv-1", pv_source="cephfs"), "PV pv-1 is cephfs"),
    ("GlusterFS PV", volume(pv="pv-1", pv_source="glusterfs"), "PV pv-1 is glusterfs"),
    (
        "NFS CSI driver on the list",
        volume(pv="pv-1", pv_source="csi", driver="nfs.csi.k8s.io"),
        "CSI driver nfs.csi.k8s.io is on the network list",
    ),
    (
        "EFS CSI driver on the list",
        volume(pv="pv-1", pv_source="csi", driver="efs.csi.aws.com"),
        "CSI driver efs.csi.aws.com is on the network list",
    ),
    (
        "MooseFS by name",
        volume(pv="pv-1", pv_source="csi", driver="csi.mfs.moosefs.example"),
        "CSI driver csi.mfs.moosefs.example names moosefs",
    ),
    (
        "MooseFS flexVolume",
        volume(pv="pv-1", pv_source="flexVolume", driver="example/MooseFS"),
        "names moosefs",
    ),
    (
        "NFS provisioner of an unbound claim",
        volume(storage_class="nfs", provisioner="cluster.local/nfs-subdir-external-provisioner"),
        "provisioner cluster.local/nfs-subdir-external-provisioner names nfs",
    ),
    (
        "ReadWriteMany on any backend",
        volume(
            pv="pv-1",
            pv_source="csi",
            driver="block.example.com",
            access_modes=frozenset({"ReadWriteMany"}),
        ),
        "ReadWriteMany",
    ),
    ("local PV", volume(pv="pv-1", pv_source="local", access_modes=RWO), None),
    ("hostPath PV", volume(pv="pv-1", pv_source="hostPath"), None),
    (
        "block CSI",
        volume(pv="pv-1", pv_source="csi", driver="ebs.csi.aws.com", access_modes=RWO),
        None,
    ),
    ("nothing known (claim missing)", volume(), None),
]


@pytest.mark.parametrize(("facts", "why"), [c[1:] for c in EVIDENCE], ids=[c[0] for c in EVIDENCE])
def test_network_evidence(facts: HotPathVolume, why: str | None) -> None:
    found = network_evidence(facts, NETWORK)
    if why is None:
        assert found is None
    else:
        assert found is not None and why in found


def test_the_network_list_is_configurable() -> None:
    facts = volume(pv="pv-1", pv_source="csi", driver="weka.csi.example")
    assert network_evidence(facts, NETWORK) is None
    assert network_evidence(facts, NETWORK.with_csi_drivers(["weka.csi.example"])) is not None


NFS = volume(pv="pv-nfs", pv_source="nfs")
LOCAL = volume(pv="pv-local", pv_source="local")


@pytest.mark.parametrize(
    ("mode", "facts", "action"),
    [
        ("Forbid", [NFS], NetworkVolumes.FORBID),
        ("Warn", [NFS], NetworkVolumes.WARN),
        ("Allow", [NFS], NetworkVolumes.ALLOW),
        ("Forbid", [LOCAL], NetworkVolumes.ALLOW),
        ("Forbid", [], NetworkVolumes.ALLOW),
    ],
)
def test_guard_acts_per_spec(mode: str, facts: list[HotPathVolume], action: NetworkVolumes) -> None:
    spec = make_run({"placement": {"networkVolumes": mode}}).spec
    assert guard(spec, facts, NETWORK).action is action


def test_forbid_names_the_volume_and_the_mount() -> None:
    decision = guard(make_run().spec, [LOCAL, NFS], NETWORK)
    assert decision.action is NetworkVolumes.FORBID
    assert [f.volume for f in decision.findings] == ["data"]
    message = decision.message()
    assert "volume data (claim shards, mounted at /trainguard/data)" in message
    assert "PV pv-nfs is nfs" in message
    assert "local disk" in message


def test_a_trusted_local_class_is_not_questioned() -> None:
    spec = make_run({"placement": {"localStorageClassName": "fast-local"}}).spec
    facts = volume(storage_class="fast-local", provisioner="example.com/nfs-local-cache")
    assert guard(spec, [facts], NETWORK).action is NetworkVolumes.ALLOW


CLAIMS: list[tuple[str, dict[str, Any], list[HotPathClaim]]] = [
    ("no data, emptyDir L1", {}, []),
    (
        "staged data is copied, not on the hot path",
        {"data": {"source": {"pvc": {"claimName": "shards"}}}},
        [],
    ),
    (
        "data read in place",
        {"data": {"source": {"pvc": {"claimName": "shards"}}, "stage": False, "mountPath": "/d"}},
        [HotPathClaim("data", "/d", claim="shards")],
    ),
    (
        "local-volume L1",
        {
            "checkpoints": {
                "l1": {"storage": {"localVolume": {"storageClassName": "lv", "size": "1Ti"}}}
            }
        },
        [HotPathClaim("l1", "/trainguard/l1", storage_class="lv")],
    ),
    (
        "remote layer volumes are never on the hot path",
        {"checkpoints": {"remote": [{"name": "b", "uri": "file:///b", "claimName": "nfs"}]}},
        [],
    ),
]


@pytest.mark.parametrize(("changes", "claims"), [c[1:] for c in CLAIMS], ids=[c[0] for c in CLAIMS])
def test_hot_path_claims(changes: dict[str, Any], claims: list[HotPathClaim]) -> None:
    assert list(hot_path_claims(make_run(changes).spec)) == claims
