"""TrainingRuns for the operator's unit tables: the small valid run, changed per case, parsed.

The manifest is `trainguard_dev.testing.runs.training_run`'s; this adds the namespace and the
metadata the apiserver sets, and parses it as the operator would.
"""

from __future__ import annotations

from typing import Any

from trainguard.api import TrainingRun
from trainguard_dev.testing.runs import training_run

NAMESPACE = "team-a"
UID = "uid-1"


def make_run(
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    name: str = "llm",
    generation: int = 1,
) -> TrainingRun:
    """A parsed run: the small valid spec with `spec` merged in, as the apiserver returns it."""
    manifest = training_run(
        name,
        spec,
        namespace=NAMESPACE,
        metadata={"uid": UID, "generation": generation},
        status=status,
    )
    return TrainingRun.from_object(manifest)
