"""The placement guard's reader: follows PVC -> PV -> StorageClass and reports what it found.

Reads only; the decision is `trainguard.operator.policies.placement.guard`. A claim that does not
exist yet, or is not bound yet, reports what is known (e.g. only its StorageClass), so the
guard judges by what can be seen; the scheduler then reports an unusable claim on its own.
"""

from __future__ import annotations

from typing import Any

from trainguard.operator.k8s.client import Kube, object_path
from trainguard.operator.policies.placement import HotPathClaim, HotPathVolume

# Keys of a PersistentVolume's spec that are not its volume source.
PV_SPEC_FIELDS = frozenset(
    {
        "accessModes",
        "capacity",
        "claimRef",
        "mountOptions",
        "nodeAffinity",
        "persistentVolumeReclaimPolicy",
        "storageClassName",
        "volumeAttributesClassName",
        "volumeMode",
    }
)


def pv_source(pv: dict[str, Any]) -> tuple[str | None, str | None]:
    """The kind of a PV's volume source (e.g. `nfs`, `csi`, `local`) and its driver, if any."""
    spec = pv.get("spec", {})
    kind = next((key for key in spec if key not in PV_SPEC_FIELDS), None)
    driver = None
    if kind in ("csi", "flexVolume"):
        driver = spec[kind].get("driver")
    return kind, driver


def read_volume(kube: Kube, namespace: str, claim: HotPathClaim) -> HotPathVolume:
    """Everything the apiserver says about one hot-path claim."""
    modes: set[str] = set()
    storage_class = claim.storage_class
    pv_name = kind = driver = None
    if claim.claim is not None:
        pvc = kube.get(object_path("v1", "persistentvolumeclaims", namespace, claim.claim))
        if pvc is not None:
            modes.update(pvc.get("spec", {}).get("accessModes") or [])
            storage_class = pvc.get("spec", {}).get("storageClassName") or storage_class
            pv_name = pvc.get("spec", {}).get("volumeName") or None
    if pv_name is not None:
        pv = kube.get(object_path("v1", "persistentvolumes", None, pv_name))
        if pv is not None:
            modes.update(pv.get("spec", {}).get("accessModes") or [])
            storage_class = pv.get("spec", {}).get("storageClassName") or storage_class
            kind, driver = pv_source(pv)
    provisioner = None
    if storage_class is not None:
        sc = kube.get(object_path("storage.k8s.io/v1", "storageclasses", None, storage_class))
        provisioner = sc.get("provisioner") if sc is not None else None
    return HotPathVolume(
        volume=claim.volume,
        mount_path=claim.mount_path,
        claim=claim.claim,
        storage_class=storage_class,
        provisioner=provisioner,
        pv=pv_name,
        pv_source=kind,
        driver=driver,
        access_modes=frozenset(modes),
    )


def read_hot_path(
    kube: Kube, namespace: str, claims: tuple[HotPathClaim, ...]
) -> tuple[HotPathVolume, ...]:
    """The facts about every hot-path claim of a run."""
    return tuple(read_volume(kube, namespace, claim) for claim in claims)
