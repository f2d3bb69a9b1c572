"""Checkpoint benchmark: what a save costs the training loop, against the usual alternatives.

Measures, side by side in one run, on the same CPU state (about --size-gb) and the same disk:

- `torch.save` to a file followed by fsync (a durable save, blocking the loop throughout);
- the blocking part of `torch.distributed.checkpoint.async_save` (until it returns);
- a warm copy of the state into preallocated buffers (the physical limit of any snapshot) and,
  for scale, a clone into fresh memory;
- the trainguard harness: the loop's stall per save (`CheckpointWriter.save`), cold (first save,
  buffer allocation included) and warm (median of later saves), the background persist
  throughput (write + hash + fsync + manifest + rename) and read-back verification;
- xxh3-128 (the default), blake3 and sha256 hash throughput on host memory;
- training throughput with a checkpoint every K steps against none, in alternating segments.
  The training step is CPU matrix work on `--train-threads` threads (default 1): it stands in
  for an accelerator, and leaves the host's other cores to the background persist as a GPU
  node would.

Prints ONE JSON object on stdout (ratios, medians in seconds, rates in GB/s, raw lists);
progress goes to stderr.

    python bench/checkpoint.py --size-gb 1 --repeats 3
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import torch
import xxhash
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse, async_save

from trainguard.ckpt import DEFAULT_ALGORITHM
from trainguard_harness.writer import CheckpointWriter, PersistStats

GB = 1e9
TENSOR_ELEMENTS = 16 * 1024 * 1024  # 64 MB float32 tensors, like large weight matrices
MATMUL_SIZE = 512


def progress(message: str) -> None:
    """Progress on stderr, so stdout carries only the JSON."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def make_state(size_gb: float) -> dict[str, Any]:
    """Model weights (one third) and AdamW moments (two thirds), float32, about `size_gb`."""
    per_group = max(1, round(size_gb * GB / 3 / (TENSOR_ELEMENTS * 4)))
    generator = torch.Generator().manual_seed(0)

    def tensor() -> torch.Tensor:
        return torch.randn(TENSOR_ELEMENTS, generator=generator)

    weights = {f"layer{i}.weight": tensor() for i in range(per_group)}
    moments = {
        i: {"step": torch.tensor(100.0), "exp_avg": tensor(), "exp_avg_sq": tensor()}
        for i in range(per_group)
    }
    optimizer = {"state": moments, "param_groups": [{"lr": 3e-4, "params": list(range(per_group))}]}
    return {"model": weights, "optimizer": optimizer}


def tensors_of(state: Any) -> list[torch.Tensor]:
    """Every tensor in a nested state."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for value in state.values() for t in tensors_of(value)]
    if isinstance(state, list | tuple):
        return [t for value in state for t in tensors_of(value)]
    return []


def timed(action: Callable[[], object]) -> float:
    """Seconds `action` takes."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def bench_torch_save(state: dict[str, Any], directory: Path, repeats: int) -> list[float]:
    """torch.save into a file, then fsync: the loop is blocked for all of it."""
    path = directory / "torch-save.pt"
    times = []
    for index in range(repeats):

        def save() -> None:
            with path.open("wb") as handle:
                torch.save(state, handle)
                handle.flush()
                os.fsync(handle.fileno())

        times.append(timed(save))
        path.unlink()
        progress(f"torch.save+fsync {index + 1}/{repeats}: {times[-1]:.3f}s")
    return times


def bench_dcp_async(
    state: dict[str, Any], directory: Path, repeats: int
) -> tuple[list[float], list[float]]:
    """DCP async_save: (time until it returns, time until the checkpoint is complete)."""
    blocking, total = [], []
    for index in range(repeats):
        target = directory / f"dcp-{index}"
        started = time.perf_counter()
        response = async_save(state, checkpoint_id=str(target))
        blocking.append(time.perf_counter() - started)
        if isinstance(response, AsyncSaveResponse):
            response.upload_completion.result()
        else:
            response.result()
        total.append(time.perf_counter() - started)
        shutil.rmtree(target)
        progress(f"dcp.async_save {index + 1}/{repeats}: returned after {blocking[-1]:.3f}s")
    return blocking, total


def bench_memcpy(state: dict[str, Any], repeats: int) -> tuple[list[float], float]:
    """(warm copies into preallocated buffers, one clone into fresh memory)."""
    sources = tensors_of(state)
    targets = [torch.empty_like(t) for t in sources]

    def copy() -> None:
        for target, source in zip(targets, sources, strict=True):
            target.copy_(source)

    copy()  # fault the target pages in: "warm" means reused memory
    warm = [timed(copy) for _ in range(repeats)]
    clone = timed(lambda: [t.clone() for t in sources])
    progress(f"memcpy warm median {statistics.median(warm):.3f}s, clone {clone:.3f}s")
    return warm, clone


def bench_harness(
    state: dict[str, Any], directory: Path, repeats: int
) -> tuple[float, list[float], list[PersistStats]]:
    """(cold stall, warm stalls, persist stats) of the harness writer, one save at a time."""
    writer = CheckpointWriter(directory / "l1", keep_last=1, on_event=lambda event: None)
    stalls, persists = [], []
    for index in range(repeats + 1):
        stats = writer.save(index + 1, state)
        stalls.append(stats.stall_seconds)
        persisted = writer.wait()
        assert persisted is not None
        persists.append(persisted)
        progress(
            f"harness save {index + 1}/{repeats + 1}: stall {stats.stall_seconds:.3f}s,"
            f" persist {persisted.write_seconds:.3f}s + verify {persisted.verify_seconds:.3f}s"
        )
    writer.close()
    return stalls[0], stalls[1:], persists


def hash_all(hasher: Any, buffers: list[memoryview]) -> None:
    """Feed every buffer to `hasher`."""
    for buffer in buffers:
        hasher.update(buffer)


def bench_hash(state: dict[str, Any]) -> dict[str, float]:
    """GB/s of each hash over the state's memory (blake3 and sha256 on a slice of it)."""
    buffers = [t.numpy().data.cast("B") for t in tensors_of(state)]
    total = sum(len(b) for b in buffers)
    sample = buffers[:2]
    sample_total = sum(len(b) for b in sample)
    rates = {}
    for name, factory, chosen, size in (
        ("xxh3-128", xxhash.xxh3_128, buffers, total),
        ("blake3", lambda: blake3.blake3(max_threads=blake3.blake3.AUTO), sample, sample_total),
        ("sha256", hashlib.sha256, sample, sample_total),
    ):
        seconds = timed(functools.partial(hash_all, factory(), chosen))
        rates[name] = size / seconds / GB
    progress("hash GB/s: " + ", ".join(f"{k} {v:.2f}" for k, v in rates.items()))
    return rates


def calibrate_step(step_seconds: float) -> int:
    """How many MATMUL_SIZE matmuls make one training step of about `step_seconds`."""
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    for _ in range(3):
        torch.mm(a, b)
    count = 20
    seconds = timed(lambda: [torch.mm(a, b) for _ in range(count)])
    return max(1, round(count * step_seconds / seconds))


def bench_throughput(
    state: dict[str, Any],
    directory: Path,
    *,
    matmuls: int,
    every: int,
    steps: int,
    repeats: int,
) -> tuple[list[float], list[float], list[float]]:
    """Alternating segments of `steps` steps: (no-checkpoint times, checkpoint times, stalls)."""
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE)

    def run(count: int) -> None:
        for _ in range(count * matmuls):
            torch.mm(a, b)

    writer = CheckpointWriter(directory / "l1-throughput", keep_last=1, on_event=lambda e: None)
    writer.prepare(state)  # as TrainingSession does after the first step
    writer.wait()
    baseline, with_checkpoints, stalls = [], [], []
    for index in range(repeats):
        baseline.append(timed(lambda: run(steps)))
        started = time.perf_counter()
        for number in range(1, steps + 1):
            run(1)
            if number % every == 0:
                stalls.append(writer.save(number, state).stall_seconds)
        with_checkpoints.append(time.perf_counter() - started)
        writer.wait()
        progress(
            f"throughput segment {index + 1}/{repeats}: no checkpoints {baseline[-1]:.2f}s,"
            f" checkpoint every {every} steps {with_checkpoints[-1]:.2f}s"
        )
    writer.close()
    return baseline, with_checkpoints, stalls


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="state size (default 1 GB)")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per measurement")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary dir)")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="training step length")
    parser.add_argument("--ckpt-every", type=int, default=150, help="K: steps between saves")
    parser.add_argument(
        "--segment-steps", type=int, default=375, help="steps per throughput segment"
    )
    parser.add_argument("--segments", type=int, default=2, help="throughput segment pairs")
    parser.add_argument("--train-threads", type=int, default=1, help="threads of a train step")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and print the JSON report."""
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    base = args.dir or Path(tempfile.mkdtemp(prefix="tg-bench-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        state = make_state(args.size_gb)
        size = sum(t.numel() * t.element_size() for t in tensors_of(state))
        progress(f"state: {size / GB:.2f} GB in {len(tensors_of(state))} tensors; disk: {base}")
        torch_save = bench_torch_save(state, base, args.repeats)
        dcp_blocking, dcp_total = bench_dcp_async(state, base, args.repeats)
        memcpy_warm, clone = bench_memcpy(state, args.repeats)
        cold_stall, stalls, persists = bench_harness(state, base, args.repeats)
        hashes = bench_hash(state)
        torch.set_num_threads(args.train_threads)
        matmuls = calibrate_step(args.step_seconds)
        baseline, checkpointed, loop_stalls = bench_throughput(
            state,
            base,
            matmuls=matmuls,
            every=args.ckpt_every,
            steps=args.segment_steps,
            repeats=args.segments,
        )
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    median = statistics.median
    stall = median(stalls)
    write = median(p.write_seconds for p in persists)
    report = {
        "stall_ratio_vs_torch_save": stall / median(torch_save),
        "stall_ratio_vs_dcp_async": stall / median(dcp_blocking),
        "stall_ratio_vs_memcpy": stall / median(memcpy_warm),
        "persist_gbps": size / write / GB,
        "hash_gbps": hashes[DEFAULT_ALGORITHM],
        "throughput_ratio_with_checkpoints": sum(baseline) / sum(checkpointed),
        "stall_s": stall,
        "stall_cold_s": cold_stall,
        "torch_save_fsync_s": median(torch_save),
        "dcp_async_save_blocking_s": median(dcp_blocking),
        "dcp_async_save_total_s": median(dcp_total),
        "memcpy_warm_s": median(memcpy_warm),
        "clone_fresh_s": clone,
        "persist_write_s": write,
        "persist_verify_s": median(p.verify_seconds for p in persists),
        "hash_gbps_by_algorithm": hashes,
        "throughput": {
            "step_seconds_target": args.step_seconds,
            "ckpt_every_steps": args.ckpt_every,
            "segment_steps": args.segment_steps,
            "segments": args.segments,
            "train_threads": args.train_threads,
            "no_checkpoint_s": baseline,
            "with_checkpoints_s": checkpointed,
            "loop_stall_s": loop_stalls,
        },
        "size_bytes": size,
        "repeats": args.repeats,
        "hash_algorithm": DEFAULT_ALGORITHM,
        "raw": {
            "stall_s": stalls,
            "torch_save_fsync_s": torch_save,
            "dcp_async_save_blocking_s": dcp_blocking,
            "memcpy_warm_s": memcpy_warm,
            "persist_write_s": [p.write_seconds for p in persists],
        },
        "environment": {
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "cuda": torch.cuda.is_available(),
        },
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
