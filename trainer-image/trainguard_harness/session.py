"""The library surface a training script adopts: resume, report each step, checkpoint on cadence.

    parts = {"model": model, "optimizer": opt, "scheduler": sched, "data": loader}
    session = TrainingSession(parts)
    start = session.resume()                     # 0 on a fresh run
    for step in range(start + 1, total + 1):
        loss = train_one_step(...)
        session.end_step(step, loss=loss.item(), tokens=tokens_in_batch)
        if session.stop_requested:                # SIGTERM: the pod is being deleted
            break
    session.close(step)                          # final checkpoint, waits until it is durable

Every component is any object with `state_dict()` / `load_state_dict()` (torch modules,
optimizers, schedulers, or a small class holding a data position). RNG states (Python, numpy,
torch CPU and CUDA) are saved and restored automatically as the `rng` component. Paths and
cadence come from the environment contract (`HarnessSettings.from_env`).

Several ranks (torchrun, `trainguard_harness.ranks`): every rank reports its steps in its own
heartbeat; only rank 0 saves (the state is replicated); `resume()` loads on every rank the
checkpoint rank 0 chose, so all ranks start from the same step. Initialise the process group
before `resume()`. A state sharded over the ranks (FSDP2, DTensor), which every rank saves its
part of, takes `trainguard_harness.sharded.ShardedSession` instead.

L0 (`HarnessSettings.l0_dir`, the pod-memory layer the operator mounts; off when unset): a
second writer keeps the last `L0_KEEP_LAST` checkpoints there, in the same verified format, at
a cadence of its own (hashed as written, not read back: see `verify_after_write` below; a
resume verifies it): after a step, once the previous L0 persist is done, when a snapshot's
stall (the least of the last `L0_STALL_SAMPLES`) is at most `L0_STALL_BUDGET` (1 %) of the
loop's time since the last one; and, whatever the budget says, every `L0_SMALL_EVERY_STEPS`
(2) steps while it stalls at most `L0_STALL_FLOOR_S` (5 ms, the fixed cost of copying a small
state tensor by tensor). So a small state is snapshotted every step of a second or more and
every other step of a fast loop (a death loses at most the one step since, at half the cost
of a snapshot every step), a large one as often as 1 % of the loop allows (3 GB at 0.26 s: one
every 26 s); it never waits for a persist. L0 survives the trainer's death (the pod owns it),
so `resume()` takes the newest checkpoint that verifies across L0 and L1 and a software death
loses about one step. A resume that did not come from the checkpoint the restore step
reported (one from L0, or a newer L1 one after a restart in place) is recorded in
`restore.json` for the agent to tell.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar

from trainguard.api.constants import L0_LAYER, L1_LAYER, FoundBy
from trainguard.api.spec import STEP_TIME_WINDOW
from trainguard.ckpt import Contents, Problem, Verification, step_dirname
from trainguard.contract.env import L0_KEEP_LAST
from trainguard.contract.files import (
    RESTORE_FILENAME,
    RestoreReport,
    read_restore_report,
    write_restore_report,
)
from trainguard.contract.findings import MAX_HEARTBEAT_FINDINGS, Finding, newest
from trainguard_harness import heartbeat as hb
from trainguard_harness import rng
from trainguard_harness.heartbeat import Heartbeat
from trainguard_harness.ranks import Ranks, agree_on_step, from_rank0, process_group
from trainguard_harness.reader import (
    CheckpointCorruptError,
    LoadedCheckpoint,
    LoadResult,
    load_newest_of,
    load_step,
)
from trainguard_harness.settings import HarnessSettings, OnSaveError
from trainguard_harness.stackdump import install_stack_dumps
from trainguard_harness.writer import (
    CheckpointEvent,
    CheckpointSaveError,
    CheckpointWriter,
    EventKind,
    SaveStats,
    log_event,
)

LOG = logging.getLogger(__name__)
RNG_COMPONENT = "rng"
_COMPONENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
# tokens/s is averaged over at least this long, so one fast or slow step does not dominate.
RATE_WINDOW_S = 1.0
# Step times the slowest recent step is published from: no figure before this many (the first
# steps after a start compile and warm caches).
MIN_STEP_TIMES = 5
# L0's share of the loop's time: a snapshot is taken once the time since the last one is at
# least its stall / this (1 %: 0.1 ms of stall for a 10 ms step allows one every step).
L0_STALL_BUDGET = 0.01
# A snapshot stalling at most this long is taken at least every L0_SMALL_EVERY_STEPS steps,
# whatever the budget says: a death then loses at most the one step since the last snapshot.
L0_STALL_FLOOR_S = 0.005
L0_SMALL_EVERY_STEPS = 2
# The stall a snapshot is expected to cost: the least of the last few. Other processes taking
# the CPU mid-copy only ever lengthen a stall; on a busy node the median of the wall times
# suspended L0 for seconds after one preempted copy (steps lost: median 3 instead of 1).
L0_STALL_SAMPLES = 5

T = TypeVar("T")


class Stateful(Protocol):
    """What a checkpointed component provides (the torch convention)."""

    def state_dict(self) -> Any:
        """Return the component's state."""

    def load_state_dict(self, state_dict: Any, /) -> Any:
        """Replace the component's state."""


class MissingComponentError(KeyError):
    """A full checkpoint lacks a component the session was asked to restore."""


def restore_components(components: Mapping[str, Stateful], loaded: LoadedCheckpoint) -> None:
    """Load a decoded checkpoint into the components, then restore the RNG states last.

    A weights-only checkpoint restores what it has and leaves the rest freshly initialised.
    """
    weights_only = loaded.manifest.contents is Contents.WEIGHTS
    for name, component in components.items():
        if name in loaded.components:
            component.load_state_dict(loaded.components[name])
        elif not weights_only:
            raise MissingComponentError(f"{loaded.path} has no component {name!r}")
    state = loaded.components.get(RNG_COMPONENT)
    if isinstance(state, dict):
        rng.restore(state)


class TrainingSession:
    """Checkpoints, heartbeat, stack dumps and graceful stop for one training process."""

    def __init__(
        self,
        components: Mapping[str, Stateful],
        settings: HarnessSettings | None = None,
        *,
        verify_after_write: bool = True,
        handle_sigterm: bool = True,
        ranks: Ranks | None = None,
    ) -> None:
        for name in components:
            if name == RNG_COMPONENT or not _COMPONENT_NAME.match(name):
                raise ValueError(f"invalid component name {name!r}")
        self.components = dict(components)
        self.settings = settings or HarnessSettings.from_env()
        self.ranks = ranks or Ranks.from_env()
        self.heartbeat = self._heartbeat()
        self.writer = CheckpointWriter(
            self.settings.l1_dir,
            keep_last=self.settings.keep_last,
            algorithm=self.settings.hash_algorithm,
            verify_after_write=verify_after_write,
            on_event=self._on_event,
        )
        self.l0_writer = self._new_l0_writer()
        self.last_l0_step: int | None = None
        self._l0_stalls: deque[float] = deque(maxlen=L0_STALL_SAMPLES)  # the last stalls
        self._l0_time = time.monotonic()
        self.stacks_file = install_stack_dumps(self.settings.state_dir)
        self.stop_requested = False
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._request_stop)
        self.last_saved_step: int | None = None
        self.last_save_stats: SaveStats | None = None
        self.resumed: LoadResult | None = None
        self._steps_this_process = 0
        self._last_save_time = time.monotonic()
        self._rate_start = time.monotonic()
        # Seconds between consecutive reported steps of this process, the newest last.
        self._step_times: deque[float] = deque(maxlen=STEP_TIME_WINDOW)
        self._step_reported_at: float | None = None
        self._rate_tokens = 0
        # Invalid L1 checkpoints, for the heartbeat; the writer's thread reports them too.
        self._findings: list[Finding] = []
        self._findings_lock = threading.Lock()

    def _new_l0_writer(self) -> CheckpointWriter | None:
        """L0's writer: rank 0's alone, which saves (and removes a killed writer's leftovers)."""
        l0_dir = self.settings.l0_dir
        if l0_dir is None or not self.ranks.saves:
            return None
        return CheckpointWriter(
            l0_dir,
            keep_last=L0_KEEP_LAST,
            algorithm=self.settings.hash_algorithm,
            # Memory has no device behind a page cache to read back from: a read-back would
            # hash again the bytes just hashed as they were written, and keep the writer busy
            # (no snapshot) for as long. A snapshot is verified where it counts, before a
            # resume uses it (`resume`), which also catches a byte flipped in memory since.
            verify_after_write=False,
            on_event=self._on_l0_event,
            # Short writes into memory that must keep up with the steps: not yielded to the
            # loop (a niced persist starves on a busy node and L0 falls steps behind).
            background=False,
        )

    def _heartbeat(self) -> Heartbeat:
        """The heartbeat of the calling rank: a file of its own where the pod runs several."""
        ranks = self.ranks
        if not ranks.per_rank_heartbeat:
            return Heartbeat(self.settings.heartbeat_file)
        main = self.settings.heartbeat_file
        return Heartbeat(
            self.settings.pod.rank_heartbeat(ranks.local_rank),
            copies=(main,) if ranks.local_rank == 0 else (),
            rank=ranks.rank,
            local_rank=ranks.local_rank,
        )

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        LOG.warning("received %s: stopping after this step", signal.Signals(signum).name)
        self.stop_requested = True

    def _on_event(self, event: CheckpointEvent) -> None:
        log_event(event)
        if event.kind is EventKind.SAVED:
            self.heartbeat.update(last_checkpoint_step=event.step, checkpoint_error=None)
        elif event.kind is EventKind.FAILED:
            self.heartbeat.update(checkpoint_error=event.message)
        elif event.kind is EventKind.INVALID:
            self._found(L1_LAYER, event.step, event.problems)

    def _on_l0_event(self, event: CheckpointEvent) -> None:
        # L0 is the fast layer, not the durable one: its saves are not the heartbeat's
        # checkpoint (L1's), and a failed one only costs its cadence.
        if event.kind is EventKind.INVALID:
            log_event(event)
            self._found(L0_LAYER, event.step, event.problems)
        elif event.kind is EventKind.FAILED:
            LOG.warning("L0 %s", event.message)
        elif event.kind is not EventKind.SAVED:
            LOG.debug("L0 %s", event.message)

    def _on_invalid(self, layer: str, result: Verification) -> None:
        LOG.error(
            "skipping invalid %s checkpoint %s: %s", layer, result.path, "; ".join(result.reasons)
        )
        writer = self.l0_writer if layer == L0_LAYER else self.writer
        if writer is not None:
            writer.note_invalid(result.path)  # kept: keep-last-N could not tell it later
        self._found(layer, result.step, result.problems)

    def _found(self, layer: str, step: int | None, problems: tuple[Problem, ...]) -> None:
        """An invalid checkpoint, for the agent to tell: into the heartbeat's newest list."""
        finding = Finding.of(layer, step, problems, FoundBy.SCAN)
        with self._findings_lock:
            self._findings = newest(self._findings, finding, MAX_HEARTBEAT_FINDINGS)
            listed = [f.to_dict() for f in self._findings]
        self.heartbeat.update(**{hb.INVALID_CHECKPOINTS: listed})

    def state(self) -> dict[str, object]:
        """The state of every component plus the RNG states, as saved in a checkpoint."""
        state: dict[str, object] = {
            name: component.state_dict() for name, component in self.components.items()
        }
        state[RNG_COMPONENT] = rng.capture()
        return state

    def _layers(self) -> list[tuple[str, Path]]:
        """The layers a resume reads, L0 first (at the same step, memory is the faster read)."""
        l0_dir = self.settings.l0_dir
        layers = [] if l0_dir is None else [(L0_LAYER, l0_dir)]
        return [*layers, (L1_LAYER, self.settings.l1_dir)]

    def _load_agreed(self, step: int) -> LoadResult | None:
        """The checkpoint of `step` rank 0 chose, from the first layer that holds it verified.

        None where no layer of this pod holds it at all (a gang's member other than 0); a copy
        that is there but does not verify anywhere raises CheckpointCorruptError.
        """
        error: CheckpointCorruptError | None = None
        for layer, root in self._layers():
            if not (root / step_dirname(step)).is_dir():
                continue
            try:
                return LoadResult(load_step(root, step), (), layer)
            except CheckpointCorruptError as failed:
                error = failed
        if error is not None:
            raise error
        return None

    def resume(self) -> int:
        """Load the newest valid checkpoint of L0 and L1 into the components; return its step.

        0 on a fresh run.
        """
        self.heartbeat.update(phase=hb.PHASE_LOADING)
        # With a process group, every rank resumes from the step rank 0 chose (0: a fresh
        # start), never from its own pick; without one, each rank reads the newest itself.
        agreed = self.ranks.distributed and process_group() is not None
        if self.ranks.saves or not agreed:
            on_invalid = self._on_invalid if self.ranks.saves else None
            result = load_newest_of(self._layers(), on_invalid=on_invalid)
        else:
            result = LoadResult(None, ())
        chosen = agree_on_step(0 if result.loaded is None else result.loaded.step)
        if agreed and chosen:
            # This pod's own copy where it has one (ranks beside rank 0), else rank 0's: a gang
            # member other than member 0 keeps no checkpoints of its own.
            mine = (
                LoadResult(result.loaded, (), result.layer)
                if self.ranks.saves
                else self._load_agreed(chosen)
            )
            shared = from_rank0(mine)
            if not self.ranks.saves and shared is not None:
                result = shared
        self.resumed = result
        step = 0
        if result.loaded is not None:
            restore_components(self.components, result.loaded)
            step = result.loaded.step
            self.last_saved_step = step
            LOG.info(
                "rank %d resumed from %s (layer %s)",
                self.ranks.rank,
                result.loaded.path,
                result.layer,
            )
        if self.ranks.saves:
            self._record_restore(result)
        self._last_save_time = self._l0_time = time.monotonic()
        self.heartbeat.update(phase=hb.PHASE_TRAINING, step=step, last_checkpoint_step=step or None)
        return step

    def _record_restore(self, result: LoadResult) -> None:
        """Leave the resume in `restore.json` when it is not what the report there says.

        The restore step reports what it brought into L1 before the first trainer starts; a
        trainer that resumed from that checkpoint leaves its report (layer, origin) alone. One
        from L0, or from another step (a restart in place), is recorded for the agent.
        """
        path = self.settings.pod.report_file(RESTORE_FILENAME)
        step = None if result.loaded is None else result.loaded.step
        reported = read_restore_report(path)
        if result.layer != L0_LAYER and reported is not None and reported.step == step:
            return
        if reported is None and step is None and not result.skipped:
            return  # a fresh start, as nobody reported otherwise
        skipped = tuple(
            f"{layer} {invalid.path.name}: {'; '.join(invalid.reasons)}"
            for layer, invalid in zip(result.skipped_layers, result.skipped, strict=True)
        )
        report = RestoreReport(
            step=step,
            from_layer=result.layer if step is not None else None,
            skipped=skipped,
            time=time.time(),
        )
        try:
            write_restore_report(path, report)
        except OSError as error:  # the report is for the agent; training goes on without it
            LOG.warning("could not record the resume in %s: %s", path, error)

    def due(self, step: int) -> bool:
        """Whether the cadence calls for a checkpoint after `step`."""
        every_steps, every_seconds = self.settings.every_steps, self.settings.every_seconds
        if every_steps and step % every_steps == 0:
            return True
        return bool(every_seconds) and time.monotonic() - self._last_save_time >= every_seconds

    def end_step(self, step: int, *, loss: float | None = None, tokens: int = 0) -> None:
        """Report a finished step; checkpoint when the cadence says so.

        Raises CheckpointSaveError only when `on_save_error` is `stop`; otherwise a failed save
        is logged and put in the heartbeat, and training goes on.
        """
        self.report_step(step, loss=loss, tokens=tokens)
        if not self.ranks.saves:
            return  # rank 0 saves the replicated state
        self._guard(self.writer.check)
        if self.due(step):
            self.save(step)
        elif self._steps_this_process == 1:
            # Shapes are final after the first step (optimizer state exists now): allocate the
            # snapshot buffers in the background so the first save is as cheap as the others.
            state = self.state()
            self._guard(lambda: self.writer.prepare(state))
            if self.l0_writer is not None:
                self._l0(lambda writer: writer.prepare(state))
            return
        self.save_l0(step)

    def report_step(self, step: int, *, loss: float | None = None, tokens: int = 0) -> None:
        """Put a finished step in the heartbeat (step, loss, tokens/s over the rate window).

        Also the slowest of the last `STEP_TIME_WINDOW` step times (from one report to the
        next, so a save's stall counts in the step it follows), once `MIN_STEP_TIMES` are
        known: the agent's `monitor.hangAfterStepTimes` bound is a multiple of it.
        """
        self._steps_this_process += 1
        self._rate_tokens += tokens
        now = time.monotonic()
        fields: dict[str, Any] = {hb.STEP: step, hb.PHASE: hb.PHASE_TRAINING}
        if self._step_reported_at is not None:
            self._step_times.append(now - self._step_reported_at)
            if len(self._step_times) >= MIN_STEP_TIMES:
                fields[hb.SLOWEST_STEP_S] = round(max(self._step_times), 4)
        self._step_reported_at = now
        if loss is not None:
            fields[hb.LOSS] = loss
        if now - self._rate_start >= RATE_WINDOW_S:
            fields[hb.TOKENS_PER_S] = self._rate_tokens / (now - self._rate_start)
            self._rate_start, self._rate_tokens = now, 0
        self.heartbeat.update(**fields)

    def l0_due(self, step: int) -> bool:
        """Whether L0 takes a snapshot after `step` (the cadence: the module docstring).

        Its writer is idle, and its stall fits the budget, or it is small and
        `L0_SMALL_EVERY_STEPS` steps have passed since the last snapshot.
        """
        if self.l0_writer is None or self.l0_writer.busy:
            return False
        cost = min(self._l0_stalls, default=0.0)
        if cost <= (time.monotonic() - self._l0_time) * L0_STALL_BUDGET:
            return True
        last = self.last_l0_step
        small = cost <= L0_STALL_FLOOR_S
        return small and (last is None or step - last >= L0_SMALL_EVERY_STEPS or step < last)

    def save_l0(self, step: int, *, force: bool = False) -> SaveStats | None:
        """Snapshot into L0 when its cadence calls for it (or `force`, once its writer is idle).

        A failed L0 persist is logged and costs only its cadence: L1 is the durable layer.
        """
        writer = self.l0_writer
        if writer is None or not (force or self.l0_due(step)):
            return None
        state = self.state()
        stats = self._l0(lambda writer: writer.save(step, state))
        self._l0_time = time.monotonic()
        if stats is not None:
            self._l0_stalls.append(stats.stall_seconds)
            self.last_l0_step = step
        return stats

    def _l0(self, action: Callable[[CheckpointWriter], T]) -> T | None:
        """Run `action` on L0's writer; its failure is logged, never raised into training."""
        assert self.l0_writer is not None
        try:
            return action(self.l0_writer)
        except CheckpointSaveError as error:
            LOG.warning("L0: %s; training continues", error)
            return None

    def save(self, step: int) -> SaveStats | None:
        """Checkpoint now, after the previous persist; None if this save could not start.

        Only rank 0 saves; on another rank this does nothing and returns None.
        """
        if not self.ranks.saves:
            return None

        def save() -> SaveStats | None:
            # A failure of the previous persist is reported on its own; this save still runs.
            self._guard(self.writer.wait)
            return self._guard(lambda: self.writer.save(step, self.state()))

        return self._saving(step, save)

    def _saving(self, step: int, save: Callable[[], SaveStats | None]) -> SaveStats | None:
        """Run `save` in the heartbeat's saving phase and record what it saved."""
        self.heartbeat.update(phase=hb.PHASE_SAVING)
        try:
            stats = save()
        finally:
            self.heartbeat.update(phase=hb.PHASE_TRAINING)
        self._last_save_time = time.monotonic()
        if stats is not None:
            self.last_saved_step = step
            self.last_save_stats = stats
            self.heartbeat.update(checkpoint_stall_s=round(stats.stall_seconds, 6))
        return stats

    def _guard(self, action: Callable[[], T]) -> T | None:
        """Run `action`, applying the on-save-error policy to a CheckpointSaveError."""
        try:
            return action()
        except CheckpointSaveError as error:
            self.heartbeat.update(checkpoint_error=str(error))
            if self.settings.on_save_error is OnSaveError.STOP:
                raise
            LOG.error("%s; training continues (on_save_error=continue)", error)
            return None

    def close(self, step: int | None = None) -> None:
        """Save a final checkpoint of `step` (unless it is already the newest), wait for it."""
        try:
            if step is not None and step != self.last_saved_step:
                self.save(step)
            self._guard(self.writer.close)
        finally:
            if self.l0_writer is not None:
                self._l0(lambda writer: writer.close())
            self.heartbeat.update(phase=hb.PHASE_CLOSED)
            self.heartbeat.close()
