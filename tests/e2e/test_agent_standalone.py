"""The agent against the real apiserver: death by absence reaches the Lease within seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.api import constants
from trainguard.contract import env
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# A stand-in trainer: heartbeats like the harness (pid, step), advances a step every 0.1 s and,
# like the harness, dumps its stacks on SIGUSR1 through faulthandler.
FAKE_TRAINER = textwrap.dedent(
    """
    import faulthandler, json, os, signal, sys, time
    path, step = sys.argv[1], 0
    stacks = open(sys.argv[2].format(pid=os.getpid()), "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)

    def train_one_step():
        time.sleep(0.1)

    while True:
        step += 1
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "step": step, "time": time.time(),
                       "phase": "training"}, f)
        os.replace(tmp, path)
        train_one_step()
    """
)


MONITOR = {
    "intervalSeconds": 1,
    "hangAfterSeconds": 3,
    "slowAfterSeconds": 2,
    "startupGraceSeconds": 0,
}


def _lease(cluster: Cluster, namespace: str) -> dict[str, str]:
    out = cluster.kubectl("-n", namespace, "get", "lease", "run-heartbeat", "-o", "json")
    annotations: dict[str, str] = json.loads(out.stdout)["metadata"].get("annotations", {})
    return annotations


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    for sub in ("state", "l1"):
        (tmp_path / sub).mkdir()
    return tmp_path


@pytest.fixture
def trainer(workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    script = workdir / "trainer.py"
    script.write_text(FAKE_TRAINER)
    env_vars = {**os.environ, env.L1_DIR: str(workdir / "l1")}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(script),
            str(workdir / "state" / env.HEARTBEAT_FILENAME),
            str(workdir / "state" / env.STACKS_FILENAME_PATTERN),
        ],
        env=env_vars,
    )
    yield proc
    stop_process(proc, sig=signal.SIGKILL)


def _start_agent(cluster: Cluster, namespace: str, workdir: Path) -> subprocess.Popen[bytes]:
    cluster.kubectl(
        "-n", namespace, "create", "-f", "-",
        input=json.dumps({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "run-heartbeat"},
            "spec": {"leaseDurationSeconds": 10},
        }),
    )  # fmt: skip
    agent_env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        env.RUN_NAME: "run",
        env.NAMESPACE: namespace,
        env.STATE_DIR: str(workdir / "state"),
        env.L1_DIR: str(workdir / "l1"),
        env.POD_NAME: "run-1",
        env.MONITOR: json.dumps(MONITOR),
    }  # fmt: skip
    log = (workdir / "agent.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "agent"],
        env=agent_env,
        stdout=log,
        stderr=log,
    )


def _wait_verdict(cluster: Cluster, namespace: str, want: str, timeout: float) -> float:
    start = time.monotonic()
    eventually(
        lambda: _lease(cluster, namespace).get(constants.ANNOTATION_VERDICT) == want,
        timeout,
        f"verdict {want}",
        0.1,
        detail=lambda: _lease(cluster, namespace),
    )
    return time.monotonic() - start


def test_death_is_reported_by_absence_within_seconds(
    cluster: Cluster, namespace: str, workdir: Path, trainer: subprocess.Popen[bytes]
) -> None:
    agent = _start_agent(cluster, namespace, workdir)
    try:
        _wait_verdict(cluster, namespace, "Healthy", timeout=30)
        annotations = _lease(cluster, namespace)
        assert int(annotations[constants.ANNOTATION_STEP]) > 0
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        seconds = _wait_verdict(cluster, namespace, "Dead", timeout=10)
        assert seconds <= 3.0
        evidence = json.loads(_lease(cluster, namespace)[constants.ANNOTATION_EVIDENCE])
        assert evidence["alive"] == "false"
        events = cluster.kubectl("-n", namespace, "get", "events", "-o", "json").stdout
        assert "VerdictDead" in events
    finally:
        stop_process(agent)
        print((workdir / "agent.log").read_text())


def test_hang_dumps_stacks_then_kills(
    cluster: Cluster, namespace: str, workdir: Path, trainer: subprocess.Popen[bytes]
) -> None:
    agent = _start_agent(cluster, namespace, workdir)
    try:
        _wait_verdict(cluster, namespace, "Healthy", timeout=30)
        trainer.send_signal(signal.SIGSTOP)
        _wait_verdict(cluster, namespace, "Hung", timeout=15)
        trainer.wait(timeout=10)
        assert trainer.returncode == -signal.SIGKILL  # killed only after the dump
        events = json.loads(cluster.kubectl("-n", namespace, "get", "events", "-o", "json").stdout)
        stacks = [e["message"] for e in events["items"] if e["reason"] == "HungTrainerStacks"]
        assert stacks
        assert "train_one_step" in stacks[0]
    finally:
        stop_process(agent)
