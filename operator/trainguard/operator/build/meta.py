"""Metadata shared by every child: namespace, labels and the owner reference to the run."""

from __future__ import annotations

from typing import Any

from trainguard.api import TrainingRun
from trainguard.api.constants import API_VERSION, KIND


def owner_reference(run: TrainingRun) -> dict[str, Any]:
    """The run as the controlling owner: garbage collection deletes children with it."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": run_name(run),
        "uid": run.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def run_name(run: TrainingRun) -> str:
    """The run's name (parsed runs always come from the apiserver, which sets it)."""
    if not run.metadata.name or not run.metadata.namespace or not run.metadata.uid:
        raise ValueError("a TrainingRun needs metadata.name, namespace and uid to own children")
    return run.metadata.name


def child_meta(
    run: TrainingRun,
    name: str,
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Metadata of a child object in the run's namespace, owned by the run."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": run.metadata.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(run)],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta
