"""Server-side apply under one field manager, with forced ownership.

Every companion (service account, role, binding, Leases, Service) and the run's status are
converged with the same call: the manifest is the complete desired state of the fields
trainguard owns, the apiserver merges it, and `force` takes over any field another manager
set (drift is repaired, never argued with). Fields trainguard stops sending are removed,
because it owned them. Pods are not applied: a pod never changes once made, so it is created
(`k8s.pods.create_pod`), which costs the apiserver less.
"""

from __future__ import annotations

from typing import Any

from trainguard.api import TrainingRunStatus
from trainguard.api.constants import API_VERSION, KIND, PLURAL
from trainguard.api.trainingrun import ObjectMeta
from trainguard.operator.build.constants import FIELD_MANAGER
from trainguard.operator.k8s.client import APPLY_PATCH, Kube, concurrently, object_path

# kind -> plural, for the kinds the operator applies.
PLURALS = {
    "Pod": "pods",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Lease": "leases",
    "Service": "services",
    "ConfigMap": "configmaps",
    KIND: PLURAL,
}
APPLY_QUERY = {"fieldManager": FIELD_MANAGER, "force": "true"}


def manifest_path(manifest: dict[str, Any], subresource: str | None = None) -> str:
    """The REST path of the object a manifest describes."""
    meta = manifest["metadata"]
    path = object_path(
        manifest["apiVersion"], PLURALS[manifest["kind"]], meta.get("namespace"), meta["name"]
    )
    return f"{path}/{subresource}" if subresource else path


def apply(kube: Kube, manifest: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply one object; return it as the apiserver stored it."""
    return kube.request(
        "PATCH", manifest_path(manifest), manifest, APPLY_QUERY, content_type=APPLY_PATCH
    )


def apply_all(kube: Kube, manifests: list[dict[str, Any]]) -> None:
    """Server-side apply objects that do not depend on each other (a gang's members) at once."""
    concurrently(lambda manifest: apply(kube, manifest), manifests)


def apply_status(kube: Kube, meta: ObjectMeta, status: TrainingRunStatus) -> dict[str, Any]:
    """Server-side apply the run's status subresource (never its spec)."""
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": meta.name, "namespace": meta.namespace},
        "status": status.to_object(),
    }
    return kube.request(
        "PATCH",
        manifest_path(manifest, "status"),
        manifest,
        APPLY_QUERY,
        content_type=APPLY_PATCH,
    )
