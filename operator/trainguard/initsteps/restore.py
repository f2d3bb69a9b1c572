"""`trainguard restore`: the init step that brings the newest valid checkpoint into L1.

It picks the newest checkpoint that verifies across L1 and every full-content remote layer,
preferring the cheapest source among equal steps, fetches it into L1, and leaves what it did
in the state directory's restore report for the agent and the run's status.

Only checkpoints of the run's lineage are candidates (`trainguard.layers.lineage`): a
superseded attempt's checkpoints count up to its fence, the newest step it reported; what it
shipped after (a zombie on a partitioned node) is ignored, and listed in the report as fenced.
L1 is the pod's own local disk: a new pod's L1 holds only what this step puts there.
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
from trainguard.layers.lineage import CheckpointRef, Lineage, Origin

# The report lists at most this many fenced checkpoints (the newest), then how many more.
MAX_FENCED_LISTED = 10


def restore(l1: Path, layers: list[Layer], lineage: Lineage | None = None) -> RestoreReport:
    """Bring the newest checkpoint of the lineage that verifies (L1 or any full layer) into L1.

    Without a lineage: every checkpoint on the layers is a candidate (outside a pod).
    """
    candidates: list[tuple[int, int, str, Layer | None, CheckpointRef | None]] = []
    skipped: list[str] = []
    fenced: list[tuple[CheckpointRef, str]] = []
    local = scan(l1) if l1.exists() else None
    if local is not None:
        for v in local.valid:
            if v.step is not None:
                candidates.append((v.step, COST["l1"], "l1", None, None))
        skipped += [f"l1 {v.path.name}: {'; '.join(v.reasons)}" for v in local.invalid]
    for layer in layers:
        if layer.config.contents != Contents.FULL.value:
            continue  # weights alone cannot resume optimizer and data position
        try:
            refs = layer.checkpoints()
        except (LayerError, OSError) as err:
            skipped.append(f"{layer.config.name}: {err}")
            continue
        cost = COST.get(layer.config.scheme, 9)
        name = layer.config.name
        for ref in refs:
            refusal = None if lineage is None else lineage.refusal(ref)
            if refusal is None:
                candidates.append((ref.step, cost, name, layer, ref))
            else:
                fenced.append((ref, f"{name} {ref}: {refusal}"))
    report = _fenced_lines(fenced)
    # Newest step first; among equal steps the cheapest source, then the newest attempt.
    ordered = sorted(candidates, key=lambda c: (-c[0], c[1], -(c[4].origin.attempt if c[4] else 0)))
    for step, _, name, source, chosen in ordered:
        if source is None or chosen is None:
            return RestoreReport(step, name, tuple(skipped), fenced=report)
        problems = source.verify(chosen)
        if problems:
            skipped.append(f"{name} {chosen}: {'; '.join(problems)[:200]}")
            continue
        try:
            source.fetch(chosen, l1)
        except (LayerError, OSError) as err:
            skipped.append(f"{name} {chosen}: {err}")
            continue
        return RestoreReport(step, name, tuple(skipped), origin=str(chosen.origin), fenced=report)
    return RestoreReport(None, None, tuple(skipped), fenced=report)


def _fenced_lines(fenced: list[tuple[CheckpointRef, str]]) -> tuple[str, ...]:
    """The fenced checkpoints, newest first, at most `MAX_FENCED_LISTED` and a count."""
    lines = [line for _, line in sorted(fenced, key=lambda f: f[0], reverse=True)]
    if len(lines) > MAX_FENCED_LISTED:
        more = len(lines) - MAX_FENCED_LISTED
        lines = [*lines[:MAX_FENCED_LISTED], f"and {more} more"]
    return tuple(lines)


def main(argv: list[str]) -> int:
    """Entry point of `trainguard restore` (an init step of the training pod)."""
    argparse.ArgumentParser(prog="trainguard restore", description=__doc__).parse_args(argv)
    share_with_pod()
    environ = dict(os.environ)
    pod = PodEnv.from_env(environ)
    pod.l1_dir.mkdir(parents=True, exist_ok=True)
    origin = Origin.of(pod.run_uid, pod.attempt)
    layers = [open_layer(LayerConfig.from_spec(layer), environ, origin) for layer in pod.layers]
    result = restore(pod.l1_dir, layers, Lineage(origin, pod.fences))
    for line in result.skipped:
        print(f"trainguard restore: skipped invalid {line}", flush=True)
    for line in result.fenced:
        print(f"trainguard restore: ignored fenced {line}", flush=True)
    if result.step is None:
        print("trainguard restore: no checkpoint anywhere; training starts fresh", flush=True)
    else:
        print(f"trainguard restore: {result.line()}", flush=True)
    write_restore_report(pod.report_file(RESTORE_FILENAME), result)
    return 0
