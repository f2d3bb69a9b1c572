"""Detection latency, end to end: a real death, timed from the agent's first sight to the status.

The reference trainer runs on a process-backed node and the operator as a process serving its
metrics. The trainer is SIGKILLed; the test times, with its own clock (the machine's, which
the agent and the operator share here), the kill and the first read of the status showing
the death, and reads `trainguard_detection_latency_seconds` from `/metrics`: the observation
is above 0 and within that bound. Then the restarted trainer is killed while the operator is
stopped (SIGSTOP): the test reads the agent's verdict start on the Lease (`verdict-since`)
meanwhile, and the observation counts from it, not from the operator's waking.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from operator_proc import AGENT_IMAGE, RESYNC_SECONDS, apply, diagnostics, get_json
from prometheus_client.parser import text_string_to_metric_families
from recovery_helpers import bound_pod, status_of

from trainguard.api.constants import ANNOTATION_VERDICT, ANNOTATION_VERDICT_SINCE
from trainguard.contract.env import lease_name
from trainguard.operator.metrics import ENV_METRICS_PORT
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.pods import checkpointed, heartbeat, state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run
from trainguard_dev.testing.servers import free_ports

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUN = "timed"
EVERY_STEPS = 10
HISTOGRAM = "trainguard_detection_latency_seconds"
# Reads of the status while a death is awaited: the bound is the first read that shows it.
POLL_SECONDS = 0.05
# The time the operator is stopped while the second death happens.
PAUSE_SECONDS = 4.0
# The operator reads its clock once the apiserver's answer is in: a read of the status may
# end a moment before that.
MARGIN_SECONDS = 0.25
HTTP_TIMEOUT_SECONDS = 5


class MeteredOperator(OperatorProcess):
    """The operator with its metrics endpoint on a port of its own."""

    def __init__(self, kubeconfig: Path, namespace: str, log_path: Path) -> None:
        [self.metrics_port] = free_ports(1)
        super().__init__(
            kubeconfig,
            [namespace],
            log_path,
            resync_seconds=RESYNC_SECONDS,
            agent_image=AGENT_IMAGE,
            extra_args=[f"--node-check-namespace={namespace}"],
            env={**os.environ, ENV_METRICS_PORT: str(self.metrics_port)},
        )

    def detections(self, namespace: str) -> tuple[int, float]:
        """The histogram's count and sum for the namespace (0, 0.0 before any)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as response:
            text = response.read().decode()
        found = {"count": 0.0, "sum": 0.0}
        for family in text_string_to_metric_families(text):
            if family.name != HISTOGRAM:
                continue
            for sample in family.samples:
                kind = sample.name.removeprefix(f"{HISTOGRAM}_")
                if kind in found and sample.labels.get("namespace") == namespace:
                    found[kind] = sample.value
        return int(found["count"]), found["sum"]


@pytest.fixture
def metered(
    cluster: Cluster,
    namespace: str,
    trainingrun_crd: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[MeteredOperator]:
    """The operator watching this test's namespace; diagnostics on failure."""
    process = MeteredOperator(cluster.kubeconfig, namespace, tmp_path / "operator.log")
    process.start()
    failed_before = request.session.testsfailed
    try:
        yield process
    finally:
        if process.alive():
            os.kill(process.pid, signal.SIGCONT)  # a test that failed while it was stopped
        if request.session.testsfailed > failed_before:
            print(diagnostics(cluster, namespace, process))
        process.stop()


def _kill_trainer(state: Path) -> tuple[dict[str, Any], float]:
    """SIGKILL the trainer; its heartbeat and the wall-clock time just before the kill."""
    beat = heartbeat(state)
    assert beat is not None and beat.get("pid"), beat
    killed = time.time()
    os.kill(int(beat["pid"]), signal.SIGKILL)
    return beat, killed


def _death_seen(cluster: Cluster, namespace: str, restarts: int) -> float:
    """Poll the status until it records death number `restarts`; the time of that read's end."""

    def seen() -> float | None:
        status = status_of(cluster, namespace, RUN)
        failure = status.get("lastFailure") or {}
        done = failure.get("cause") == "Dead" and status.get("restarts") == restarts
        return time.time() if done else None

    return eventually(seen, 60, f"death {restarts} in the status", POLL_SECONDS)


def _dead_since(cluster: Cluster, namespace: str, killed: float) -> float | None:
    """The agent's start of a Dead verdict after `killed`, as its Lease says (µs), else None."""
    annotations = get_json(cluster, "lease", lease_name(RUN), "-n", namespace)["metadata"].get(
        "annotations", {}
    )
    text = annotations.get(ANNOTATION_VERDICT_SINCE)
    if annotations.get(ANNOTATION_VERDICT) != "Dead" or not text:
        return None
    since = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return since if since >= killed else None


def _observed(operator: MeteredOperator, namespace: str, count: int) -> float:
    """The histogram's sum once it holds `count` observations (exactly that many)."""
    found = eventually(
        lambda: (d := operator.detections(namespace))[0] >= count and d,
        10,
        f"{count} detection(s) in the metrics",
    )
    assert found[0] == count, found
    return found[1]


def test_a_real_death_is_timed_from_the_agents_verdict_to_the_status_write(
    cluster: Cluster,
    namespace: str,
    metered: MeteredOperator,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    run = reference_run(
        RUN,
        make_shards(tmp_path / "shards"),
        EVERY_STEPS,
        {
            "monitor": {"startupGraceSeconds": 5},
            # Two deaths restarted in place, never a pattern: only the timing is at stake.
            "recovery": {
                "sameStepWindow": 0,
                "onRepeatedFailure": "Continue",
                "backoff": {"initialSeconds": 1, "maxSeconds": 2},
            },
        },
    )
    apply(cluster, namespace, run)
    pod = eventually(lambda: bound_pod(cluster, namespace, RUN), what="the pod bound")
    state = state_dir(cluster.root, pod)
    eventually(lambda: checkpointed(state, EVERY_STEPS), timeout=120, what="a checkpoint")
    eventually(
        lambda: status_of(cluster, namespace, RUN).get("verdict") == "Healthy", 30, "Healthy"
    )
    assert metered.detections(namespace) == (0, 0.0)

    # A death as it comes: the observation lies within what the test itself measured, the
    # kill to the first read of the status that shows it.
    first, killed = _kill_trainer(state)
    seen = _death_seen(cluster, namespace, 1)
    latency = _observed(metered, namespace, 1)
    recorded = status_of(cluster, namespace, RUN)["lastFailure"]["since"]
    print(f"death 1: status seen {seen - killed:.3f} s after the kill; observed {latency:.3f} s")
    assert 0 < latency <= seen - killed + MARGIN_SECONDS
    # The record keeps the agent's verdict start (to the second): after the kill.
    assert int(killed) <= datetime.fromisoformat(recorded.replace("Z", "+00:00")).timestamp()

    # The restarted trainer, seen alive, dies while the operator is stopped: the write that
    # records it comes after the operator woke, and the observation counts from the verdict.
    def restarted() -> dict[str, Any] | None:
        beat = heartbeat(state)
        fresh = beat and beat["pid"] != first["pid"] and beat.get("step") is not None
        return beat if fresh else None

    eventually(restarted, 90, "the trainer restarted in place", 0.1)
    eventually(
        lambda: status_of(cluster, namespace, RUN).get("verdict") == "Healthy", 30, "Healthy"
    )
    os.kill(metered.pid, signal.SIGSTOP)
    try:
        _, killed = _kill_trainer(state)
        since = eventually(
            lambda: _dead_since(cluster, namespace, killed), 10, "the agent's Dead", 0.1
        )
        time.sleep(max(0.0, killed + PAUSE_SECONDS - time.time()))
        woken = time.time()
    finally:
        os.kill(metered.pid, signal.SIGCONT)
    seen = _death_seen(cluster, namespace, 2)
    latency = _observed(metered, namespace, 2) - latency
    print(
        f"death 2: verdict {since - killed:.3f} s after the kill, operator woken after "
        f"{woken - killed:.3f} s, status seen after {seen - killed:.3f} s; "
        f"observed {latency:.3f} s"
    )
    assert woken - since <= latency <= seen - since + MARGIN_SECONDS
