"""A pod's files on a process-backed node, where tests, benchmarks and the demo read the trainer.

A process-backed node keeps each pod under
``<cluster>/procnodes/<node>/pods/<namespace>_<pod>_<uid>/``: its volumes (``volumes/<name>``)
and each container's output (``<container>.log``). The trainer writes its heartbeat into the
``state`` volume; its files are read with the pod contract's `read_json`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainguard.contract.files import HEARTBEAT_FILENAME, read_json

Obj = dict[str, Any]

STATE_VOLUME = "state"


def pod_directory(cluster_root: Path, pod: Mapping[str, Any]) -> Path:
    """The directory of a pod bound to a process-backed node."""
    meta = pod["metadata"]
    directory = f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    node = str(pod["spec"]["nodeName"])
    return cluster_root / "procnodes" / node / "pods" / directory


def state_dir(cluster_root: Path, pod: Mapping[str, Any]) -> Path:
    """The pod's state volume (heartbeat, supervisor state, stack dumps)."""
    return pod_directory(cluster_root, pod) / "volumes" / STATE_VOLUME


def heartbeat(state: Path) -> Obj | None:
    """The trainer's heartbeat in a state volume, or None before its first write."""
    return read_json(state / HEARTBEAT_FILENAME)


def checkpointed(state: Path, step: int) -> Obj | None:
    """The heartbeat once the trainer has saved a checkpoint at or past `step`, else None."""
    beat = heartbeat(state)
    return beat if beat and (beat.get("last_checkpoint_step") or 0) >= step else None


def real_state_dir(kubelet_root: Path, pod: Mapping[str, Any]) -> Path:
    """The state volume of a pod on a real node whose kubelet's `--root-dir` is `kubelet_root`.

    The kubelet keeps an emptyDir at ``<root-dir>/pods/<uid>/volumes/kubernetes.io~empty-dir/
    <name>`` (a tmpfs mount for ``medium: Memory``), in the host's mount namespace.
    """
    uid = str(pod["metadata"]["uid"])
    volumes = kubelet_root / "pods" / uid / "volumes"
    return volumes / "kubernetes.io~empty-dir" / STATE_VOLUME
