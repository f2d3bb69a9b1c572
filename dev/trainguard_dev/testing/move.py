"""The arithmetic of the move benchmark (`bench/move.py`): from a move's milestones to its phases.

A move takes a run from a failed node to a fresh one. Each milestone is a moment (seconds
since the epoch) read from what the system itself records: the run's status, the pods'
timestamps and their containers' start and finish times, the Events, the files the init
steps and the trainer leave in the pod's state volume. `MILESTONES` names them in the order a
move passes them; a phase is the time from one milestone to the next one that is known (a
milestone that could not be read is skipped, and its phase is folded into the next).

`after_detection_s` is the move's total after the detection bound: from the failure in the
run's status to the first training step on the fresh node.

Timestamps of the Kubernetes API (creationTimestamp, deletionTimestamp, container
startedAt/finishedAt, condition transition times, status times) have a resolution of one
second, truncated: a phase between two of them is known to within a second, and one between
an API timestamp and a finer one (a file's mtime, an Event's eventTime, the trainer's own
clock) may even come out a little negative. The report says which source each milestone has.

Kept apart from the benchmark, which needs a control plane, so the arithmetic is tested alone.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

# The milestones of a move, in order: (name, where its time comes from).
MILESTONES: tuple[tuple[str, str], ...] = (
    ("injected", "the benchmark's clock when it caused the failure"),
    ("detected", "status.lastFailure.time (1 s)"),
    ("old_pod_deleting", "the old pod's first deletionTimestamp less its grace period (1 s)"),
    ("old_pod_gone", "the benchmark's pod watch: the old pod's DELETED event"),
    ("pod_created", "the new pod's creationTimestamp (1 s)"),
    ("scheduled", "the scheduler's Scheduled Event, eventTime (µs)"),
    ("preflight_started", "initContainerStatuses[preflight].state.terminated.startedAt (1 s)"),
    ("preflight_finished", "mtime of the preflight report (state volume)"),
    ("staged", "mtime of the staging report (state volume)"),
    ("restored", "mtime of the restore report (state volume)"),
    ("trainer_started", "containerStatuses[trainer].state.running.startedAt (1 s)"),
    ("supervisor_started", "the supervisor's state file: its started_at (its own clock)"),
    ("trainer_process_started", "the supervisor's state file: its first process's started_at"),
    ("trainer_resumed", "the trainer's log line 'resumed from ...' (ms)"),
    ("first_step", "the heartbeat's time of its first record past the restored step"),
)
NAMES = tuple(name for name, _ in MILESTONES)
# The milestone the detection bound ends at, and the one a move ends at.
DETECTED = "detected"
FIRST_STEP = "first_step"
AFTER_DETECTION = "after_detection_s"


def parse_time(text: object) -> float | None:
    """An API timestamp (RFC 3339, optionally with fractions) as epoch seconds; None if absent."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def phase_name(start: str, end: str) -> str:
    """The name of the phase from milestone `start` to milestone `end`."""
    return f"{start}->{end}"


def phases(marks: Mapping[str, float | None]) -> dict[str, float]:
    """Each phase of one move in seconds, from each known milestone to the next known one.

    Phases are named `phase_name(start, end)`; the total after the detection bound is
    `AFTER_DETECTION` when both its ends are known. ValueError on a milestone not in `NAMES`.
    """
    unknown = set(marks) - set(NAMES)
    if unknown:
        raise ValueError(f"unknown milestones: {sorted(unknown)}")
    known = [(name, marks[name]) for name in NAMES if marks.get(name) is not None]
    result: dict[str, float] = {}
    for (start, begun), (end, ended) in itertools.pairwise(known):
        assert begun is not None and ended is not None
        result[phase_name(start, end)] = round(ended - begun, 3)
    detected, first = marks.get(DETECTED), marks.get(FIRST_STEP)
    if detected is not None and first is not None:
        result[AFTER_DETECTION] = round(first - detected, 3)
    return result


def summary(moves: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Per phase over several moves: the median and the raw list, in the order of the moves.

    A phase missing from a move (a milestone not read) is left out of that move's list, so
    its list may be shorter than the moves; its median is over what was measured.
    """
    order: list[str] = []
    for move in moves:
        order += [name for name in move if name not in order]
    raw = {name: [move[name] for move in moves if name in move] for name in order}
    return {
        "median_s": {name: round(statistics.median(values), 3) for name, values in raw.items()},
        "raw_s": raw,
    }
