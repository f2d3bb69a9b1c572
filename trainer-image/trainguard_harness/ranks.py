"""The ranks of a training job, as PyTorch's launcher describes them, and what they agree on.

Under torchrun (`trainguard_harness.launcher`) every rank has the standard RANK, LOCAL_RANK,
WORLD_SIZE and LOCAL_WORLD_SIZE; a process started without a launcher is rank 0 of 1. Data
parallel ranks hold the same state, so only rank 0 saves checkpoints, and every rank must
resume from the same step: rank 0 picks the newest checkpoint that verifies and broadcasts
its step (`agree_on_step`); the others load exactly that one, from their own pod's L1 where
it is there, else from rank 0 (`from_rank0`: the members of a gang other than member 0 have no
copy, rank 0 saves in member 0's L1). A stop (SIGTERM reaches the ranks
at different moments) is agreed on every step with the loss (`reduce_step`), so no rank leaves
the loop while another waits for it in a collective. Without a process group these are
identities. torch is imported only where a process group is used.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

RANK_ENV = "RANK"
LOCAL_RANK_ENV = "LOCAL_RANK"
WORLD_SIZE_ENV = "WORLD_SIZE"
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"


def end_process(code: int) -> NoReturn:
    """End this process with `code` now, without the interpreter's finalization.

    For a process that ran collectives: the backend's C++ threads (gloo's, NCCL's) may
    outlive `destroy_process_group`, and one that needs the GIL while the interpreter
    finalizes aborts the process (SIGABRT, "terminate called without an active exception")
    after work that completed, which its launcher then counts as a failure. Call it last,
    once checkpoints are closed and the process group destroyed: logs and output are flushed.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing to keep
            stream.flush()
    os._exit(code)


def _number(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: not an integer") from None


@dataclass(frozen=True)
class Ranks:
    """Where the calling process stands among the job's ranks."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    def __post_init__(self) -> None:
        if not (0 <= self.rank < self.world_size and 0 <= self.local_rank < self.local_world_size):
            raise ValueError(f"inconsistent ranks: {self}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Ranks:
        """The launcher's description of this process (rank 0 of 1 without a launcher)."""
        variables = os.environ if environ is None else environ
        world = _number(variables, WORLD_SIZE_ENV, 1)
        return cls(
            rank=_number(variables, RANK_ENV, 0),
            local_rank=_number(variables, LOCAL_RANK_ENV, 0),
            world_size=world,
            local_world_size=_number(variables, LOCAL_WORLD_SIZE_ENV, world),
        )

    @property
    def distributed(self) -> bool:
        """Whether there are other ranks to agree with."""
        return self.world_size > 1

    @property
    def saves(self) -> bool:
        """Whether this rank writes checkpoints (rank 0: the state is replicated)."""
        return self.rank == 0

    @property
    def per_rank_heartbeat(self) -> bool:
        """Whether this pod runs several ranks, each with a heartbeat of its own."""
        return self.local_world_size > 1


def process_group() -> Any:
    """torch.distributed when a process group is up, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    return dist if dist.is_available() and dist.is_initialized() else None


def _device() -> Any:
    """Where collectives' tensors live: the rank's GPU for nccl, the CPU otherwise."""
    import torch

    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree_on_step(step: int) -> int:
    """Rank 0's `step`, on every rank (the step rank 0 resumes from)."""
    dist = process_group()
    if dist is None or dist.get_world_size() == 1:
        return step
    import torch

    value = torch.tensor([step], dtype=torch.int64, device=_device())
    dist.broadcast(value, src=0)
    return int(value.item())


def rank0_decides(decision: bool) -> bool:
    """Rank 0's `decision`, on every rank (one taken on rank 0's clock, such as a time cadence)."""
    return bool(agree_on_step(int(decision)))


def every_rank(mine: bool) -> bool:
    """Whether `mine` holds on every rank (a collective: every rank calls it)."""
    dist = process_group()
    if dist is None or dist.get_world_size() == 1:
        return mine
    import torch

    failing = torch.tensor([int(not mine)], dtype=torch.int64, device=_device())
    dist.all_reduce(failing)
    return int(failing.item()) == 0


def reduce_step(loss: float, stop: bool) -> tuple[float, bool]:
    """(the mean of every rank's loss, whether any rank was asked to stop)."""
    dist = process_group()
    if dist is None or dist.get_world_size() == 1:
        return loss, stop
    import torch

    values = torch.tensor([loss, float(stop)], dtype=torch.float64, device=_device())
    dist.all_reduce(values)
    return float(values[0].item()) / dist.get_world_size(), bool(values[1].item() > 0)


def from_rank0(mine: T | None) -> T | None:
    """`mine` where this rank has it; rank 0's where any rank lacks its own (None).

    Every rank calls it (a collective): they first count the ranks without their own copy,
    and only when there are some does rank 0 send its object to all (pickled, over the process
    group). Rank 0 must have one.
    """
    dist = process_group()
    if dist is None or dist.get_world_size() == 1:
        return mine
    import torch

    lacking = torch.tensor([int(mine is None)], dtype=torch.int64, device=_device())
    dist.all_reduce(lacking)
    if int(lacking.item()) == 0:
        return mine
    sent = _broadcast_bytes(pickle.dumps(mine) if dist.get_rank() == 0 else b"")
    return mine if mine is not None else pickle.loads(sent)  # rank 0 pickled its own object


def _broadcast_bytes(payload: bytes) -> bytes:
    """Rank 0's `payload` on every rank: its length, then its bytes, as uint8 tensors.

    Not `broadcast_object_list`, which needs numpy to read what it received: the trainer image
    has none, and a training script need not.
    """
    import torch

    dist = process_group()
    device = _device()
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if dist.get_rank() == 0:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    else:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=0)
    host = data.cpu()
    return ctypes.string_at(host.data_ptr(), host.numel())
