"""Detection latency, end to end: a real death, timed from the agent's first sight to the status.

The reference trainer runs on a process-backed node and the operator as a process serving its
metrics. The trainer is SIGKILLed; the test times, with its own clock (the machine's, which
the agent and the operator share here), the kill and the first read of the status showing
the death, and reads `trainguard_detection_latency_seconds` from `/metrics`: the observation
is above 0 and within that bound. Then the restarted trainer is killed while the operator is
stopped (SIGSTOP): the test reads the agent's verdict start on the Lease (`verdict-since`)
meanwhile, and the observation counts from it, not from the operator's waking. The scenario
and its assertions are `trainguard_dev.testing.signals`'s, which the real-node tier shares.
"""

from __future__ import annotations

import os
import signal
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from operator_proc import AGENT_IMAGE, RESYNC_SECONDS, apply, diagnostics, get_json
from recovery_helpers import bound_pod, status_of

from trainguard.contract.env import lease_name
from trainguard.operator.metrics import ENV_METRICS_PORT
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.pods import checkpointed, heartbeat, state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run
from trainguard_dev.testing.servers import free_ports
from trainguard_dev.testing.signals import assert_deaths_timed_from_the_verdict, detections

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUN = "timed"
EVERY_STEPS = 10
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

    def metrics(self) -> str:
        """The `/metrics` text."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as response:
            text: str = response.read().decode()
        return text


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


@dataclass
class ProcessNodeRun:
    """The run on a process-backed node: its files on this machine, the operator a process."""

    cluster: Cluster
    namespace: str
    state: Path
    operator: MeteredOperator

    def status(self) -> dict[str, Any]:
        """The run's status."""
        return status_of(self.cluster, self.namespace, RUN)

    def heartbeat(self) -> dict[str, Any] | None:
        """The trainer's heartbeat in the pod's state directory."""
        return heartbeat(self.state)

    def kill_trainer(self, pid: int) -> None:
        """SIGKILL: the trainer is a process of this machine."""
        os.kill(pid, signal.SIGKILL)

    def lease_annotations(self) -> dict[str, str]:
        """The run's Lease's annotations."""
        lease = get_json(self.cluster, "lease", lease_name(RUN), "-n", self.namespace)
        annotations: dict[str, str] = lease["metadata"].get("annotations", {})
        return annotations

    def metrics(self) -> str:
        """The operator's `/metrics`."""
        return self.operator.metrics()

    def pause_operator(self) -> None:
        """SIGSTOP the operator's process."""
        os.kill(self.operator.pid, signal.SIGSTOP)

    def resume_operator(self) -> None:
        """SIGCONT the operator's process."""
        os.kill(self.operator.pid, signal.SIGCONT)


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
    # A fresh namespace: nothing observed before this run's deaths.
    assert detections(metered.metrics(), namespace) == (0, 0.0)
    assert_deaths_timed_from_the_verdict(ProcessNodeRun(cluster, namespace, state, metered))
