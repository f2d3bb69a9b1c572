"""Which attempt wrote a remote checkpoint, and which checkpoints a run may resume from.

Every checkpoint a run ships is bound to the attempt that shipped it: a remote layer keeps it
under `run-<run uid>/attempt-<k>/step-<8 digits>/` (`checkpoint_key`), so two attempts never
write the same key, and a run re-created under the same name (a new UID) never mixes its
checkpoints with the old run's.

Fencing. A pod can outlive the operator's view of it: on a partitioned node the operator sees
the node NotReady and the heartbeat Lease expire, force-deletes the pod and starts the next
attempt elsewhere, while the old trainer and agent keep running and shipping. When the
operator starts attempt k+1 it records the **fence** of attempt k: the newest step attempt k's
agent reported verified on a layer (the heartbeat Lease), or none when it reported none. The
fences of all superseded attempts reach the new pod (`PodEnv.fences`), and `Lineage` decides:

- a checkpoint of the current attempt: yes (the agent bounds its own by what it has reported,
  see `own_limit`);
- of a superseded attempt of this run: only at or below that attempt's fence: everything up
  to it was reported while that attempt was the current one, so it is an ancestor of the
  current lineage; anything above it was shipped after the operator stopped hearing from the
  attempt (a zombie's upload) and is never restored, never pruned, and reported;
- of a superseded attempt with no fence recorded, or of a later attempt: no;
- of another run (an earlier TrainingRun of the same name and layers): yes; a re-created run
  resumes from where its predecessor got to, as before checkpoints carried their attempt;
- of the layout before checkpoints named their attempt (`step-<8 digits>/` directly under the
  root, `LEGACY`): yes, like another run's, so an upgraded operator resumes from them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from trainguard.ckpt import Problem, parse_step_dirname, step_dirname

RUN_PREFIX = "run-"
ATTEMPT_PREFIX = "attempt-"
# The run of a checkpoint shipped outside a pod (no run UID: a benchmark, a test by hand).
LOCAL_RUN = "local"
_RUN_RE = re.compile(rf"^{RUN_PREFIX}([A-Za-z0-9][A-Za-z0-9-]*)$")
_ATTEMPT_RE = re.compile(rf"^{ATTEMPT_PREFIX}(0|[1-9][0-9]*)$")


@dataclass(frozen=True, order=True)
class Origin:
    """The attempt of a run that shipped a checkpoint (attempt 0: outside a pod)."""

    run: str
    attempt: int

    @classmethod
    def of(cls, run_uid: str, attempt: int | None) -> Origin:
        """The origin of what a pod (run UID, attempt) ships."""
        return cls(run_uid or LOCAL_RUN, attempt or 0)

    @property
    def path(self) -> str:
        """The origin's directory on a layer: `run-<uid>/attempt-<k>` ("" for `LEGACY`)."""
        if self == LEGACY:
            return ""
        return f"{RUN_PREFIX}{self.run}/{ATTEMPT_PREFIX}{self.attempt}"

    def __str__(self) -> str:
        if self == LEGACY:
            return "shipped before checkpoints named their attempt"
        return f"attempt {self.attempt} of run {self.run}"


# Checkpoints directly under a layer's root, as shipped before they named their attempt.
LEGACY = Origin("", 0)


@dataclass(frozen=True, order=True)
class CheckpointRef:
    """One checkpoint on a layer: its step and the attempt that shipped it."""

    step: int
    origin: Origin

    @property
    def path(self) -> str:
        """Its directory on the layer: `run-<uid>/attempt-<k>/step-<8 digits>`."""
        prefix = self.origin.path
        return f"{prefix}/{step_dirname(self.step)}" if prefix else step_dirname(self.step)

    def __str__(self) -> str:
        return f"step {self.step} ({self.origin})"


def checkpoint_key(ref: CheckpointRef, name: str) -> str:
    """The key of file `name` of checkpoint `ref`, relative to the layer's root."""
    return f"{ref.path}/{name}"


def parse_origin(run_dir: str, attempt_dir: str) -> Origin | None:
    """The origin of `run-<uid>/attempt-<k>` directory names, or None when they are not one."""
    run = _RUN_RE.match(run_dir)
    attempt = _ATTEMPT_RE.match(attempt_dir)
    if run is None or attempt is None:
        return None
    return Origin(run.group(1), int(attempt.group(1)))


def parse_key(key: str) -> tuple[CheckpointRef, str] | None:
    """(checkpoint, file name inside it) of a key relative to the root; None if not one."""
    directory, _, name = key.partition("/")
    legacy = parse_step_dirname(directory)
    if legacy is not None:
        return (CheckpointRef(legacy, LEGACY), name) if name else None
    parts = key.split("/", 3)
    if len(parts) != 4:
        return None
    origin = parse_origin(parts[0], parts[1])
    step = parse_step_dirname(parts[2])
    if origin is None or step is None or not parts[3]:
        return None
    return CheckpointRef(step, origin), parts[3]


@dataclass(frozen=True)
class Lineage:
    """Which checkpoints the current attempt may restore from and prune (module docstring).

    `fences` maps each superseded attempt of the run to the newest step it reported (None:
    it reported none). `own_limit` bounds the current attempt's own checkpoints: the agent
    counts only those it has reported, so a partitioned agent never prunes the checkpoint
    its successor is told to resume from. None: no bound (restore, or no operator at all).
    """

    current: Origin
    fences: Mapping[int, int | None] = field(default_factory=dict)
    own_limit: int | None = None

    def refusal(self, ref: CheckpointRef) -> str | None:
        """Why `ref` is not in the lineage, or None when it is."""
        origin = ref.origin
        if origin.run != self.current.run:
            return None
        if origin.attempt == self.current.attempt:
            if self.own_limit is not None and ref.step > self.own_limit:
                return f"not reported yet (reported up to {self.own_limit})"
            return None
        if origin.attempt > self.current.attempt:
            return f"shipped by a later attempt than {self.current.attempt}"
        if origin.attempt not in self.fences:
            return f"attempt {origin.attempt} was superseded and no fence was recorded"
        fence = self.fences[origin.attempt]
        if fence is None:
            return f"attempt {origin.attempt} was superseded before it reported any checkpoint"
        if ref.step > fence:
            return (
                f"shipped after attempt {origin.attempt} was superseded "
                f"(its last reported checkpoint: step {fence})"
            )
        return None

    def accepts(self, ref: CheckpointRef) -> bool:
        """Whether `ref` is in the lineage."""
        return self.refusal(ref) is None


@dataclass(frozen=True)
class Pruning:
    """What keep-N does to a layer: the checkpoints it deletes, the invalid ones it keeps."""

    deleted: list[CheckpointRef]
    invalid: dict[CheckpointRef, tuple[Problem, ...]] = field(default_factory=dict)


def prune_plan(
    found: Mapping[CheckpointRef, bool],
    keep: int,
    lineage: Lineage,
    problems: Callable[[CheckpointRef, bool], Sequence[Problem]],
) -> Pruning:
    """What keep-N deletes from a layer's checkpoints (`found`: ref -> manifest present).

    Only checkpoints in the lineage count and only they are ever deleted: the newest `keep`
    that verify are kept, older complete ones that verify go (never the newest verified before
    a newer one has verified), and invalid ones, wherever they are, stay for inspection and are
    reported. `problems(ref, deep)` verifies one: `deep` for the `keep` newest candidates (their
    hashes, where the layer can tell them), a cheaper check (manifest, sizes) for an older one,
    which only needs to be recognised as a superseded checkpoint. A partial upload in the
    lineage older than the newest kept checkpoint was abandoned (only the newest is ever
    shipped) and goes too. Checkpoints outside the lineage (a zombie's, one not reported yet)
    stay.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    ours = [ref for ref in found if lineage.accepts(ref)]
    complete = sorted((ref for ref in ours if found[ref]), reverse=True)
    kept: list[CheckpointRef] = []
    doomed: list[CheckpointRef] = []
    invalid: dict[CheckpointRef, tuple[Problem, ...]] = {}
    for ref in complete:
        deep = len(kept) < keep
        wrong = tuple(problems(ref, deep))
        if wrong:
            invalid[ref] = wrong
        elif deep:
            kept.append(ref)
        else:
            doomed.append(ref)
    if kept:
        doomed += [ref for ref in ours if not found[ref] and ref.step < kept[0].step]
    return Pruning(doomed, invalid)
