"""`trainguard restore`: the init step that brings the newest valid checkpoint into L1.

It picks the newest checkpoint that verifies across L1 and every full-content remote layer,
preferring the cheapest source among equal steps, fetches it into L1, and leaves what it did
in the state directory's restore report for the agent and the run's status.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from trainguard.ckpt import Contents, scan
from trainguard.contract.env import PodEnv
from trainguard.contract.files import (
    RESTORE_FILENAME,
    RestoreReport,
    share_with_pod,
    write_restore_report,
)
from trainguard.layers import COST, Layer, LayerConfig, LayerError, open_layer


def restore(l1: Path, layers: list[Layer]) -> RestoreReport:
    """Bring the newest checkpoint that verifies (L1 or any full layer) into L1."""
    candidates: list[tuple[int, int, str, Layer | None]] = []
    skipped: list[str] = []
    local = scan(l1) if l1.exists() else None
    if local is not None:
        for v in local.valid:
            if v.step is not None:
                candidates.append((v.step, COST["l1"], "l1", None))
        skipped += [f"l1 {v.path.name}: {'; '.join(v.reasons)}" for v in local.invalid]
    for layer in layers:
        if layer.config.contents != Contents.FULL.value:
            continue  # weights alone cannot resume optimizer and data position
        try:
            steps = layer.steps()
        except (LayerError, OSError) as err:
            skipped.append(f"{layer.config.name}: {err}")
            continue
        cost = COST.get(layer.config.scheme, 9)
        candidates += [(step, cost, layer.config.name, layer) for step in steps]
    # Newest step first; among equal steps the cheapest source.
    for step, _, name, source in sorted(candidates, key=lambda c: (-c[0], c[1])):
        if source is None:
            return RestoreReport(step, name, tuple(skipped))
        problems = source.verify(step)
        if problems:
            skipped.append(f"{name} step {step}: {'; '.join(problems)[:200]}")
            continue
        try:
            source.fetch(step, l1)
        except (LayerError, OSError) as err:
            skipped.append(f"{name} step {step}: {err}")
            continue
        return RestoreReport(step, name, tuple(skipped))
    return RestoreReport(None, None, tuple(skipped))


def main(argv: list[str]) -> int:
    """Entry point of `trainguard restore` (an init step of the training pod)."""
    argparse.ArgumentParser(prog="trainguard restore", description=__doc__).parse_args(argv)
    share_with_pod()
    environ = dict(os.environ)
    pod = PodEnv.from_env(environ)
    pod.l1_dir.mkdir(parents=True, exist_ok=True)
    layers = [open_layer(LayerConfig.from_spec(layer), environ) for layer in pod.layers]
    result = restore(pod.l1_dir, layers)
    for line in result.skipped:
        print(f"trainguard restore: skipped invalid {line}", flush=True)
    if result.step is None:
        print("trainguard restore: no checkpoint anywhere; training starts fresh", flush=True)
    else:
        print(f"trainguard restore: step {result.step} from layer {result.from_layer}", flush=True)
    write_restore_report(pod.report_file(RESTORE_FILENAME), result)
    return 0
