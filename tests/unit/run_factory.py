"""TrainingRuns for the operator's unit tables: a small valid run, changed per case."""

from __future__ import annotations

import copy
from typing import Any

from trainguard.api import TrainingRun

NAMESPACE = "team-a"
UID = "uid-1"
BASE_SPEC: dict[str, Any] = {
    "trainer": {"image": "trainer:1", "command": ["python", "train.py"]},
    "model": {"parameters": 1_000_000_000},
}


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` merged in, nested dicts merged key by key."""
    merged = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def make_run(
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    name: str = "llm",
    generation: int = 1,
) -> TrainingRun:
    """A parsed run: BASE_SPEC merged with `spec`, with the metadata the apiserver sets."""
    body: dict[str, Any] = {
        "apiVersion": "trainguard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": UID, "generation": generation},
        "spec": merge(BASE_SPEC, spec or {}),
    }
    if status is not None:
        body["status"] = status
    return TrainingRun.from_object(body)
