"""What each rank of the DCP tests runs (started by torch.multiprocessing.spawn, gloo on CPU).

A small model is sharded with FSDP2 (`fully_shard`) over a CPU device mesh, trained two steps so
that the optimizer holds state, and its model and optimizer state dicts (`get_state_dict`:
DTensor shards) are saved through the trainguard DCP writer. A load builds a fresh model (other
initial weights), loads through the trainguard reader, applies the state (`set_state_dict`) and
reads it back. Each rank leaves its results as files in `out` for the test to compare:
`expected-<rank>.pt` (what it saved), `fresh-<rank>.pt` (what the fresh model held before the
load), `loaded-<rank>.pt` (what it holds after the load),
`refused-<rank>.txt` (the load's error when the reader refused the checkpoint).
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.futures import Future

from trainguard_harness.dcp import TrainguardWriter, trainguard_reader, trainguard_writer
from trainguard_harness.ranks import end_process

WORLD = 2
TIMEOUT = timedelta(seconds=60)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        out: torch.Tensor = self.layers[-1](x)
        return out


def finish() -> None:
    """End this rank: its process group, then the process, without the interpreter's finalization.

    A gloo thread left behind by the group must not meet the finalization (`end_process`).
    """
    dist.destroy_process_group()
    end_process(0)


def start(rank: int, rendezvous: Path) -> DeviceMesh:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=WORLD,
        timeout=TIMEOUT,
    )
    return init_device_mesh("cpu", (WORLD,))


def build(mesh: DeviceMesh, seed: int) -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = Net()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: Net, optim: torch.optim.Optimizer, rank: int, steps: int) -> None:
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        loss = model(torch.randn(8, 16, generator=generator)).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()


def state_of(model: Net, optim: torch.optim.Optimizer) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd}


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf by its path; a DTensor becomes this rank's local shard (a plain copy)."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}{key}/"))
        return flat
    if isinstance(value, list | tuple):
        flat = {}
        for index, item in enumerate(value):
            flat.update(flatten(item, f"{prefix}{index}/"))
        return flat
    if isinstance(value, DTensor):
        return {prefix: value.to_local().detach().clone()}
    if isinstance(value, torch.Tensor):
        return {prefix: value.detach().clone()}
    return {prefix: value}


def trained_state(rank: int, rendezvous: Path) -> tuple[Net, torch.optim.Optimizer]:
    mesh = start(rank, rendezvous)
    model, optim = build(mesh, seed=0)
    train(model, optim, rank, steps=2)
    return model, optim


class DiesBeforeFinish(TrainguardWriter):
    """The coordinator is killed after every shard is written, before it commits."""

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class DiesWhileWriting(TrainguardWriter):
    """Rank 1 is killed after writing its shard, before it reports it."""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        written = super().write_data(plan, planner)
        if plan.storage_data.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return written


WRITERS: dict[str, type[TrainguardWriter]] = {
    "dies-before-finish": DiesBeforeFinish,
    "dies-while-writing": DiesWhileWriting,
}


def save(rank: int, rendezvous: Path, root: Path, step: int, out: Path, mode: str) -> None:
    """Save the trained state as `step` (`mode`: sync, async, or a writer that dies)."""
    model, optim = trained_state(rank, rendezvous)
    state = state_of(model, optim)
    torch.save(flatten(state), out / f"expected-{rank}.pt")
    if mode == "sync":
        dcp.save(state, storage_writer=trainguard_writer(root, step))
    elif mode == "async":
        dcp.async_save(state, storage_writer=trainguard_writer(root, step)).result()  # type: ignore[union-attr]
    else:
        dcp.save(state, storage_writer=trainguard_writer(root, step - 1))
        dcp.save(state, storage_writer=WRITERS[mode](root, step))
    finish()


def load(rank: int, rendezvous: Path, checkpoint: Path, out: Path) -> None:
    """Load `checkpoint` into a fresh model and optimizer; leave what they hold, or the error."""
    mesh = start(rank, rendezvous)
    model, optim = build(mesh, seed=1)
    state = state_of(model, optim)
    torch.save(flatten(state), out / f"fresh-{rank}.pt")
    try:
        dcp.load(state, storage_reader=trainguard_reader(checkpoint))
    except CheckpointException as error:
        (out / f"refused-{rank}.txt").write_text(str(error))
    else:
        set_state_dict(
            model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        torch.save(flatten(state_of(model, optim)), out / f"loaded-{rank}.pt")
    finish()


def unsettled_save(rank: int, rendezvous: Path, root: Path, out: Path) -> None:
    """A sharded session whose coordinator cannot settle a save: every rank must see it fail.

    Rank 0's read-back of step 10 fails (as a checkpoint that does not verify after writing
    would); both ranks then save step 10 again at `close`, as they would at the end of
    training. Each rank leaves what its save returned and its last saved step in `out`.
    """
    from trainguard_harness.ranks import Ranks
    from trainguard_harness.settings import HarnessSettings
    from trainguard_harness.sharded import ShardedModel, ShardedOptimizer, ShardedSession
    from trainguard_harness.writer import CheckpointSaveError, PersistStats

    model, optim = trained_state(rank, rendezvous)
    settings = HarnessSettings.from_env(
        {}, l1_dir=root, l0_dir=None, state_dir=out / f"state-{rank}",
        heartbeat_file=out / f"state-{rank}" / "heartbeat.json",
    )  # fmt: skip
    ranks = Ranks(rank=rank, local_rank=rank, world_size=WORLD, local_world_size=WORLD)
    session = ShardedSession(
        {"model": ShardedModel(model), "optimizer": ShardedOptimizer(model, optim)},
        settings,
        handle_sigterm=False,
        ranks=ranks,
    )
    if rank == 0:
        settle = session.writer.settle
        failures = [1]

        def settle_once_failing(committed: Any, write_seconds: float = 0.0) -> PersistStats:
            if failures:
                failures.pop()
                raise CheckpointSaveError(10, f"{committed.path} does not verify after writing")
            return settle(committed, write_seconds)

        session.writer.settle = settle_once_failing  # type: ignore[method-assign]
    first = session.save(10)
    after_first = session.last_saved_step
    session.close(10)  # the final save: again on every rank, or on none
    (out / f"result-{rank}.txt").write_text(
        f"{first is not None} {after_first} {session.last_saved_step}"
    )
    finish()
