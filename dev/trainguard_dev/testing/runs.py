"""TrainingRun manifests for the tests, benchmarks and demo, and the data a run trains on.

One builder, `training_run`: a name, an optional namespace and spec changes merged key by
key into a base spec (by default `SMALL_SPEC`, the smallest useful run). On top of it:

- `example_run`: one of the checked-in ``examples/*.yaml``, renamed and changed;
- `reference_run`: the reference trainer (the harness's tiny preset, one thread) reading
  synthetic shards from a ``file://`` source, pinned to the process-backed nodes, where its
  pod runs as real local processes;
- `pinned`: a run restricted to nodes carrying a label.

`make_shards` writes the synthetic token shards such a run reads.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from trainguard.api.constants import API_VERSION, KIND
from trainguard_dev.cluster.nodes import PROCESS_NODE_LABEL

Obj = dict[str, Any]

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# The smallest useful spec: an image, a command, and the model's size, which sizes the disk.
SMALL_SPEC: Obj = {
    "trainer": {"image": "trainer:1", "command": ["python", "train.py"]},
    "model": {"parameters": 1_000_000_000},
}
REFERENCE_IMAGE = "trainguard-trainer:dev"
REFERENCE_PARAMETERS = 1_000_000
# More steps than any test or benchmark lasts: they stop the run, not the trainer.
REFERENCE_STEPS = 1_000_000
# A step lasts at least this long, as an accelerator step would (the tiny model on a CPU is
# far faster), so background saves take less than a step.
REFERENCE_MIN_STEP_SECONDS = 0.1
SHARDS_SIZE = "10Mi"
SHARDS_TIMEOUT_SECONDS = 120


def merge(base: Mapping[str, Any], changes: Mapping[str, Any]) -> Obj:
    """A copy of `base` with `changes` merged in: dicts key by key, anything else replaced."""
    merged = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def training_run(
    name: str,
    spec: Mapping[str, Any] | None = None,
    *,
    namespace: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    status: Mapping[str, Any] | None = None,
    base: Mapping[str, Any] = SMALL_SPEC,
) -> Obj:
    """A TrainingRun manifest: `base` with `spec` merged in.

    `metadata` adds fields the apiserver would set (uid, generation); `status`, when given,
    is the run's status.
    """
    meta: Obj = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    run: Obj = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": merge(meta, metadata or {}),
        "spec": merge(base, spec or {}),
    }
    if status is not None:
        run["status"] = copy.deepcopy(dict(status))
    return run


def example_run(
    example: str,
    name: str | None = None,
    spec: Mapping[str, Any] | None = None,
    *,
    namespace: str | None = None,
) -> Obj:
    """``examples/<example>.yaml``, renamed when `name` is given, with `spec` merged in."""
    checked_in: Obj = yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text())
    meta = checked_in["metadata"]
    return training_run(
        name or meta["name"],
        spec,
        namespace=namespace or meta.get("namespace"),
        metadata={k: v for k, v in meta.items() if k not in ("name", "namespace")},
        base=checked_in["spec"],
    )


def pinned(run: Mapping[str, Any], label: str, value: str) -> Obj:
    """The run, restricted to nodes labelled `label=value` (beside its own selector)."""
    return merge(run, {"spec": {"placement": {"nodeSelector": {label: value}}}})


def file_data(shards: Path) -> Obj:
    """The `spec.data` of a run that stages `shards` from a ``file://`` source."""
    return {"source": {"uri": f"file://{shards}"}, "size": SHARDS_SIZE}


def reference_command(steps: int, min_step_seconds: float | None) -> list[str]:
    """The reference trainer's command line: the tiny preset on one CPU thread."""
    command = ["python", "-m", "trainguard_harness.train", "--preset", "tiny"]
    command += ["--steps", str(steps), "--threads", "1"]
    if min_step_seconds is not None:
        command += ["--min-step-seconds", f"{min_step_seconds:g}"]
    return command


def real_node_run(
    name: str,
    image: str,
    shards_claim: str,
    every_steps: int,
    node_selector: Mapping[str, str],
    spec: Mapping[str, Any] | None = None,
    *,
    namespace: str | None = None,
) -> Obj:
    """The reference trainer in the trainer image built here, on real nodes.

    Its data is staged from the PVC `shards_claim` (holding `make_shards` output); `spec`
    changes the rest, as for `reference_run`.
    """
    reference: Obj = {
        "trainer": {
            "image": image,
            "command": reference_command(REFERENCE_STEPS, REFERENCE_MIN_STEP_SECONDS),
        },
        "model": {"parameters": REFERENCE_PARAMETERS},
        "data": {"source": {"pvc": {"claimName": shards_claim}}, "size": SHARDS_SIZE},
        "checkpoints": {"everySteps": every_steps},
        "placement": {"nodeSelector": dict(node_selector)},
    }
    return training_run(name, spec, namespace=namespace, base=reference)


def reference_run(
    name: str,
    shards: Path,
    every_steps: int,
    spec: Mapping[str, Any] | None = None,
    *,
    namespace: str | None = None,
    steps: int = REFERENCE_STEPS,
    min_step_seconds: float | None = REFERENCE_MIN_STEP_SECONDS,
) -> Obj:
    """The reference trainer on a process-backed node, checkpointing every `every_steps`.

    It trains on `shards` (see `make_shards`); `spec` changes the rest (monitor, recovery,
    remote layers...). `min_step_seconds=None` lets the tiny model step as fast as it can.
    """
    reference: Obj = {
        "trainer": {
            "image": REFERENCE_IMAGE,
            "command": reference_command(steps, min_step_seconds),
        },
        "model": {"parameters": REFERENCE_PARAMETERS},
        "data": file_data(shards),
        "checkpoints": {"everySteps": every_steps},
        "placement": {"nodeSelector": {PROCESS_NODE_LABEL: "true"}},
    }
    return training_run(name, spec, namespace=namespace, base=reference)


def make_shards(out: Path, *, shards: int = 2, tokens: int = 100_000, seed: int = 1) -> Path:
    """Synthetic token shards (vocabulary 256) in `out`, the data source of a run.

    Written beside `out` and renamed into place, so a directory that exists is complete and
    is reused as it is.
    """
    if out.is_dir():
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "trainguard_harness.shards", "--out", str(partial),
         "--shards", str(shards), "--tokens", str(tokens), "--vocab-size", "256",
         "--seed", str(seed)],
        check=True, capture_output=True, timeout=SHARDS_TIMEOUT_SECONDS,
    )  # fmt: skip
    partial.rename(out)
    return out
