"""Sharded checkpoints: every rank saves its own part of the state (FSDP2, DTensor).

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    parts = {"model": ShardedModel(model), "optimizer": ShardedOptimizer(model, optimizer),
             "scheduler": scheduler, "data": loader}
    session = ShardedSession(parts)          # the TrainingSession surface; every rank saves
    start = session.resume()

`TrainingSession` has rank 0 save a replicated state. Here each rank holds a part of the state
(its shards of the parameters and of the optimizer's moments), so each rank saves it: every
checkpoint is written with `torch.distributed.checkpoint` through trainguard's storage writer
(`trainguard_harness.dcp`) as one global checkpoint in L1: each rank's files under its
`rank-<k>/`, the global manifest written last by the coordinator (rank 0) once every rank's
shard is there. The ranks share L1 (the ranks of one pod).

- **One L1 that every rank sees**: the ranks of one pod share theirs. A gang's members
  (`spec.trainer.nodes` > 1) each have their own node's L1, where the coordinator can neither
  gather nor verify the other members' shards, so every save would fail. When the ranks span
  several pods, the session looks when it is built: rank 0 leaves a probe file in its L1 and
  every rank looks for it in its own; unless every rank sees it (a root every member mounts),
  the session is refused (`SpansPodsError`, naming both ways out) before any step is trained.

- **Save**, on every rank at the same steps: the step cadence is the same everywhere, the time
  cadence is read on rank 0's clock and told to all (`rank0_decides`). It is `dcp.save`, so the
  loop waits for the write (`async_save` would run its collectives in a thread beside the
  training's, which needs a process group of its own). Rank 0 then reads the checkpoint back
  and applies keep-last-N to L1 (`CheckpointWriter.settle`), as for a save of its own, and
  tells every rank whether it did: a checkpoint that does not verify after writing fails the
  save on every rank alike, so the ranks keep agreeing on what was saved.
- **Resume**: rank 0 picks the newest L1 checkpoint that verifies as a whole (every rank's
  files hashed); one with any rank's file missing or corrupt is skipped as a whole (rank 0's
  intact shard of it is never read), kept, and reported like any invalid checkpoint (the
  heartbeat's findings, `restore.json`). Every rank then loads its own shard of that one
  checkpoint through the verifying reader, so all ranks resume from one global step.
- **RNG states** are each rank's own (its dropout draws its own numbers): saved under
  `rng/<rank>`, restored on that rank.
- **No L0**: a memory snapshot of one rank's part is no checkpoint, so a restart in place
  resumes from L1. Only checkpoints written this way are read: a replicated one (rank 0's
  `model.safetensors`) has no DCP metadata: the reader refuses it, and the trainer stops
  with its error rather than start afresh.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from trainguard.api.constants import L1_LAYER
from trainguard.ckpt import Search, find_newest_valid, step_dirname, verify
from trainguard_harness import heartbeat as hb
from trainguard_harness import rng
from trainguard_harness.dcp import TrainguardReader, TrainguardWriter
from trainguard_harness.ranks import Ranks, agree_on_step, every_rank, from_rank0, rank0_decides
from trainguard_harness.reader import LoadedCheckpoint, LoadResult
from trainguard_harness.session import RNG_COMPONENT, TrainingSession
from trainguard_harness.writer import CheckpointSaveError, CheckpointWriter, SaveStats

LOG = logging.getLogger(__name__)
# Rank 0's probe file in its L1, looked for by every rank in its own (`shares_l1`).
PROBE_PREFIX = ".l1-probe-"


class ShardedModel:
    """A sharded module as a checkpoint component: this rank's shards (DTensors) of its state."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        """The calling rank's part of the model's state, by fully qualified name."""
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put a loaded state back into the sharded parameters."""
        set_model_state_dict(self.model, state)


class ShardedOptimizer:
    """An optimizer over sharded parameters as a checkpoint component (its moments sharded too).

    Its state is keyed by parameter name, not position: the form DCP saves and reshards.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        """The calling rank's part of the optimizer's state (allocated first when fresh).

        DCP loads in place into what this returns, so a fresh optimizer gets its state
        allocated (a step at learning rate 0) before a load.
        """
        state: dict[str, Any] = get_optimizer_state_dict(self.model, self.optimizer)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put a loaded state back into the optimizer."""
        set_optimizer_state_dict(self.model, self.optimizer, state)


class SpansPodsError(RuntimeError):
    """The ranks of a sharded session run in several pods that do not share one L1."""


def shares_l1(l1: Path, ranks: Ranks) -> bool:
    """Whether every rank sees rank 0's L1 as its own (a collective: every rank calls it).

    Rank 0 writes a probe file there and sends its name; each rank looks for it in its own L1;
    rank 0 removes it once every rank has looked.
    """
    probe: Path | None = None
    if ranks.rank == 0:
        probe = l1 / f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        l1.mkdir(parents=True, exist_ok=True)
        probe.touch()
    name = from_rank0(None if probe is None else probe.name)
    assert name is not None  # rank 0 always has one
    try:
        return every_rank((l1 / name).exists())
    finally:
        if probe is not None:
            probe.unlink(missing_ok=True)


class ShardedSession(TrainingSession):
    """A `TrainingSession` whose every rank saves its shard of each global checkpoint.

    See the module docstring. The process group is up before it is built; every rank sees
    one L1 (raises `SpansPodsError` otherwise).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """`TrainingSession`'s arguments; raises `SpansPodsError` before any step is trained."""
        super().__init__(*args, **kwargs)
        ranks = self.ranks
        if ranks.world_size > ranks.local_world_size and not shares_l1(self.settings.l1_dir, ranks):
            pods = -(-ranks.world_size // ranks.local_world_size)
            raise SpansPodsError(
                f"sharded checkpoints need every rank in one pod: these {ranks.world_size} "
                f"ranks run in {pods} pods ({ranks.local_world_size} each, spec.trainer.nodes "
                "> 1), and each pod's L1 is its own node's disk, where rank 0 cannot gather or "
                "verify the other pods' shards. Train sharded on one node (spec.trainer.nodes: "
                "1), or save a replicated state (TrainingSession: rank 0 saves, every member "
                "resumes from it)"
            )

    def _new_l0_writer(self) -> CheckpointWriter | None:
        return None  # one rank's part of the state is no checkpoint (module docstring)

    def state(self) -> dict[str, object]:
        """Every component's state (this rank's part of it), with this rank's RNG states."""
        state: dict[str, object] = {
            name: component.state_dict() for name, component in self.components.items()
        }
        state[RNG_COMPONENT] = {str(self.ranks.rank): rng.capture()}
        return state

    def resume(self) -> int:
        """Load every rank's shard of the newest checkpoint that verifies as a whole; its step.

        0 on a fresh run.
        """
        self.heartbeat.update(phase=hb.PHASE_LOADING)
        l1 = self.settings.l1_dir
        # Rank 0 chooses, reading every rank's files; the others load what it chose.
        search = find_newest_valid(l1) if self.ranks.saves else Search(None, ())
        for invalid in search.skipped:
            self._on_invalid(L1_LAYER, invalid)
        newest = search.newest
        step = agree_on_step(0 if newest is None or newest.step is None else newest.step)
        loaded: LoadedCheckpoint | None = None
        if step:
            path = l1 / step_dirname(step)
            state = self.state()
            dcp_load(state, storage_reader=TrainguardReader(path))
            for name, component in self.components.items():
                component.load_state_dict(state[name])
            rng_states = state[RNG_COMPONENT]
            assert isinstance(rng_states, dict)  # as `state()` built it
            rng.restore(rng_states[str(self.ranks.rank)])
            chosen = newest if newest is not None else verify(path, check_hashes=False)
            assert chosen.manifest is not None  # the reader refuses a checkpoint without one
            loaded = LoadedCheckpoint(path, chosen.manifest, state)
            self.last_saved_step = step
            LOG.info("rank %d resumed from %s (layer %s)", self.ranks.rank, path, L1_LAYER)
        result = LoadResult(
            loaded,
            search.skipped,
            L1_LAYER if loaded is not None else None,
            (L1_LAYER,) * len(search.skipped),
        )
        self.resumed = result
        if self.ranks.saves:
            self._record_restore(result)
        self._last_save_time = time.monotonic()
        self.heartbeat.update(phase=hb.PHASE_TRAINING, step=step, last_checkpoint_step=step or None)
        return step

    def end_step(self, step: int, *, loss: float | None = None, tokens: int = 0) -> None:
        """Report a finished step; every rank saves its shard when the cadence says so.

        Raises CheckpointSaveError only when `on_save_error` is `stop`.
        """
        self.report_step(step, loss=loss, tokens=tokens)
        due = self.due(step)
        if self.settings.every_seconds:
            due = rank0_decides(due)  # the ranks' clocks differ; they must save together
        if due:
            self.save(step)

    def save(self, step: int) -> SaveStats | None:
        """Save this rank's shard of the checkpoint of `step` (every rank calls it); None if failed.

        The loop waits for the whole save: the stall is the save's time.
        """
        return self._saving(step, lambda: self._guard(lambda: self._save_shard(step)))

    def _save_shard(self, step: int) -> SaveStats:
        started = time.perf_counter()
        writer = TrainguardWriter(
            self.settings.l1_dir, step, algorithm=self.settings.hash_algorithm
        )
        try:
            dcp_save(self.state(), storage_writer=writer)
        except CheckpointException as error:
            # Raised on every rank alike: the ranks keep agreeing on what was saved.
            raise CheckpointSaveError(step, str(error)) from error
        committed = writer.committed
        unsettled: str | None = None
        if committed is not None:  # the coordinator: read back, keep-last-N, the SAVED event
            try:
                self.writer.settle(committed, time.perf_counter() - started)
            except (CheckpointSaveError, OSError) as error:
                unsettled = str(error)
        # Every rank learns whether the coordinator settled it: a save that counts on some
        # ranks only would have them save again at different steps (a collective one side
        # never joins, `close`'s final save included).
        if not rank0_decides(unsettled is None):
            raise CheckpointSaveError(step, unsettled or "the coordinator could not settle it")
        if committed is not None:
            nbytes = committed.manifest.total_bytes
        else:
            self.heartbeat.update(last_checkpoint_step=step, checkpoint_error=None)
            nbytes = 0  # the coordinator alone knows the whole checkpoint's size
        return SaveStats(step, 0.0, time.perf_counter() - started, nbytes)
