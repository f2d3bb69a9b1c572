"""The reference trainer: a GPT-style model on token shards, under the harness.

    python -m trainguard_harness.train --preset tiny --steps 200

Paths and checkpoint cadence come from the TRAINGUARD_* environment (flags override). It
resumes from the newest valid L1 checkpoint automatically, checkpoints every N steps and/or
seconds, logs tokens/s, writes the heartbeat, and on SIGTERM saves and exits with 143. With
`--loss-log FILE` it appends one JSON line per step (`{"step": s, "loss": l}`), which is how the
tests compare a resumed run with an uninterrupted one.

Under torchrun (several ranks in a pod, `spec.trainer.procsPerNode`) it trains data-parallel
(DDP: gloo on CPU, nccl on GPUs, rank r on GPU `LOCAL_RANK`): each rank reads its own part of
every batch, rank 0 alone saves and writes `--loss-log` (the mean of the ranks' losses), and
every rank resumes from the step rank 0 chose (`trainguard_harness.ranks`).

`--sharded` trains fully sharded instead (FSDP2, `fully_shard` per block and on the model: each
rank holds its part of the parameters and of the optimizer's moments; gloo on CPU): every rank
saves its shard of each checkpoint into one global checkpoint (`torch.distributed.checkpoint`
through trainguard's writer, the global manifest written last by rank 0), and on resume every
rank loads its shard of the newest checkpoint that verifies as a whole: one with a corrupt
shard on any rank is skipped, and all ranks resume from the one before
(`trainguard_harness.sharded`). The ranks share L1 (one pod), save synchronously, and use no
L0. Run alone (no launcher) it is one rank holding the whole state.

`--min-step-seconds S` makes every step last at least S seconds (the loop waits out the rest).
On a CPU the tiny model steps in milliseconds, far faster than any accelerator step, so a
background save would span several steps; with a floor such as 0.1 s the ratio of save time to
step time is a real run's, which the end-to-end tests and the demo rely on (a save in flight
then loses at most the one step it overlaps, and steps lost stay within the interval).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import random
import signal
import time
from pathlib import Path

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from trainguard.contract.files import share_with_pod
from trainguard_harness.model import GPT, PRESETS
from trainguard_harness.ranks import Ranks, end_process, reduce_step
from trainguard_harness.session import TrainingSession
from trainguard_harness.settings import HarnessSettings, OnSaveError
from trainguard_harness.sharded import ShardedModel, ShardedOptimizer, ShardedSession
from trainguard_harness.shards import TokenStream

LOG = logging.getLogger("trainguard_harness.train")
EXIT_TERMINATED = 128 + signal.SIGTERM


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see --help)."""
    parser = argparse.ArgumentParser(
        prog="python -m trainguard_harness.train", description=__doc__.split("\n")[0]
    )
    model = parser.add_argument_group("model")
    model.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    for name in ("vocab-size", "block-size", "n-layer", "n-head", "n-embd"):
        model.add_argument(f"--{name}", type=int, help="override the preset")
    model.add_argument("--dropout", type=float, help="override the preset")
    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=int, default=200, help="total optimizer steps")
    train.add_argument("--batch-size", type=int, default=8)
    train.add_argument("--lr", type=float, default=3e-3)
    train.add_argument("--warmup-steps", type=int, default=10)
    train.add_argument("--seed", type=int, default=1337)
    train.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    train.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    train.add_argument("--log-every", type=int, default=10, help="steps between log lines")
    train.add_argument("--loss-log", type=Path, help="append {step, loss} JSON lines here")
    train.add_argument(
        "--sharded",
        action="store_true",
        help="shard the model and optimizer over the ranks (FSDP2); every rank saves its shard",
    )
    train.add_argument(
        "--min-step-seconds",
        type=float,
        default=0.0,
        help="a floor on each step's time, standing in for an accelerator's step (default: none)",
    )
    paths = parser.add_argument_group("harness (default: TRAINGUARD_* environment)")
    paths.add_argument("--data-dir", type=Path)
    paths.add_argument("--l1-dir", type=Path)
    paths.add_argument("--state-dir", type=Path)
    paths.add_argument("--heartbeat-file", type=Path)
    paths.add_argument("--keep-last", type=int)
    paths.add_argument("--ckpt-every-steps", type=int, help="0 turns step cadence off")
    paths.add_argument("--ckpt-every-seconds", type=float, help="0 turns time cadence off")
    paths.add_argument("--hash", help="checkpoint hash algorithm")
    paths.add_argument(
        "--on-save-error",
        choices=[choice.value for choice in OnSaveError],
        help="keep training or stop when a checkpoint cannot be persisted (default: continue)",
    )
    return parser.parse_args(argv)


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))


def main(argv: list[str] | None = None) -> int:
    """Train; return 0 when all steps are done, 143 when stopped by SIGTERM."""
    args = parse_args(argv)
    share_with_pod()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = HarnessSettings.from_env(
        l1_dir=args.l1_dir,
        data_dir=args.data_dir,
        state_dir=args.state_dir,
        heartbeat_file=args.heartbeat_file,
        keep_last=args.keep_last,
        every_steps=args.ckpt_every_steps,
        every_seconds=args.ckpt_every_seconds,
        hash_algorithm=args.hash,
        on_save_error=OnSaveError(args.on_save_error) if args.on_save_error else None,
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    ranks = Ranks.from_env()
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", ranks.local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if use_cuda else "gloo"
    if ranks.distributed:
        # MASTER_ADDR/MASTER_PORT, RANK and WORLD_SIZE come from the launcher (env://).
        torch.distributed.init_process_group(backend=backend)
    elif args.sharded:
        # A world of one: FSDP2 and DCP's collectives need a process group all the same.
        store = torch.distributed.HashStore()  # type: ignore[attr-defined]
        torch.distributed.init_process_group(backend, store=store, rank=0, world_size=1)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    overrides = {
        field: value
        for field in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout")
        if (value := getattr(args, field)) is not None
    }
    config = dataclasses.replace(PRESETS[args.preset], **overrides)
    model = GPT(config).to(device)
    # The checkpoint holds the plain model, so it resumes with any number of ranks.
    forward: torch.nn.Module = model
    if args.sharded:
        mesh = init_device_mesh(device.type, (ranks.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif ranks.distributed:
        forward = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[ranks.local_rank] if use_cuda else None
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, args.warmup_steps, args.steps)
    )
    data = TokenStream(
        settings.data_dir,
        args.batch_size,
        config.block_size,
        rank=ranks.rank,
        world_size=ranks.world_size,
    )
    session = (
        ShardedSession(
            {
                "model": ShardedModel(model),
                "optimizer": ShardedOptimizer(model, optimizer),
                "scheduler": scheduler,
                "data": data,
            },
            settings,
            ranks=ranks,
        )
        if args.sharded
        else TrainingSession(
            {"model": model, "optimizer": optimizer, "scheduler": scheduler, "data": data},
            settings,
            ranks=ranks,
        )
    )
    start = session.resume()
    LOG.info(
        "model %s: %.2fM parameters on %s; steps %d..%d",
        args.preset,
        sum(p.numel() for p in model.parameters()) / 1e6,
        device,
        start + 1,
        args.steps,
    )
    loss_log = args.loss_log.open("a") if args.loss_log and ranks.saves else None
    tokens_per_step = args.batch_size * config.block_size
    window_start, window_steps = time.perf_counter(), 0
    step = start
    stop = False
    try:
        # One process stops once asked; several ranks at the step they agreed on.
        while step < args.steps and not (stop if ranks.distributed else session.stop_requested):
            step += 1
            step_started = time.perf_counter()
            inputs, targets = (t.to(device, non_blocking=True) for t in data.next_batch())
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_cuda):
                loss = forward(inputs, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            # Every rank stops at the same step: a SIGTERM may reach them steps apart.
            loss_value, stop = reduce_step(loss.item(), session.stop_requested)
            if loss_log is not None:
                loss_log.write(json.dumps({"step": step, "loss": loss_value}) + "\n")
                loss_log.flush()
            rest = args.min_step_seconds - (time.perf_counter() - step_started)
            if rest > 0:
                time.sleep(rest)
            session.end_step(step, loss=loss_value, tokens=tokens_per_step)
            window_steps += 1
            if step % args.log_every == 0:
                elapsed = time.perf_counter() - window_start
                LOG.info(
                    "step %d loss %.4f tokens/s %.0f",
                    step,
                    loss_value,
                    window_steps * tokens_per_step / elapsed,
                )
                window_start, window_steps = time.perf_counter(), 0
    finally:
        if loss_log is not None:
            loss_log.close()
    session.close(step)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if stop or session.stop_requested:
        LOG.warning("stopped at step %d by SIGTERM after saving", step)
        return EXIT_TERMINATED
    return 0


if __name__ == "__main__":
    # Checkpoints are closed and the process group destroyed when main returns; a backend
    # thread left behind must not meet the interpreter's finalization (see end_process).
    end_process(main())
