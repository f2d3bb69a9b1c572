"""GPU figures: NVML readings of a trainer's life and death, CUDA checkpoint stalls, copy limits.

The driver's view of a CUDA trainer alive and after its death, checkpoint stalls of CUDA state,
and the copy bandwidth that bounds them. Needs an NVIDIA GPU (--device cpu: a dry run).

Three sections, each printed to stderr as it completes and, with --out, written there too (one
JSON file per section), so a run stopped by a time limit keeps what it measured:

- `readings`: the reference trainer (`trainguard_harness.train --device cuda`) under the
  supervisor, which publishes NVML readings (`trainguard.gpu.NvmlProbe`, through pynvml) as in a
  pod; the agent's own `Collector` and classifier judge them every 0.1 s. Recorded: each GPU's
  driver-used memory, its compute processes and the memory each holds, the framework's reserved
  memory from the heartbeat, the verdict - while the trainer lives, then after a SIGKILL, until
  the driver shows the memory released (time from the kill to `Dead`, to the process leaving
  NVML's list, to the memory falling under the agent's release threshold).
- `copy`: device-to-host bandwidth into pinned and into pageable (faulted-in) host memory, and
  host-to-device from pinned: the physical limit of any snapshot of GPU state.
- `stall`: for each --sizes-gb, model weights and AdamW moments (float32) on the GPU: the
  harness's loop stall per save (`CheckpointWriter.save`: the first save after `prepare`, which
  allocates the pinned buffer at start-up as the harness does, and warm saves), the buffer's
  allocation, the background persist; beside `torch.save` + fsync (blocking throughout) and
  `torch.distributed.checkpoint.async_save` (the part that blocks, and until complete). Sizes
  are skipped once --budget-s has passed.

    python bench/gpu.py --sizes-gb 1 8 32 --out /tmp/gpu-figures
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainguard import gpu
from trainguard.agent.signals import Collector
from trainguard.agent.verdicts import Thresholds, classify
from trainguard.api.spec import Monitor
from trainguard.contract import env
from trainguard.contract.files import (
    GPU_FILENAME,
    HEARTBEAT_FILENAME,
    SUPERVISOR_FILENAME,
    read_json,
)
from trainguard_harness.writer import CheckpointWriter

MIB = 1024 * 1024
GB = 1e9
# States this large are measured once (each method writes them whole to disk).
LARGE_GB = 16.0


def cpu_bench() -> Any:
    """bench/checkpoint.py, whose methods the stall section reuses as they are.

    Imported when first needed: where it cannot be (say, a PyTorch without what its DCP figures
    use), the readings are still taken and the error is reported in place of the stalls.
    """
    import checkpoint

    return checkpoint


REPO = Path(__file__).resolve().parent.parent


def progress(message: str) -> None:
    """Progress on stderr."""
    print(f"[gpu] {message}", file=sys.stderr, flush=True)


class Sections:
    """The report, section by section; each written to --out as soon as it is complete."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.report: dict[str, Any] = {}
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)

    def put(self, name: str, value: Any) -> None:
        """Record one section; show it and write it at once."""
        self.report[name] = value
        text = json.dumps(value, indent=1, default=str)
        progress(f"{name}: {text}")
        if self.out is not None:
            (self.out / f"{name}.json").write_text(text + "\n")


# -- readings: a live CUDA trainer and its death, as the agent sees them ---------------------


def raw_nvml() -> list[dict[str, Any]]:
    """NVML's own figures of every GPU, both memory readings (v1, v2) and the processes.

    Recorded beside the probe's readings so tests can replay what a real driver reported.
    """
    import pynvml

    pynvml.nvmlInit()
    devices = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
        device: dict[str, Any] = {
            "index": index,
            "v1": {"used": v1.used, "total": v1.total, "free": v1.free},
            "processes": [
                {"pid": p.pid, "usedGpuMemory": p.usedGpuMemory}
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            ],
        }
        try:
            v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            device["v2"] = {
                "used": v2.used,
                "total": v2.total,
                "reserved": v2.reserved,
                "free": v2.free,
            }
        except pynvml.NVMLError as err:
            device["v2"] = {"error": str(err)}
        devices.append(device)
    return devices


def _reading(collector: Collector, thresholds: Thresholds, started: float) -> dict[str, Any]:
    now = time.monotonic()
    signals = collector.collect(now, time.time())
    verdict = classify(signals, thresholds)
    snapshot = collector.last_gpu
    gpus = []
    for reading in snapshot.gpus if snapshot is not None else ():
        gpus.append(
            {
                "index": reading.index,
                "used_mib": round(reading.used_mib),
                "total_mib": round(reading.total_mib),
                "reserved_mib": None
                if reading.reserved_mib is None
                else round(reading.reserved_mib),
                "processes": [
                    {"pid": p.pid, "used_mib": None if p.used_mib is None else round(p.used_mib)}
                    for p in reading.processes
                ],
            }
        )
    return {
        "t": round(now - started, 3),
        "verdict": verdict.name,
        "evidence": verdict.evidence,
        "gpus": gpus,
        "framework_reserved_mib": signals.framework_reserved_mib,
        "process_alive": signals.process_alive,
        "step": signals.step,
    }


def bench_readings(base: Path, python: str, device: str) -> dict[str, Any]:
    """The reference trainer on CUDA under the supervisor; a SIGKILL; the agent's readings."""
    data, l1, state = base / "data", base / "l1", base / "state"
    for path in (data, l1, state):
        path.mkdir(parents=True)
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "operator"), str(REPO / "trainer-image"), os.environ.get("PYTHONPATH", "")]
        ),
        env.L1_DIR: str(l1),
        env.DATA_DIR: str(data),
        env.STATE_DIR: str(state),
        env.CKPT_EVERY_STEPS: "50",
    }
    subprocess.run(
        [python, "-m", "trainguard_harness.shards", "--out", str(data), "--tokens", "2000000"],
        env=environ,
        check=True,
        stdout=sys.stderr,
    )
    # The GPUs before the trainer: what "released" can come back to.
    before = gpu.default_probe().read().to_json()
    raw: dict[str, Any] = {"before_start": raw_nvml() if device == "cuda" else None}
    train = [python, "-m", "trainguard_harness.train", "--device", device]
    train += ["--preset", "gpt2" if device == "cuda" else "tiny"]
    train += ["--batch-size", "8", "--steps", "1000000", "--log-every", "100"]
    # A long back-off: the readings after the kill show the death's memory, not a successor's.
    supervise = [python, "-m", "trainguard_harness.supervisor", "--no-standby", "--backoff", "60"]
    log = (base / "trainer.log").open("wb")
    supervisor = subprocess.Popen(
        [*supervise, "--", *train], env=environ, stdout=log, stderr=subprocess.STDOUT
    )
    monitor = Monitor()
    thresholds = Thresholds.from_monitor(monitor)
    collector = Collector(
        heartbeat_file=state / HEARTBEAT_FILENAME,
        gpu_file=state / GPU_FILENAME,
        l1_dir=l1,
        log_file=None,
        marker=f"{env.L1_DIR}={l1}".encode(),
        released_mib=thresholds.released_mib,
        supervisor_file=state / SUPERVISOR_FILENAME,
    )
    started = time.monotonic()
    live: list[dict[str, Any]] = []
    try:
        deadline = started + 240
        while time.monotonic() < deadline:
            reading = _reading(collector, thresholds, started)
            if (
                reading["step"] is not None
                and reading["step"] >= 60
                and (reading["gpus"] or device != "cuda")
            ):
                break
            if supervisor.poll() is not None:
                raise RuntimeError(f"supervisor ended: see {base / 'trainer.log'}")
            time.sleep(0.5)
        else:
            raise RuntimeError("the trainer did not reach step 60 in 240 s")
        progress(f"trainer at step {reading['step']}: {reading['verdict']}")
        for _ in range(10):
            live.append(_reading(collector, thresholds, started))
            time.sleep(0.5)
        if device == "cuda":
            raw["live"] = raw_nvml()
        beat = read_json(state / HEARTBEAT_FILENAME) or {}
        pid = int(beat["pid"])
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        after: list[dict[str, Any]] = []
        dead_at = gone_at = released_at = None
        while time.monotonic() - killed < 20:
            reading = _reading(collector, thresholds, started)
            reading["since_kill_s"] = round(time.monotonic() - killed, 3)
            after.append(reading)
            used = sum(g["used_mib"] for g in reading["gpus"])
            processes = sum(len(g["processes"]) for g in reading["gpus"])
            if dead_at is None and reading["verdict"] == "Dead":
                dead_at = reading["since_kill_s"]
            if gone_at is None and processes == 0:
                gone_at = reading["since_kill_s"]
            if released_at is None and used <= thresholds.released_mib:
                released_at = reading["since_kill_s"]
            if dead_at is not None and released_at is not None and len(after) > 20:
                break
            time.sleep(0.1)
        if device == "cuda":
            raw["after_kill"] = raw_nvml()
    finally:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(timeout=30)
        except subprocess.TimeoutExpired:
            supervisor.kill()
        log.close()
    return {
        "before_start": before,
        "nvml_raw": raw,
        "live": live,
        "after_kill": after,
        "kill_to_dead_verdict_s": dead_at,
        "kill_to_no_process_in_nvml_s": gone_at,
        "kill_to_memory_released_s": released_at,
        "released_threshold_mib": thresholds.released_mib,
        "trainer_log_tail": (base / "trainer.log").read_text(errors="replace")[-2000:],
    }


# -- copy bandwidth ----------------------------------------------------------------------------


def bench_copy(size_gb: float, repeats: int) -> dict[str, Any]:
    """GB/s of device-to-host (pinned, pageable) and host-to-device (pinned) copies."""
    count = int(size_gb * GB) // 4
    device = torch.empty(count, dtype=torch.float32, device="cuda").normal_()
    pinned = torch.empty(count, dtype=torch.float32, pin_memory=True)
    pageable = torch.empty(count, dtype=torch.float32)
    pageable.fill_(0)  # faulted in: a warm buffer

    def copy(target: torch.Tensor, source: torch.Tensor) -> float:
        def run() -> None:
            target.copy_(source, non_blocking=True)
            torch.cuda.synchronize()

        run()
        timed = cpu_bench().timed
        return float(statistics.median(timed(run) for _ in range(repeats)))

    nbytes = count * 4
    result = {
        "size_bytes": nbytes,
        "d2h_pinned_gbps": nbytes / copy(pinned, device) / GB,
        "d2h_pageable_gbps": nbytes / copy(pageable, device) / GB,
        "h2d_pinned_gbps": nbytes / copy(device, pinned) / GB,
    }
    del device, pinned, pageable
    gc.collect()
    torch.cuda.empty_cache()
    return result


# -- checkpoint stalls of CUDA state -----------------------------------------------------------


def drop_checkpoints(l1: Path) -> None:
    """Remove the persisted checkpoints, measured already: two of 32 GB would not fit a disk."""
    for child in l1.iterdir():
        if child.is_dir():
            shutil.rmtree(child)


def bench_stall(size_gb: float, repeats: int, directory: Path, device: str) -> dict[str, Any]:
    """The harness's stall beside torch.save and DCP async_save, on state of `size_gb`."""
    bench = cpu_bench()
    state = bench.make_state(size_gb, device)
    if device == "cuda":
        torch.cuda.synchronize()
    size = sum(t.numel() * t.element_size() for t in bench.tensors_of(state))
    progress(f"stall: {size / GB:.1f} GB of CUDA state")
    torch_save, dcp_blocking, dcp_total = [], [], []
    for index in range(repeats):
        torch_save.append(bench.torch_save_once(state, directory))
        returned, total = bench.dcp_async_once(state, directory / f"dcp-{index}")
        dcp_blocking.append(returned)
        dcp_total.append(total)
        gc.collect()
        progress(
            f"{size_gb} GB #{index + 1}: torch.save+fsync {torch_save[-1]:.2f}s, dcp.async_save"
            f" returned {returned:.2f}s (complete {total:.2f}s)"
        )
    writer = CheckpointWriter(directory / "l1", keep_last=1, on_event=lambda event: None)

    def prepare() -> None:
        writer.prepare(state)
        writer.wait()

    prepare_s = bench.timed(prepare)
    first = writer.save(0, state).stall_seconds
    first_persist = writer.wait()
    drop_checkpoints(directory / "l1")
    stalls, persists = [], []
    for index in range(repeats):
        stalls.append(writer.save(index + 1, state).stall_seconds)
        persisted = writer.wait()
        persists.append(persisted.write_seconds if persisted else None)
        drop_checkpoints(directory / "l1")
        progress(f"{size_gb} GB #{index + 1}: harness stall {stalls[-1]:.3f}s")
    writer.close()
    median = statistics.median
    result = {
        "size_bytes": size,
        "harness_first_save_stall_s": first,
        "harness_warm_stall_s": median(stalls),
        "harness_buffer_prepare_s": prepare_s,
        "harness_persist_s": first_persist.write_seconds if first_persist else None,
        "harness_stall_gbps": size / median(stalls) / GB,
        "torch_save_fsync_s": median(torch_save),
        "dcp_async_save_blocking_s": median(dcp_blocking),
        "dcp_async_save_total_s": median(dcp_total),
        "stall_ratio_vs_torch_save": median(stalls) / median(torch_save),
        "stall_ratio_vs_dcp_async": median(stalls) / median(dcp_blocking),
        "raw": {
            "harness_stall_s": stalls,
            "harness_persist_s": persists,
            "torch_save_fsync_s": torch_save,
            "dcp_async_save_blocking_s": dcp_blocking,
            "dcp_async_save_total_s": dcp_total,
        },
    }
    return result  # the state and the writer's buffer go with this frame


def main(argv: list[str] | None = None) -> int:
    """Measure every section; print the whole report as one JSON object on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=[1.0, 8.0, 32.0])
    parser.add_argument("--repeats", type=int, default=2, help="repetitions per stall figure")
    parser.add_argument("--copy-gb", type=float, default=4.0, help="bytes per copy measurement")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary dir)")
    parser.add_argument("--out", type=Path, help="also write each section here as JSON")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no size after this")
    parser.add_argument("--skip", nargs="*", default=[], choices=["readings", "copy", "stall"])
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: a dry run of the same code without a GPU (NVML readings then unavailable)",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU (--device cpu: a dry run)", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    started = time.monotonic()
    base = args.dir or Path(tempfile.mkdtemp(prefix="tg-gpu-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    sections = Sections(args.out)
    sections.put(
        "environment",
        {
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if cuda else None,
            "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
            "cpus": os.cpu_count(),
            "disk_free_bytes": shutil.disk_usage(base).free,
        },
    )
    try:
        if "readings" not in args.skip:
            try:
                readings = bench_readings(base / "readings", sys.executable, args.device)
                sections.put("readings", readings)
            except Exception as err:  # the other sections still run
                sections.put("readings", {"error": repr(err)})
        if "copy" not in args.skip and cuda:
            sections.put("copy", bench_copy(args.copy_gb, repeats=3))
        if "stall" not in args.skip:
            for size in args.sizes_gb:
                if time.monotonic() - started > args.budget_s:
                    sections.put(f"stall-{size:g}gb", {"skipped": "over --budget-s"})
                    continue
                repeats = args.repeats if size < LARGE_GB else 1
                stall = bench_stall(size, repeats, base, args.device)
                sections.put(f"stall-{size:g}gb", stall)
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    sections.report["elapsed_s"] = time.monotonic() - started
    print(json.dumps(sections.report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
