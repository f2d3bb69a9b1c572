"""`trainguard restore`: the init step that brings the newest valid checkpoint into L1.

It picks the newest checkpoint that verifies across L1 and every full-content remote layer,
preferring the cheapest source among equal steps, fetches it into L1, and leaves what it did
in the state directory's restore report for the agent and the run's status. Every checkpoint
it finds invalid (in L1, or a remote one that does not verify or whose fetch finds a file
differing from its manifest) is skipped, never deleted, and recorded as a finding
(`trainguard.contract.findings`), which the agent tells as a Warning Event.

Only checkpoints of the run's lineage are candidates (`trainguard.layers.lineage`): a
superseded attempt's checkpoints count up to its fence, the newest step it reported; what it
shipped after (a zombie on a partitioned node) is ignored, and listed in the report as fenced.
L1 is the pod's own local disk: a new pod's L1 holds only what this step puts there.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from trainguard.api.constants import L1_LAYER, FoundBy
from trainguard.ckpt import Contents, Problem, scan
from trainguard.contract.env import PodEnv
from trainguard.contract.files import (
    RESTORE_FILENAME,
    RestoreReport,
    share_with_pod,
    write_restore_report,
)
from trainguard.contract.findings import Finding
from trainguard.layers import (
    COST,
    InvalidCheckpointError,
    Layer,
    LayerConfig,
    LayerError,
    open_layer,
)
from trainguard.layers.lineage import CheckpointRef, Lineage, Origin

# The report lists at most this many fenced checkpoints (the newest), then how many more.
MAX_FENCED_LISTED = 10
# The report records at most this many invalid checkpoints (the first found).
MAX_FINDINGS = 32


def restore(l1: Path, layers: list[Layer], lineage: Lineage | None = None) -> RestoreReport:
    """Bring the newest checkpoint of the lineage that verifies (L1 or any full layer) into L1.

    Without a lineage: every checkpoint on the layers is a candidate (outside a pod).
    """
    candidates: list[tuple[int, int, str, Layer | None, CheckpointRef | None]] = []
    skipped: list[str] = []
    findings: list[Finding] = []
    fenced: list[tuple[CheckpointRef, str]] = []

    def invalid(layer: str, step: int | None, problems: tuple[Problem, ...], line: str) -> None:
        skipped.append(line)
        findings.append(Finding.of(layer, step, problems, FoundBy.RESTORE))

    local = scan(l1) if l1.exists() else None
    if local is not None:
        for v in local.valid:
            if v.step is not None:
                candidates.append((v.step, COST[L1_LAYER], L1_LAYER, None, None))
        for v in local.invalid:
            invalid(L1_LAYER, v.step, v.problems, f"l1 {v.path.name}: {'; '.join(v.reasons)}")
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
    chosen_step: int | None = None
    chosen_layer: str | None = None
    origin: str | None = None
    for step, _, name, source, chosen in ordered:
        if source is None or chosen is None:
            chosen_step, chosen_layer = step, name
            break
        problems = tuple(source.verify(chosen))
        if problems:
            lines = "; ".join(str(problem) for problem in problems)
            invalid(name, step, problems, f"{name} {chosen}: {lines[:200]}")
            continue
        try:
            source.fetch(chosen, l1)
        except InvalidCheckpointError as err:
            invalid(name, step, err.problems, f"{name} {chosen}: {err}")
            continue
        except (LayerError, OSError) as err:
            skipped.append(f"{name} {chosen}: {err}")
            continue
        chosen_step, chosen_layer, origin = step, name, str(chosen.origin)
        break
    return RestoreReport(
        chosen_step,
        chosen_layer,
        tuple(skipped),
        origin=origin,
        fenced=report,
        findings=tuple(findings[:MAX_FINDINGS]),
    )


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
