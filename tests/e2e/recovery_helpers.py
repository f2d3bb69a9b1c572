"""What the recovery scenarios on process-backed nodes share: data, the run, the pod's files.

A run of the reference trainer (tiny preset, one thread) reads synthetic shards staged from a
file:// source and is pinned to the process-backed nodes, so its pod runs as real local
processes; the test reaches the trainer through the pod's state directory (heartbeat,
supervisor state, stack dumps) on the node's directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from operator_proc import get_json, pods_of

from trainguard.api.constants import LABEL_ATTEMPT
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.nodes import PROCESS_NODE_LABEL


def make_shards(out: Path) -> Path:
    """A few synthetic token shards, the data source of a run."""
    subprocess.run(
        [sys.executable, "-m", "trainguard_harness.shards", "--out", str(out), "--shards", "2",
         "--tokens", "100000", "--vocab-size", "256", "--seed", "1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return out


def training_run(name: str, shards: Path, every_steps: int, **spec: Any) -> dict[str, Any]:
    """A TrainingRun of the reference trainer on a process-backed node; `spec` adds to it."""
    base: dict[str, Any] = {
        "trainer": {
            "image": "trainguard-trainer:dev",
            "command": [
                "python",
                "-m",
                "trainguard_harness.train",
                "--preset",
                "tiny",
                "--steps",
                "1000000",
                "--threads",
                "1",
                "--min-step-seconds",
                "0.1",
            ],
        },
        "model": {"parameters": 1000000},
        "data": {"source": {"uri": f"file://{shards}"}, "size": "10Mi"},
        "checkpoints": {"everySteps": every_steps},
        "placement": {"nodeSelector": {PROCESS_NODE_LABEL: "true"}},
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return {
        "apiVersion": "trainguard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": base,
    }


def bound_pod(cluster: Cluster, namespace: str, run: str, attempt: int = 1) -> Any:
    """The run's pod of `attempt` once it is bound to a node, else None."""
    for pod in pods_of(cluster, namespace, run):
        labels = pod["metadata"].get("labels") or {}
        if labels.get(LABEL_ATTEMPT) == str(attempt) and pod["spec"].get("nodeName"):
            return pod
    return None


def state_dir(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> Path:
    """The pod's state volume (heartbeat, supervisor state, stack dumps) on its node."""
    meta = pod["metadata"]
    directory = f"{namespace}_{meta['name']}_{meta['uid']}"
    node = pod["spec"]["nodeName"]
    return cluster.root / "procnodes" / node / "pods" / directory / "volumes" / "state"


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file the trainer side writes, or None while it is absent or half written."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def heartbeat(state: Path) -> dict[str, Any] | None:
    """The trainer's heartbeat."""
    return read_json(state / "heartbeat.json")


def status_of(cluster: Cluster, namespace: str, run: str) -> dict[str, Any]:
    """The run's status (empty until the operator wrote one)."""
    status: dict[str, Any] = get_json(cluster, "tr", run, "-n", namespace).get("status") or {}
    return status


def checkpointed(state: Path, step: int) -> dict[str, Any] | None:
    """The heartbeat once the trainer saved a checkpoint at or past `step`."""
    beat = heartbeat(state)
    return beat if beat and (beat.get("last_checkpoint_step") or 0) >= step else None
