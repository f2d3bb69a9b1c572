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
before `resume()`.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, Protocol, TypeVar

from trainguard.api.constants import L1_LAYER, FoundBy
from trainguard.ckpt import Contents, Problem, Verification, step_dirname
from trainguard.contract.findings import MAX_HEARTBEAT_FINDINGS, Finding, newest
from trainguard_harness import heartbeat as hb
from trainguard_harness import rng
from trainguard_harness.heartbeat import Heartbeat
from trainguard_harness.ranks import Ranks, agree_on_step, from_rank0, process_group
from trainguard_harness.reader import LoadedCheckpoint, LoadResult, load_newest, load_step
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
        self._rate_tokens = 0
        # Invalid L1 checkpoints, for the heartbeat; the writer's thread reports them too.
        self._findings: list[Finding] = []
        self._findings_lock = threading.Lock()

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
            self._found(event.step, event.problems)

    def _on_invalid(self, result: Verification) -> None:
        LOG.error("skipping invalid checkpoint %s: %s", result.path, "; ".join(result.reasons))
        self.writer.note_invalid(result.path)  # kept: keep-last-N could not tell it later
        self._found(result.step, result.problems)

    def _found(self, step: int | None, problems: tuple[Problem, ...]) -> None:
        """An invalid L1 checkpoint, for the agent to tell: into the heartbeat's newest list."""
        finding = Finding.of(L1_LAYER, step, problems, FoundBy.SCAN)
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

    def resume(self) -> int:
        """Load the newest valid L1 checkpoint into the components; return its step (0 if none)."""
        self.heartbeat.update(phase=hb.PHASE_LOADING)
        # With a process group, every rank resumes from the step rank 0 chose (0: a fresh
        # start), never from its own pick; without one, each rank reads the newest itself.
        agreed = self.ranks.distributed and process_group() is not None
        if self.ranks.saves or not agreed:
            on_invalid = self._on_invalid if self.ranks.saves else None
            result = load_newest(self.settings.l1_dir, on_invalid=on_invalid)
        else:
            result = LoadResult(None, ())
        chosen = agree_on_step(0 if result.loaded is None else result.loaded.step)
        if agreed and chosen:
            # This pod's own copy where it has one (ranks beside rank 0), else rank 0's: a gang
            # member other than member 0 keeps no checkpoints of its own.
            mine = result.loaded if self.ranks.saves else self._own_copy(chosen)
            loaded = from_rank0(mine)
            if not self.ranks.saves:
                result = LoadResult(loaded, ())
        self.resumed = result
        step = 0
        if result.loaded is not None:
            restore_components(self.components, result.loaded)
            step = result.loaded.step
            self.last_saved_step = step
            LOG.info("rank %d resumed from %s", self.ranks.rank, result.loaded.path)
        self._last_save_time = time.monotonic()
        self.heartbeat.update(phase=hb.PHASE_TRAINING, step=step, last_checkpoint_step=step or None)
        return step

    def _own_copy(self, step: int) -> LoadedCheckpoint | None:
        """The checkpoint of `step` in this pod's L1, verified; None where it is not there."""
        if not (self.settings.l1_dir / step_dirname(step)).is_dir():
            return None
        return load_step(self.settings.l1_dir, step)

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
        self._steps_this_process += 1
        self._rate_tokens += tokens
        now = time.monotonic()
        fields: dict[str, Any] = {hb.STEP: step, hb.PHASE: hb.PHASE_TRAINING}
        if loss is not None:
            fields[hb.LOSS] = loss
        if now - self._rate_start >= RATE_WINDOW_S:
            fields[hb.TOKENS_PER_S] = self._rate_tokens / (now - self._rate_start)
            self._rate_start, self._rate_tokens = now, 0
        self.heartbeat.update(**fields)
        if not self.ranks.saves:
            return  # rank 0 saves the replicated state
        self._guard(self.writer.check)
        if self.due(step):
            self.save(step)
        elif self._steps_this_process == 1:
            # Shapes are final after the first step (optimizer state exists now): allocate the
            # snapshot buffer in the background so the first save is as cheap as the others.
            self._guard(lambda: self.writer.prepare(self.state()))

    def save(self, step: int) -> SaveStats | None:
        """Checkpoint now, after the previous persist; None if this save could not start.

        Only rank 0 saves; on another rank this does nothing and returns None.
        """
        if not self.ranks.saves:
            return None
        self.heartbeat.update(phase=hb.PHASE_SAVING)
        try:
            # A failure of the previous persist is reported on its own; this save still runs.
            self._guard(self.writer.wait)
            stats = self._guard(lambda: self.writer.save(step, self.state()))
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
            self.heartbeat.close()
