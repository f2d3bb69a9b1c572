"""`trainguard dev cluster`: idempotent up, clusters side by side, PID-based down, failures."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from trainguard_dev.cluster.cluster import Cluster, _pid_alive

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TRAINGUARD = [sys.executable, "-m", "trainguard.cli.main"]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TRAINGUARD, "dev", "cluster", *args],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_second_cluster_runs_beside_the_first_and_stops_by_pid(cluster: Cluster) -> None:
    name = f"side-{uuid.uuid4().hex[:6]}"
    side = Cluster(name)
    try:
        first = _cli("up", "--name", name, "--nodes", "1")
        assert first.returncode == 0, first.stderr
        lines = first.stdout.strip().splitlines()
        assert re.fullmatch(r"ready in \d+\.\d s", lines[-1]), lines
        assert f"export KUBECONFIG={side.kubeconfig}" in lines
        assert side.ports()["apiserver"] != cluster.ports()["apiserver"]
        assert "gpu-node-0" in side.kubectl("get", "nodes").stdout
        pids = {s.name: s.pid for s in side.status()}

        again = _cli("up", "--name", name, "--nodes", "1")
        assert again.returncode == 0, again.stderr
        assert {s.name: s.pid for s in side.status()} == pids  # nothing restarted
        seconds = float(again.stdout.strip().splitlines()[-1].split()[2])
        assert seconds < 10

        assert _cli("status", "--name", name).returncode == 0
        down = _cli("down", "--name", name)
        assert down.returncode == 0, down.stderr
        assert not any(pid and _pid_alive(pid) for pid in pids.values())
        assert _cli("status", "--name", name).returncode == 1
        # The session's cluster is untouched.
        assert cluster.is_up()
    finally:
        side.down(purge=True)


def test_failing_component_exits_nonzero_with_its_log_tail(
    cluster: Cluster, tmp_path: Path
) -> None:
    # A real kwok given an invalid stage file fails at start-up; `up` must say so.
    home = tmp_path / "home"
    home.mkdir()
    (home / "bin").symlink_to(cluster.bin_dir)
    stages = next(cluster.home.glob("kwok-stages-*"))
    broken = home / stages.name
    shutil.copytree(stages, broken)
    (broken / "node-initialize.yaml").write_text("kind: Stage\nspec: [this is not a stage\n")
    env = {"TRAINGUARD_HOME": str(home)}
    try:
        result = _cli("up", "--name", "broken", "--nodes", "1", "--timeout", "60", env=env)
        assert result.returncode == 1
        assert "kwok" in result.stderr
        assert "last lines of" in result.stderr
    finally:
        _cli("down", "--name", "broken", "--purge", env=env)


def test_kwok_moves_pods_with_the_configured_parallelism(cluster: Cluster) -> None:
    """`Cluster(kwok_parallelism=...)`: kwok starts with its configuration and plays pods.

    A configuration file leaves every option it does not name at zero, which kwok refuses:
    the file names the parallelism asked for and sane values for the rest, and kwok, started
    with it, runs a deployment's pods on its nodes, each with an address of its own that a
    headless Service lists.
    """
    name = f"par-{uuid.uuid4().hex[:6]}"
    side = Cluster(name, kwok_parallelism=16)
    try:
        side.up(nodes=2)
        config = (side.root / "kwok-configuration.yaml").read_text()
        assert "podPlayStageParallelism: 16" in config
        assert "nodePlayStageParallelism: 16" in config
        kwok = next(s for s in side.status() if s.name == "kwok")
        assert kwok.alive
        cmdline = Path(f"/proc/{kwok.pid}/cmdline").read_bytes().split(b"\0")
        assert f"--config={side.root / 'kwok-configuration.yaml'}".encode() in cmdline
        side.kubectl("create", "deployment", "play", "--image=play:1", "--replicas=12")
        deadline = time.monotonic() + 90
        phases: list[str] = []
        while time.monotonic() < deadline:
            out = side.kubectl(
                "get", "pods", "-l", "app=play", "-o", "jsonpath={.items[*].status.phase}"
            ).stdout
            phases = out.split()
            if phases.count("Running") == 12:
                break
            time.sleep(0.5)
        assert phases.count("Running") == 12, phases
        # Pods have addresses of their own, which a headless Service lists (an empty pod
        # range gave every pod 127.0.0.1, which the EndpointSlice controller refuses).
        side.kubectl("create", "service", "clusterip", "play", "--clusterip=None", "--tcp=80:80")
        addresses: list[str] = []
        while time.monotonic() < deadline:
            addresses = side.kubectl(
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=play",
                "-o",
                "jsonpath={.items[*].endpoints[*].addresses[0]}",
            ).stdout.split()
            if len(addresses) == 12:
                break
            time.sleep(0.5)
        assert len(set(addresses)) == 12, addresses
        assert not any(a.startswith("127.") for a in addresses), addresses
    finally:
        side.down(purge=True)
