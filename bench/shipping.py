"""Shipping benchmark: training throughput with L1 plus two remote layers shipping, vs L1 alone.

The training loop is the CPU stand-in of bench/checkpoint.py (matmuls on `--train-threads`
threads, an accelerator's place) with the harness's CheckpointWriter saving to L1 every K
steps. Segments run in ABBA order:

- L1 only;
- L1 plus the agent's Shipper shipping every new checkpoint in the background to an s3://
  layer (SeaweedFS) and an ssh:// layer (sshd), both real servers on loopback started here
  (install them with hack/install-test-services.sh), with the shipper's bounded concurrency
  and an optional bandwidth cap (`--cap-mbps`).

The shipper runs in a process of its own, as it does in the agent sidecar: a thread in the
training process would contend for the training loop's interpreter lock, which no deployment
does. By default (`--placement split`, on hosts with at least two cores) the training
process keeps the first `--train-threads` cores and everything else — the shipper, the S3
server and the sshd — runs on the remaining ones: on a GPU node the storage servers are other
machines and the node has cores to spare for its sidecar, while on a 2-core host they would
otherwise time-share the trainer's core. `--placement shared` measures the host without any
placement; the report says which was used.

The target is a throughput ratio of at least 0.97. The ratio measures shipping only if every
layer shipped: per layer, the report gives the checkpoints it shipped and verified, and those
it skipped (a newer one superseded them while it was busy), in each shipping segment, with its
last error; a layer that shipped no verified checkpoint during the shipping segments fails the
benchmark (exit 1, the reason on stderr; the report is still printed). Then each layer's upload
throughput: one put of one checkpoint, alone. Prints ONE JSON object on stdout; progress goes to
stderr.

    python bench/shipping.py --size-mb 256 --segments 2
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch

from checkpoint import MATMUL_SIZE, calibrate_step, make_state, progress, timed
from trainguard.agent.shipper import Shipper
from trainguard.api.constants import (
    SECRET_KEY_S3_ACCESS_KEY_ID,
    SECRET_KEY_S3_ENDPOINT_URL,
    SECRET_KEY_S3_SECRET_ACCESS_KEY,
    SECRET_KEY_SSH_KNOWN_HOSTS,
    SECRET_KEY_SSH_PRIVATE_KEY,
)
from trainguard.ckpt import find_newest_valid
from trainguard.contract.env import layer_secrets_env
from trainguard.layers import Credentials, Layer, LayerConfig
from trainguard.layers.s3 import open_s3
from trainguard.layers.ssh import open_ssh
from trainguard_dev.testing.servers import S3_ACCESS_KEY, S3_SECRET_KEY, SeaweedFS, start_sshd
from trainguard_harness.writer import CheckpointWriter

MB = 1e6
BUCKET = "bench"
S3_LAYER, SSH_LAYER = "s3", "ssh"  # the layers' names


class Servers(NamedTuple):
    """Where the layers' servers answer (plain values: they cross to the shipper process)."""

    s3_endpoint: str
    ssh_user: str
    ssh_port: int
    ssh_client_key: Path
    ssh_known_hosts: Path
    ssh_root: Path  # the directory the ssh:// layers write under


def s3_layer(servers: Servers, prefix: str) -> Layer:
    """The s3:// layer under `prefix` (each run of puts gets its own)."""
    credentials = Credentials(
        {
            SECRET_KEY_S3_ACCESS_KEY_ID: S3_ACCESS_KEY,
            SECRET_KEY_S3_SECRET_ACCESS_KEY: S3_SECRET_KEY,
            SECRET_KEY_S3_ENDPOINT_URL: servers.s3_endpoint,
        }
    )
    return open_s3(LayerConfig(S3_LAYER, f"s3://{BUCKET}/{prefix}", keep=2), credentials, {})


def ssh_layer(servers: Servers, base: Path, prefix: str) -> Layer:
    """The ssh:// layer under `prefix`."""
    secret = base / "ssh-secret"  # as the operator mounts the layer's Secret
    secret.mkdir(exist_ok=True)
    shutil.copy(servers.ssh_client_key, secret / SECRET_KEY_SSH_PRIVATE_KEY)
    shutil.copy(servers.ssh_known_hosts, secret / SECRET_KEY_SSH_KNOWN_HOSTS)
    credentials = Credentials.from_env(SSH_LAYER, {layer_secrets_env(SSH_LAYER): str(secret)})
    remote = servers.ssh_root / prefix
    uri = f"ssh://{servers.ssh_user}@127.0.0.1:{servers.ssh_port}{remote}"
    return open_ssh(LayerConfig(SSH_LAYER, uri, keep=2), credentials)


def layer_makers(servers: Servers, base: Path, prefix: str) -> list[Callable[[], Layer]]:
    """How to open an s3:// and an ssh:// layer under `prefix` (they cross to a process)."""
    return [partial(s3_layer, servers, prefix), partial(ssh_layer, servers, base, prefix)]


def layers(servers: Servers, base: Path, prefix: str) -> list[Layer]:
    """An s3:// and an ssh:// layer under `prefix`."""
    return [make() for make in layer_makers(servers, base, prefix)]


def _ship_process(
    l1: Path,
    makers: list[Callable[[], Layer]],
    cap: float | None,
    cores: set[int] | None,
    ready: Any,
    stop: Any,
    result: Any,
) -> None:
    """The agent's shipping, in a process of its own: ship until told to stop, report states.

    The states are those at the end of the segment: an upload that ends later is not counted.
    """
    if cores:
        os.sched_setaffinity(0, cores)
    shipper = Shipper(l1, [make() for make in makers], 0.2, bandwidth_bytes_per_s=cap)
    shipper.start()
    ready.set()
    stop.wait()
    states = shipper.states()
    shipper.stop()
    shipper.join()  # the rest of its upload is not training time
    result.put(states)


def shipping_segment(
    measure: Callable[[], float],
    l1: Path,
    makers: list[Callable[[], Layer]],
    *,
    cap: float | None = None,
    cores: set[int] | None = None,
) -> tuple[float, dict[str, dict[str, Any]]]:
    """Run `measure()` (a segment) while a shipper process ships from `l1`.

    The shipper ships to the layers `makers` open. Returns the segment's seconds and each
    layer's state when it ended.
    """
    spawn = multiprocessing.get_context("spawn")
    ready, stop, result = spawn.Event(), spawn.Event(), spawn.Queue()
    shipper = spawn.Process(
        target=_ship_process, args=(l1, makers, cap, cores, ready, stop, result)
    )
    shipper.start()
    try:
        # Placed before its imports, which would otherwise run on training's cores.
        if cores and shipper.pid:
            os.sched_setaffinity(shipper.pid, cores)
        # A sidecar is up before training: its start-up is not the segment's time.
        if not ready.wait(timeout=120):
            raise RuntimeError("the shipper process did not start")
        seconds = measure()
        stop.set()
        states: dict[str, dict[str, Any]] = result.get(timeout=600)
        shipper.join(timeout=60)
    finally:
        if shipper.is_alive():
            shipper.kill()
            shipper.join()
    return seconds, states


def layer_results(segments: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per layer, from the shipping segments' states: shipped and skipped, and the errors.

    `shipped` and `skipped` list each segment's checkpoints shipped and verified, and those
    skipped; `errors` the layer's errors at the segments' ends.
    """
    names = sorted({name for states in segments for name in states})
    return {
        name: {
            "shipped": [states.get(name, {}).get("shipped", 0) for states in segments],
            "skipped": [states.get(name, {}).get("skipped", 0) for states in segments],
            "errors": [
                states[name]["error"] for states in segments if states.get(name, {}).get("error")
            ],
        }
        for name in names
    }


def shipping_problems(results: dict[str, dict[str, Any]], expected: list[str]) -> list[str]:
    """Why the segments did not measure shipping to every layer of `expected`.

    A layer that shipped no verified checkpoint during the shipping segments. (One that
    shipped in some segments only had an upload under way in the others, which is what costs
    training its throughput; the counts per segment are in the report.)
    """
    problems = []
    for name in expected:
        result = results.get(name, {"shipped": [], "errors": []})
        shipped, errors = result["shipped"], result["errors"]
        if sum(shipped):
            continue
        why = f"; last error: {errors[-1]}" if errors else ""
        problems.append(
            f"layer {name} shipped no verified checkpoint during the shipping segments "
            f"(per segment: {shipped}){why}"
        )
    return problems


def finish(problems: list[str]) -> int:
    """The exit status, with the problems on stderr."""
    for problem in problems:
        print(f"shipping.py: FAILED: {problem}", file=sys.stderr)
    if problems:
        print(
            "shipping.py: the throughput ratio does not measure shipping to every layer",
            file=sys.stderr,
        )
    return 1 if problems else 0


def segment(
    run: Callable[[int], None],
    writer: CheckpointWriter,
    state: dict[str, Any],
    *,
    steps: int,
    every: int,
    first_step: int,
) -> float:
    """Seconds for `steps` training steps saving every `every` (a pending persist counts)."""

    def loop() -> None:
        for number in range(first_step, first_step + steps):
            run(1)
            if number % every == 0:
                writer.save(number, state)
        writer.wait()

    return timed(loop)


def upload_rates(layer_list: list[Layer], checkpoint: Path) -> dict[str, float]:
    """MB/s of one put of `checkpoint` per layer, each alone."""
    size = sum(p.stat().st_size for p in checkpoint.iterdir())
    rates = {}
    for layer in layer_list:
        seconds = timed(functools.partial(layer.put, checkpoint))
        rates[layer.config.name] = size / MB / seconds
        progress(f"upload {layer.config.name}: {size / MB:.0f} MB in {seconds:.2f}s")
    return rates


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=float, default=256, help="checkpoint state size")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="training step length")
    parser.add_argument("--ckpt-every", type=int, default=25, help="K: steps between saves")
    parser.add_argument("--segment-steps", type=int, default=100, help="steps per segment")
    parser.add_argument("--segments", type=int, default=2, help="segment pairs (ABBA)")
    parser.add_argument("--train-threads", type=int, default=1, help="threads of a train step")
    parser.add_argument("--cap-mbps", type=float, default=0, help="bandwidth cap, 0: none")
    parser.add_argument(
        "--placement",
        choices=["split", "shared"],
        default="split",
        help="split: training keeps its own cores, the rest run elsewhere; shared: no placement",
    )
    parser.add_argument(
        "--remote-dir",
        type=Path,
        default=Path("/dev/shm"),
        help="where the S3 and SSH servers keep their data (not the L1 disk: they stand for "
        "other machines)",
    )
    parser.add_argument("--dir", type=Path, help="where to work (default: a temporary dir)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Start the servers, run the segments and the upload measurements, print the report."""
    args = parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="tg-ship-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    all_cores = os.sched_getaffinity(0)
    train_cores = set(sorted(all_cores)[: args.train_threads])
    other_cores = all_cores - train_cores
    split = args.placement == "split" and bool(other_cores)
    if split:
        os.sched_setaffinity(0, other_cores)  # the servers started now inherit it
    # The servers stand for other machines: their storage must not be the node's L1 disk.
    remote = Path(tempfile.mkdtemp(prefix="tg-ship-remote-", dir=args.remote_dir))
    s3 = SeaweedFS(remote / "seaweedfs")
    s3.start()
    s3.client().create_bucket(Bucket=BUCKET)
    (remote / "sshd").mkdir(exist_ok=True)
    sshd = start_sshd(remote / "sshd")
    servers = Servers(
        s3.endpoint, sshd.user, sshd.port, sshd.client_key, sshd.known_hosts, remote / "ssh-data"
    )
    if split:
        os.sched_setaffinity(0, train_cores)
    try:
        torch.set_num_threads(args.train_threads)
        state = make_state(args.size_mb * MB / 1e9)
        matmuls = calibrate_step(args.step_seconds)
        a, b = torch.randn(MATMUL_SIZE, MATMUL_SIZE), torch.randn(MATMUL_SIZE, MATMUL_SIZE)

        def run(count: int) -> None:
            for _ in range(count * matmuls):
                torch.mm(a, b)

        l1 = base / "l1"
        writer = CheckpointWriter(l1, keep_last=2, on_event=lambda e: None)
        writer.prepare(state)
        writer.wait()
        alone: list[float] = []
        shipping: list[float] = []
        shipped: list[dict[str, dict[str, Any]]] = []
        for index in range(args.segments * 2):
            measure = partial(
                segment,
                run,
                writer,
                state,
                steps=args.segment_steps,
                every=args.ckpt_every,
                first_step=1 + index * args.segment_steps,
            )
            if (index % 4) in (1, 2):  # ABBA: L1, ship, ship, L1, ...
                makers = layer_makers(servers, base, f"seg{index}")
                cores = other_cores if split else None
                cap = args.cap_mbps * MB or None
                seconds, states = shipping_segment(measure, l1, makers, cap=cap, cores=cores)
                shipping.append(seconds)
                shipped.append(states)
                progress(f"segment {index}: shipping {seconds:.2f}s, layers {states}")
            else:
                seconds = measure()
                alone.append(seconds)
                progress(f"segment {index}: L1 only {seconds:.2f}s")
        writer.close()
        results = layer_results(shipped)
        problems = shipping_problems(results, [S3_LAYER, SSH_LAYER])
        newest = find_newest_valid(l1).newest
        assert newest is not None
        rates = upload_rates(layers(servers, base, "upload"), newest.path)
        report = {
            "cores": os.cpu_count(),
            "placement": {
                "mode": "split" if split else "shared",
                "training_cores": sorted(train_cores if split else all_cores),
                "shipper_and_servers_cores": sorted(other_cores if split else all_cores),
            },
            "checkpoint_mb": args.size_mb,
            "ckpt_every_steps": args.ckpt_every,
            "step_seconds": args.step_seconds,
            "cap_mbps": args.cap_mbps,
            "throughput_ratio": statistics.median(alone) / statistics.median(shipping),
            "target_ratio": 0.97,
            "segment_seconds": {"l1_only": alone, "l1_and_two_layers_shipping": shipping},
            "layers": results,
            "problems": problems,
            "upload_mb_per_s": rates,
        }
        print(json.dumps(report, indent=1))
    finally:
        sshd.stop()
        s3.kill()
        shutil.rmtree(remote, ignore_errors=True)
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return finish(problems)


if __name__ == "__main__":
    sys.exit(main())
