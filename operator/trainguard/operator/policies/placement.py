"""The placement guard: the hot path (data shards, L1 checkpoints) stays off network volumes.

Incident 1 (INCIDENTS.md): a MooseFS volume under the data and the checkpoints corrupted a
35 GB checkpoint on close and hung dataloader reads. So every volume the trainer reads or
writes during training must be an emptyDir or a node-local PersistentVolume. The guard sees
the facts a reader gathered by following PVC -> PV -> StorageClass (`HotPathVolume`) and
decides, per `spec.placement.networkVolumes`: Forbid (the default: no pod), Warn (a pod and
a Warning event) or Allow.

Network means: an NFS, CephFS or GlusterFS PV source (and the other in-tree network
filesystems), a CSI driver on the configurable list, a driver or provisioner whose name
names a network filesystem (MooseFS and friends), or a ReadWriteMany access mode. A
StorageClass named in `spec.placement.localStorageClassName` is trusted as local.

Which volumes are on the hot path: the data PVC when it is read in place (`data.stage:
false`) and a local-volume L1. A staged data source is read once by the `stage-data` step,
and a remote layer's volume is mounted into the agent only: neither is on the hot path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from trainguard.api import TrainingRunSpec
from trainguard.api.constants import NetworkVolumes
from trainguard.operator.build.constants import Volume

# In-tree PersistentVolume sources that are network filesystems.
NETWORK_PV_SOURCES = frozenset({"nfs", "cephfs", "glusterfs", "azureFile", "quobyte"})
# CSI drivers of network filesystems (exact names); extend with
# `trainguard operator --network-csi-driver NAME`.
DEFAULT_NETWORK_CSI_DRIVERS = frozenset(
    {
        "nfs.csi.k8s.io",
        "cephfs.csi.ceph.com",
        "efs.csi.aws.com",
        "fsx.csi.aws.com",
        "s3.csi.aws.com",
        "filestore.csi.storage.gke.io",
        "gcsfuse.csi.storage.gke.io",
        "file.csi.azure.com",
        "blob.csi.azure.com",
        "csi.juicefs.com",
        "csi.moosefs.com",
        "moosefs.csi.k8s.io",
        "org.gluster.glusterfs",
        "beegfs.csi.netapp.com",
        "lustre.csi.hpe.com",
    }
)
# Names that mark a driver or provisioner as a network filesystem wherever they appear
# (e.g. `cluster.local/nfs-subdir-external-provisioner`, `moosefs.example.com/csi`).
NETWORK_NAME_MARKERS = ("nfs", "cephfs", "glusterfs", "moosefs", "lustre", "juicefs", "beegfs")
READ_WRITE_MANY = "ReadWriteMany"


@dataclass(frozen=True)
class NetworkList:
    """What counts as a network volume (documented defaults, extended by configuration)."""

    csi_drivers: frozenset[str] = DEFAULT_NETWORK_CSI_DRIVERS
    pv_sources: frozenset[str] = NETWORK_PV_SOURCES
    name_markers: tuple[str, ...] = NETWORK_NAME_MARKERS

    def with_csi_drivers(self, extra: Iterable[str]) -> NetworkList:
        """The list with more CSI driver names."""
        return NetworkList(self.csi_drivers | frozenset(extra), self.pv_sources, self.name_markers)


@dataclass(frozen=True)
class HotPathClaim:
    """A PVC the trainer would mount on its hot path, before anything is read about it."""

    volume: str
    mount_path: str
    claim: str | None = None
    # A claim the pod creates from this class (an ephemeral L1 volume) rather than a PVC.
    storage_class: str | None = None


@dataclass(frozen=True)
class HotPathVolume:
    """What the reader found about one hot-path volume (None: not known, e.g. not bound)."""

    volume: str
    mount_path: str
    claim: str | None = None
    storage_class: str | None = None
    provisioner: str | None = None
    pv: str | None = None
    pv_source: str | None = None
    driver: str | None = None
    access_modes: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Finding:
    """A network volume on the hot path, with what gave it away."""

    volume: str
    mount_path: str
    claim: str | None
    why: str

    def describe(self) -> str:
        """One sentence naming the volume, its mount and the evidence."""
        claim = f"claim {self.claim}, " if self.claim else ""
        return f"volume {self.volume} ({claim}mounted at {self.mount_path}) is {self.why}"


@dataclass(frozen=True)
class PlacementDecision:
    """Allow: create the pod. Warn: create it and warn. Forbid: no pod."""

    action: NetworkVolumes
    findings: tuple[Finding, ...] = ()

    def message(self) -> str:
        """The findings and what to do about them, for a condition or an Event."""
        found = "; ".join(f.describe() for f in self.findings)
        advice = (
            "the hot path must be on local disk: stage the data (data.stage: true), use an "
            "emptyDir or a local-volume L1, or set spec.placement.networkVolumes"
        )
        return f"{found}; {advice}" if found else ""


def hot_path_claims(spec: TrainingRunSpec) -> tuple[HotPathClaim, ...]:
    """The PVC-backed volumes the trainer would use during training."""
    claims: list[HotPathClaim] = []
    data = spec.data
    if data is not None and not data.stage and data.source.pvc is not None:
        claims.append(HotPathClaim(Volume.DATA, data.mount_path, claim=data.source.pvc.claim_name))
    local = spec.checkpoints.l1.storage.local_volume
    if local is not None:
        storage_class = local.storage_class_name or spec.placement.local_storage_class_name
        claims.append(
            HotPathClaim(Volume.L1, spec.checkpoints.l1.mount_path, storage_class=storage_class)
        )
    return tuple(claims)


def network_evidence(volume: HotPathVolume, network: NetworkList) -> str | None:
    """Why this volume is a network volume, or None when nothing says it is."""
    if volume.pv_source in network.pv_sources:
        return f"a network filesystem: PV {volume.pv} is {volume.pv_source}"
    for kind, name in (("CSI driver", volume.driver), ("provisioner", volume.provisioner)):
        if name is None:
            continue
        if name in network.csi_drivers:
            return f"a network filesystem: {kind} {name} is on the network list"
        lowered = name.lower()
        marker = next((m for m in network.name_markers if m in lowered), None)
        if marker is not None:
            return f"a network filesystem: {kind} {name} names {marker}"
    if READ_WRITE_MANY in volume.access_modes:
        return "shared: access mode ReadWriteMany means a network volume"
    return None


def guard(
    spec: TrainingRunSpec, volumes: Iterable[HotPathVolume], network: NetworkList
) -> PlacementDecision:
    """The placement decision for the hot-path volumes a reader found."""
    trusted = spec.placement.local_storage_class_name
    findings = []
    for volume in volumes:
        if trusted is not None and volume.storage_class == trusted:
            continue
        why = network_evidence(volume, network)
        if why is not None:
            findings.append(Finding(volume.volume, volume.mount_path, volume.claim, why))
    if not findings:
        return PlacementDecision(NetworkVolumes.ALLOW)
    return PlacementDecision(spec.placement.network_volumes, tuple(findings))
