"""Reconcile benchmark: N TrainingRuns created at once, how fast the operator gives each a pod.

Starts a local control plane of its own (or uses `--cluster NAME`, started with
`trainguard dev cluster up --name NAME`), installs the CRD, adds kwok GPU nodes of its own
(labelled, so the runs land there and nowhere else), starts `trainguard operator` on a fresh
namespace, then creates `--runs` copies of examples/minimal.yaml concurrently and measures:

- `last_pod_s`: from the start of the creation to the moment the last run's pod exists;
- `all_running_s`: until every run's status says Running (pod scheduled and started, status
  written);
- `operator_peak_rss_mib`: the operator process's peak resident memory (VmHWM), read at the
  end, so it covers startup, the burst and the status updates.

Prints ONE JSON object on stdout; progress goes to stderr. Targets on a 2-core machine:
`last_pod_s` <= 30 and `operator_peak_rss_mib` <= 250 for 50 runs.

    python bench/reconcile.py --runs 50
    python bench/reconcile.py --runs 500 --cluster dev
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from trainguard.api.constants import CRD_NAME, GROUP, PLURAL, VERSION
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.nodes import gpu_node
from trainguard_dev.cluster.rest import Rest
from trainguard_dev.testing.polling import eventually, seconds_left
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import example_run, pinned

REPO = Path(__file__).resolve().parents[1]
POOL_LABEL = "trainguard.dev/bench-pool"
RUNS_PER_NODE = 100  # below the kubelet's default of 110 pods per node
CREATE_THREADS = 16
POLL_SECONDS = 0.1


def log(message: str) -> None:
    """Progress, on stderr (stdout carries only the JSON report)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="TrainingRuns created at once")
    parser.add_argument("--cluster", help="use this running dev cluster instead of a new one")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after (seconds)")
    return parser.parse_args(argv)


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set size (VmHWM) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def wait_for(check: Callable[[], Any], deadline: float, what: str) -> float:
    """Poll until `check()` is true; return the time it became true (monotonic)."""
    eventually(check, seconds_left(deadline), what, POLL_SECONDS)
    return time.monotonic()


def measure(cluster: Cluster, runs: int, timeout: float) -> dict[str, Any]:
    """Set up, create the runs, measure; clean up what it created in the cluster."""
    rest = Rest(cluster.server, cluster.pki, timeout=30.0)
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds" / f"{CRD_NAME}.yaml")
    )
    cluster.wait_established(CRD_NAME, 90)
    tag = uuid.uuid4().hex[:6]
    namespace, pool = f"bench-{tag}", f"bench-{tag}"
    node_names = [f"bench-{tag}-{i}" for i in range(math.ceil(runs / RUNS_PER_NODE))]
    nodes = []
    for name in node_names:
        # Room for RUNS_PER_NODE pods: each asks for a GPU, 0.6 CPU (agent + an init step)
        # and about 9 GiB of local disk.
        node = gpu_node(
            name,
            gpus=RUNS_PER_NODE,
            cpu=str(RUNS_PER_NODE),
            ephemeral_storage=f"{RUNS_PER_NODE * 16}Gi",
        )
        node["metadata"]["labels"][POOL_LABEL] = pool
        nodes.append(node)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(nodes))
    cluster.kubectl("create", "namespace", namespace)
    log_file = Path(tempfile.mkstemp(prefix="bench-operator-", suffix=".log")[1])
    operator = OperatorProcess(cluster.kubeconfig, [namespace], log_file)
    operator.start()
    try:
        deadline = time.monotonic() + timeout
        operator.wait_started(seconds_left(deadline))
        log(f"operator up (pid {operator.pid}, log {log_file}); creating {runs} runs")
        names = [f"run-{i:04d}" for i in range(runs)]
        runs_path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
        pods_path = f"/api/v1/namespaces/{namespace}/pods?labelSelector=trainguard.dev/run"

        def create(name: str) -> None:
            run = pinned(example_run("minimal", name), POOL_LABEL, pool)
            rest.create(runs_path, run)

        started = time.monotonic()
        with ThreadPoolExecutor(CREATE_THREADS) as pool_:
            list(pool_.map(create, names))
        created = time.monotonic()
        last_pod = wait_for(lambda: len(rest.get(pods_path)["items"]) >= runs, deadline, "the pods")
        log(f"all {runs} pods exist after {last_pod - started:.1f} s")

        def all_running() -> bool:
            items = rest.get(runs_path)["items"]
            running = sum(i.get("status", {}).get("phase") == "Running" for i in items)
            return bool(running >= runs)

        running = wait_for(all_running, deadline, "every run to be Running")
        rss = peak_rss_mib(operator.pid)
        pods = rest.get(pods_path)["items"]
        return {
            "runs": runs,
            "last_pod_s": round(last_pod - started, 2),
            "all_running_s": round(running - started, 2),
            "create_s": round(created - started, 2),
            "operator_peak_rss_mib": round(rss, 1),
            "pods": len(pods),
            "pods_per_run_max": max(
                sum(p["metadata"]["labels"].get("trainguard.dev/run") == n for p in pods)
                for n in names
            ),
            "cpus": os.cpu_count(),
            "nodes": len(node_names),
        }
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "node", *node_names, "--wait=false", check=False)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON report."""
    args = parse_args(argv)
    own = args.cluster is None
    cluster = Cluster(args.cluster or f"bench-{uuid.uuid4().hex[:6]}")
    if own:
        log(f"starting cluster {cluster.name}")
        cluster.up(nodes=0)
    elif not cluster.is_up():
        log(f"cluster {cluster.name} is not up; start it with `trainguard dev cluster up`")
        return 2
    try:
        report = measure(cluster, args.runs, args.timeout)
    finally:
        if own:
            cluster.down(purge=True)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
