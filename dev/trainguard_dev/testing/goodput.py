"""The arithmetic of the goodput benchmark (`bench/goodput.py`): from what a run did to its figures.

A side of the benchmark (trainguard, or the log-age watchdog baseline) leaves two records:
the steps its trainers executed, each with the time it was first seen (`StepRecord`, in the
order seen, restarts and recomputed steps included), and the failures caused to it
(`Failure`: kind, when, the highest step reached before it). From those alone:

- wall time: from the start of the first step to the first time the final step is seen;
- useful time: final step x the fixed step time (what an uninterrupted run would have taken);
- goodput: useful / wall;
- steps recomputed: steps executed - final step (the work a restart did again);
- time lost per failure: from the failure to the first step past the furthest one reached
  before training restarted (`resumed_at`), less one step time (the step that was due
  anyway), so a failure that cost nothing costs 0.

Kept apart from the benchmark, which needs a control plane, so the arithmetic is tested alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepRecord:
    """One executed step: its number and when it was first seen (monotonic seconds)."""

    step: int
    seen: float


@dataclass(frozen=True)
class Failure:
    """One failure caused to a side: its kind, when, and the highest step reached before it."""

    kind: str
    at: float
    reached: int


def resumed_at(
    steps: Sequence[StepRecord], failure: Failure, until: float | None = None
) -> float | None:
    """When training went past the furthest step reached before the failure's restart.

    A restart shows as a step not above the highest seen so far (a new trainer starting over
    from a checkpoint). A frozen trainer may still make a few steps after the failure (it is
    continued to dump its stacks before it is killed): when a restart follows, those steps are
    not a resumption; training has resumed once the new trainer is past all of them. Without
    a restart (the trainer went on, or resumed exactly where it stopped, as from a snapshot
    of its last step), the first step past the one the failure interrupted. Only steps seen
    before `until` (the next failure) count: that failure's restart is not this one's. None if
    training never resumed.
    """
    after = [r for r in steps if r.seen >= failure.at and (until is None or r.seen < until)]
    high = max((r.step for r in steps if r.seen < failure.at), default=0)
    for index, record in enumerate(after):
        if record.step <= high:
            return next((r.seen for r in after[index:] if r.step > high), None)
        high = record.step
    return next((r.seen for r in after if r.step > failure.reached), None)


def time_lost(
    steps: Sequence[StepRecord],
    failure: Failure,
    step_seconds: float,
    until: float | None = None,
) -> float | None:
    """Seconds the failure cost: to the next new step, less the step that was due anyway."""
    resumed = resumed_at(steps, failure, until)
    return None if resumed is None else max(0.0, resumed - failure.at - step_seconds)


def side_figures(
    steps: Sequence[StepRecord],
    failures: Sequence[Failure],
    final_step: int,
    step_seconds: float,
) -> dict[str, Any]:
    """A side's figures: wall, useful time, goodput, steps recomputed, time lost per failure.

    The run started one step time before its first step was seen; it ended when `final_step`
    was first seen. ValueError when the run never reached `final_step`.
    """
    finished = next((r.seen for r in steps if r.step >= final_step), None)
    if not steps or finished is None:
        raise ValueError(f"the run never reached step {final_step}")
    start = steps[0].seen - step_seconds
    wall = finished - start
    useful = final_step * step_seconds
    ends: list[float | None] = [f.at for f in failures[1:]]
    ends += [None] * (len(failures) - len(ends))  # the last one's window runs to the end
    lost = [time_lost(steps, f, step_seconds, end) for f, end in zip(failures, ends, strict=True)]
    by_kind: dict[str, list[float]] = {}
    for failure, seconds in zip(failures, lost, strict=True):
        if seconds is not None:
            by_kind.setdefault(failure.kind, []).append(seconds)
    known = [s for s in lost if s is not None]
    return {
        "wall_s": round(wall, 3),
        "useful_s": round(useful, 3),
        "goodput": round(useful / wall, 4),
        "final_step": final_step,
        "steps_executed": len(steps),
        "steps_recomputed": len(steps) - final_step,
        "failures": len(failures),
        "time_lost_median_s": round(statistics.median(known), 3) if known else None,
        "time_lost_total_s": round(sum(known), 3),
        "time_lost_median_by_kind_s": {
            kind: round(statistics.median(values), 3) for kind, values in by_kind.items()
        },
        "raw": {
            "failures": [
                {
                    "kind": f.kind,
                    "at_s": round(f.at - start, 3),
                    "step_reached": f.reached,
                    "time_lost_s": None if s is None else round(s, 3),
                }
                for f, s in zip(failures, lost, strict=True)
            ],
        },
    }


def loss_ratio(baseline: dict[str, Any], trainguard: dict[str, Any]) -> float | None:
    """Median time lost per failure, baseline / trainguard (None when either is none or zero)."""
    ours, theirs = trainguard["time_lost_median_s"], baseline["time_lost_median_s"]
    if not ours or theirs is None:
        return None
    return round(float(theirs) / float(ours), 2)
