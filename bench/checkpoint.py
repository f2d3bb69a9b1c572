"""Checkpoint benchmark: what a save costs the training loop, against the usual alternatives.

Measures, side by side in one run, on the same CPU state (about --size-gb) and the same disk
(each repetition runs every method in turn, so a change in machine load hits them all):

- `torch.save` to a file followed by fsync (a durable save, blocking the loop throughout);
- the blocking part of `torch.distributed.checkpoint.async_save` (until it returns);
- DCP through trainguard's storage writer (`trainguard_harness.dcp.trainguard_writer`, one
  process, so a sharded checkpoint of world size 1): `dcp.save` (blocking throughout) and the
  blocking part of `dcp.async_save` with that writer, and the time until its checkpoint is
  committed (files hashed as written, fsynced, manifest last);
- a warm copy of the state into preallocated buffers (the physical limit of any snapshot) and,
  for scale, a clone into fresh memory;
- the trainguard harness: the loop's stall per save (`CheckpointWriter.save`), cold (the first
  save, its host buffer allocated beforehand in the background as `TrainingSession` does once
  the state has its shapes; and, for scale, a first save that allocates it itself) and warm
  (median of later saves), the background persist
  throughput (write + hash + fsync + manifest + rename) and read-back verification;
- xxh3-128 (the default), blake3 and sha256 hash throughput on host memory;
- training throughput with a checkpoint every K steps against none, in segments run in ABBA
  order (a persist still running at the end of a segment is counted).
  The training step is CPU matrix work on `--train-threads` threads (default 1): it stands in
  for an accelerator, and leaves the host's other cores to the background persist as a GPU
  node would.

Prints ONE JSON object on stdout (ratios, medians in seconds, rates in GB/s, raw lists);
progress goes to stderr.

    python bench/checkpoint.py --size-gb 1 --repeats 5
"""

from __future__ import annotations

import argparse
import functools
import gc
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import torch
import xxhash
from torch.distributed.checkpoint.state_dict_saver import async_save, save

from trainguard.ckpt import DEFAULT_ALGORITHM, step_dirname
from trainguard_harness.dcp import trainguard_writer
from trainguard_harness.writer import CheckpointWriter, PersistStats

GB = 1e9
TENSOR_ELEMENTS = 16 * 1024 * 1024  # 64 MB float32 tensors, like large weight matrices
MATMUL_SIZE = 512


def progress(message: str) -> None:
    """Progress on stderr, so stdout carries only the JSON."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def make_state(size_gb: float, device: str = "cpu") -> dict[str, Any]:
    """Model weights (one third) and AdamW moments (two thirds), float32, about `size_gb`."""
    per_group = max(1, round(size_gb * GB / 3 / (TENSOR_ELEMENTS * 4)))
    generator = torch.Generator(device=device).manual_seed(0)

    def tensor() -> torch.Tensor:
        return torch.randn(TENSOR_ELEMENTS, generator=generator, device=device)

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
    """Seconds `action` takes, after collecting garbage (e.g. another method's freed buffers)."""
    gc.collect()
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def torch_save_once(state: dict[str, Any], directory: Path) -> float:
    """torch.save into a file, then fsync: the loop is blocked for all of it."""
    path = directory / "torch-save.pt"

    def save() -> None:
        with path.open("wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())

    seconds = timed(save)
    path.unlink()
    return seconds


def wait_for(response: Any) -> None:
    """Wait until an async_save response's checkpoint is complete."""
    # Newer PyTorch returns an AsyncSaveResponse (staging and upload futures), older a Future.
    upload = getattr(response, "upload_completion", None)
    if upload is not None:
        upload.result()
    else:
        response.result()


def dcp_async_once(state: dict[str, Any], target: Path) -> tuple[float, float]:
    """DCP async_save: (time until it returns, time until the checkpoint is complete)."""
    started = time.perf_counter()
    response = async_save(state, checkpoint_id=str(target))
    returned = time.perf_counter() - started
    wait_for(response)
    total = time.perf_counter() - started
    shutil.rmtree(target)
    return returned, total


def dcp_trainguard_sync_once(state: dict[str, Any], root: Path, step: int) -> float:
    """dcp.save through trainguard's writer: the loop is blocked until the commit."""
    seconds = timed(lambda: save(state, storage_writer=trainguard_writer(root, step)))
    shutil.rmtree(root / step_dirname(step))
    return seconds


def dcp_trainguard_async_once(state: dict[str, Any], root: Path, step: int) -> tuple[float, float]:
    """dcp.async_save through trainguard's writer: (until it returns, until the commit)."""
    gc.collect()
    started = time.perf_counter()
    response = async_save(state, storage_writer=trainguard_writer(root, step))
    returned = time.perf_counter() - started
    wait_for(response)
    total = time.perf_counter() - started
    shutil.rmtree(root / step_dirname(step))
    return returned, total


class WarmCopy:
    """Copies of the state into buffers allocated and faulted in once: the snapshot limit."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.sources = tensors_of(state)
        self.targets = [torch.empty_like(t) for t in self.sources]
        self._copy()  # fault the pages in: "warm" means reused memory

    def _copy(self) -> None:
        for target, source in zip(self.targets, self.sources, strict=True):
            target.copy_(source)

    def once(self) -> float:
        """Seconds for one warm copy."""
        return timed(self._copy)


@dataclass
class SideBySide:
    """Per-repetition times of every method, measured in turn within each repetition."""

    torch_save: list[float] = field(default_factory=list)
    dcp_blocking: list[float] = field(default_factory=list)
    dcp_total: list[float] = field(default_factory=list)
    dcp_tg_sync: list[float] = field(default_factory=list)
    dcp_tg_async_blocking: list[float] = field(default_factory=list)
    dcp_tg_async_total: list[float] = field(default_factory=list)
    memcpy_warm: list[float] = field(default_factory=list)
    stalls: list[float] = field(default_factory=list)
    persists: list[PersistStats] = field(default_factory=list)
    stall_cold: float = 0.0  # the first save of a prepared writer, as the harness makes it
    stall_unprepared: float = 0.0  # a first save that allocates the host buffer itself
    clone_fresh: float = 0.0


def bench_side_by_side(state: dict[str, Any], directory: Path, repeats: int) -> SideBySide:
    """Each repetition runs every method once, so a change in machine load hits them all."""
    result = SideBySide()
    result.clone_fresh = timed(lambda: [t.clone() for t in tensors_of(state)])
    # For scale: a first save whose writer was never prepared allocates the host buffer itself.
    unprepared = CheckpointWriter(directory / "l1-first", keep_last=1, on_event=lambda e: None)
    result.stall_unprepared = unprepared.save(0, state).stall_seconds
    unprepared.close()
    shutil.rmtree(directory / "l1-first", ignore_errors=True)
    gc.collect()
    # The harness's first save: TrainingSession prepares its writer once the state has its
    # shapes (after the first step), which allocates the buffer in the background long before
    # the first checkpoint is due.
    writer = CheckpointWriter(directory / "l1", keep_last=1, on_event=lambda event: None)
    writer.prepare(state)
    writer.wait()
    result.stall_cold = writer.save(0, state).stall_seconds
    writer.wait()
    warm = WarmCopy(state)
    for index in range(repeats):
        result.torch_save.append(torch_save_once(state, directory))
        gc.collect()
        returned, total = dcp_async_once(state, directory / f"dcp-{index}")
        result.dcp_blocking.append(returned)
        result.dcp_total.append(total)
        gc.collect()
        result.dcp_tg_sync.append(dcp_trainguard_sync_once(state, directory / "dcp-tg", index))
        tg_returned, tg_total = dcp_trainguard_async_once(state, directory / "dcp-tg", index)
        result.dcp_tg_async_blocking.append(tg_returned)
        result.dcp_tg_async_total.append(tg_total)
        result.memcpy_warm.append(warm.once())
        gc.collect()
        result.stalls.append(writer.save(index + 1, state).stall_seconds)
        persisted = writer.wait()
        assert persisted is not None
        result.persists.append(persisted)
        progress(
            f"repetition {index + 1}/{repeats}: torch.save+fsync {result.torch_save[-1]:.3f}s,"
            f" dcp.async_save returned {returned:.3f}s, through trainguard: dcp.save"
            f" {result.dcp_tg_sync[-1]:.3f}s, dcp.async_save returned {tg_returned:.3f}s"
            f" (committed {tg_total:.3f}s), warm copy {result.memcpy_warm[-1]:.3f}s,"
            f" harness stall {result.stalls[-1]:.3f}s (persist {persisted.write_seconds:.3f}s"
            f" + verify {persisted.verify_seconds:.3f}s)"
        )
    writer.close()
    return result


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
    # The fastest of several tries: on a shared host a step then takes at least step_seconds,
    # so the interval between checkpoints is never shorter than asked.
    seconds = min(timed(lambda: [torch.mm(a, b) for _ in range(count)]) for _ in range(5))
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
    """Segments of `steps` steps in ABBA order: (no-checkpoint times, checkpoint times, stalls)."""
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE)

    def run(count: int) -> None:
        for _ in range(count * matmuls):
            torch.mm(a, b)

    writer = CheckpointWriter(directory / "l1-throughput", keep_last=1, on_event=lambda e: None)
    writer.prepare(state)  # as TrainingSession does after the first step
    writer.wait()
    baseline, with_checkpoints, stalls = [], [], []

    def checkpointed() -> None:
        for number in range(1, steps + 1):
            run(1)
            if number % every == 0:
                stalls.append(writer.save(number, state).stall_seconds)
        writer.wait()  # a persist still running at the end counts against this variant

    for index in range(repeats):
        # ABBA order, so a drift in machine load does not favour either variant.
        for variant in (
            ("baseline", "checkpointed") if index % 2 == 0 else ("checkpointed", "baseline")
        ):
            if variant == "baseline":
                baseline.append(timed(lambda: run(steps)))
            else:
                with_checkpoints.append(timed(checkpointed))
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
    parser.add_argument("--repeats", type=int, default=5, help="repetitions per measurement")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary dir)")
    parser.add_argument("--step-seconds", type=float, default=0.2, help="training step length")
    parser.add_argument("--ckpt-every", type=int, default=100, help="K: steps between saves")
    parser.add_argument(
        "--segment-steps", type=int, default=250, help="steps per throughput segment"
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
        measured = bench_side_by_side(state, base, args.repeats)
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
    stall = median(measured.stalls)
    write = median(p.write_seconds for p in measured.persists)
    dcp_blocking = median(measured.dcp_blocking)
    dcp_total = median(measured.dcp_total)
    tg_async_blocking = median(measured.dcp_tg_async_blocking)
    tg_async_total = median(measured.dcp_tg_async_total)
    tg_sync = median(measured.dcp_tg_sync)
    report = {
        "stall_ratio_vs_torch_save": stall / median(measured.torch_save),
        "stall_ratio_vs_dcp_async": stall / dcp_blocking,
        # DCP through trainguard's writer, beside DCP's own async_save.
        "dcp_trainguard_async_blocking_ratio_vs_dcp_async": tg_async_blocking / dcp_blocking,
        "dcp_trainguard_async_total_ratio_vs_dcp_async": tg_async_total / dcp_total,
        "dcp_trainguard_save_ratio_vs_dcp_async_blocking": tg_sync / dcp_blocking,
        "stall_ratio_vs_memcpy": stall / median(measured.memcpy_warm),
        "persist_gbps": size / write / GB,
        "hash_gbps": hashes[DEFAULT_ALGORITHM],
        "throughput_ratio_with_checkpoints": sum(baseline) / sum(checkpointed),
        "stall_s": stall,
        "stall_cold_s": measured.stall_cold,
        "stall_cold_ratio_vs_warm": measured.stall_cold / statistics.median(measured.stalls),
        "stall_unprepared_s": measured.stall_unprepared,
        "torch_save_fsync_s": median(measured.torch_save),
        "dcp_async_save_blocking_s": dcp_blocking,
        "dcp_async_save_total_s": dcp_total,
        "dcp_trainguard_save_s": tg_sync,
        "dcp_trainguard_async_save_blocking_s": tg_async_blocking,
        "dcp_trainguard_async_save_total_s": tg_async_total,
        "memcpy_warm_s": median(measured.memcpy_warm),
        "clone_fresh_s": measured.clone_fresh,
        "persist_write_s": write,
        "persist_verify_s": median(p.verify_seconds for p in measured.persists),
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
            "stall_s": measured.stalls,
            "torch_save_fsync_s": measured.torch_save,
            "dcp_async_save_blocking_s": measured.dcp_blocking,
            "dcp_trainguard_save_s": measured.dcp_tg_sync,
            "dcp_trainguard_async_save_blocking_s": measured.dcp_tg_async_blocking,
            "memcpy_warm_s": measured.memcpy_warm,
            "persist_write_s": [p.write_seconds for p in measured.persists],
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
