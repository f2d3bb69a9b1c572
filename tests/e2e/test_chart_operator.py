"""The operator with the chart's identity: its RBAC suffices, its metrics serve, upgrades keep runs.

The chart is installed with helm (its own operator pod pinned nowhere); the operator then
runs here as `trainguard operator` with only the chart's ServiceAccount token, watching the
test's namespace as a chart install with `operator.watchNamespaces` would. A run goes
through its life (created, pod lost, suspended) while the metrics endpoint is scraped, and a
`helm upgrade` with changed values, with the operator restarted as the Deployment's Recreate
would, leaves the running pod alone.
"""

from __future__ import annotations

import json
import socket
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart import Release, install, token_kubeconfig, uninstall, upgrade
from trainguard.api.constants import CRD_NAME
from trainguard.operator.metrics import ENV_METRICS_PORT
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.nodes import gpu_node
from trainguard_dev.testing.polling import eventually, holds
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import pinned, training_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BIN_DIR = Path(sys.executable).parent
POOL_LABEL = "trainguard.dev/test-pool"
RUN = "charted"
WAIT_SECONDS = 60.0
# Short resync: a restarted operator has reconciled every run within seconds.
RESYNC_SECONDS = 3
HTTP_TIMEOUT_SECONDS = 5
METRIC_NAMES = (
    "trainguard_runs",
    "trainguard_verdicts_total",
    "trainguard_actions_total",
    "trainguard_detection_latency_seconds",
    "trainguard_restarts_total",
    "trainguard_reschedules_total",
    "trainguard_checkpoint_age_seconds",
    "trainguard_nodes_excluded",
)
Obj = dict[str, Any]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as response:
        text: str = response.read().decode()
        return text


class ChartOperator(OperatorProcess):
    """The operator with the chart's token only, its health and metrics on ports of its own."""

    def __init__(self, kubeconfig: Path, namespace: str, checks: str, log_path: Path) -> None:
        self.health_port = free_port()
        self.metrics_port = free_port()
        super().__init__(
            kubeconfig,
            [namespace],
            log_path,
            resync_seconds=RESYNC_SECONDS,
            agent_image="trainguard:e2e",
            extra_args=[
                f"--liveness=http://127.0.0.1:{self.health_port}/healthz",
                # Node checks where the chart lets them run: the release's namespace.
                f"--node-check-namespace={checks}",
            ],
            env={"PATH": str(BIN_DIR), ENV_METRICS_PORT: str(self.metrics_port)},
        )

    def healthy(self) -> bool:
        try:
            http_get(f"http://127.0.0.1:{self.health_port}/healthz")
        except OSError:
            return False
        return True

    def metrics(self) -> str:
        return http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")


@pytest.fixture
def release(cluster: Cluster, namespace: str) -> Iterator[Release]:
    """The chart, watching the test's namespace; its CRD installed by helm when missing."""
    installed = install(cluster, {"operator": {"watchNamespaces": [namespace]}})
    cluster.wait_established(CRD_NAME)
    yield installed
    uninstall(cluster, installed)


@pytest.fixture
def pool(cluster: Cluster, namespace: str) -> Iterator[str]:
    """One kwok GPU node of this test's own."""
    node = gpu_node(f"{namespace}-gpu-0")
    node["metadata"]["labels"][POOL_LABEL] = namespace
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(node))
    yield namespace
    cluster.kubectl("delete", "node", node["metadata"]["name"], "--wait=false", check=False)


@pytest.fixture
def operator(
    cluster: Cluster,
    namespace: str,
    release: Release,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[ChartOperator]:
    kubeconfig = token_kubeconfig(cluster, release, tmp_path / "token-kubeconfig")
    running = ChartOperator(kubeconfig, namespace, release.namespace, tmp_path / "operator.log")
    running.start()
    failed_before = request.session.testsfailed
    try:
        yield running
    finally:
        running.stop()
        if request.session.testsfailed > failed_before:
            print(f"----- operator log -----\n{running.log()[-20000:]}")
            described = cluster.kubectl("describe", "trainingruns,pods", "-n", namespace)
            print(f"----- describe -----\n{described.stdout}")


def get(cluster: Cluster, namespace: str, *args: str) -> Obj:
    data: Obj = json.loads(cluster.kubectl("get", *args, "-n", namespace, "-o", "json").stdout)
    return data


def pods(cluster: Cluster, namespace: str) -> list[Obj]:
    items: list[Obj] = get(cluster, namespace, "pods", "-l", f"trainguard.dev/run={RUN}")["items"]
    return items


def running(cluster: Cluster, namespace: str, attempt: int) -> Obj | None:
    """The run, once it trains in attempt `attempt` with exactly that pod."""
    run = get(cluster, namespace, "trainingrun", RUN)
    status = run.get("status", {})
    names = [p["metadata"]["name"] for p in pods(cluster, namespace)]
    ready = status.get("phase") == "Running" and status.get("attempt") == attempt
    return run if ready and names == [f"{RUN}-{attempt}"] else None


def sample(metrics: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text format."""
    for line in metrics.splitlines():
        metric, _, value = line.rpartition(" ")
        if metric.split("{")[0] != name:
            continue
        if all(f'{key}="{val}"' in metric for key, val in labels.items()):
            return float(value)
    return None


def test_operator_with_the_charts_identity(
    cluster: Cluster, namespace: str, pool: str, release: Release, operator: ChartOperator
) -> None:
    eventually(operator.healthy, WAIT_SECONDS, "kopf's health endpoint")
    run = pinned(training_run(RUN, {"model": {"parameters": 125_000_000}}), POOL_LABEL, pool)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(run))
    eventually(lambda: running(cluster, namespace, 1), WAIT_SECONDS, "attempt 1 training")
    # The companions were applied with the chart's token: the agent's Role passed the
    # apiserver's escalation check, so the operator holds what it grants.
    for kind, name in (
        ("serviceaccount", f"{RUN}-trainguard"),
        ("role", f"{RUN}-trainguard"),
        ("rolebinding", f"{RUN}-trainguard"),
        ("lease", f"{RUN}-heartbeat"),
    ):
        cluster.kubectl("get", kind, name, "-n", namespace)
    events = get(cluster, namespace, "events", "--field-selector", f"involvedObject.name={RUN}")
    assert {e["reason"] for e in events["items"]} >= {"Scheduling", "Training"}

    # A lost pod: a new attempt, counted as a restart.
    cluster.kubectl("delete", "pod", f"{RUN}-1", "-n", namespace, "--wait=false")
    restarted = eventually(
        lambda: running(cluster, namespace, 2), WAIT_SECONDS, "attempt 2 training"
    )
    assert restarted["status"]["restarts"] == 1

    scraped = eventually(
        lambda: (
            (m := operator.metrics())
            and sample(m, "trainguard_restarts_total", namespace=namespace) == 1.0
            and m
        ),
        WAIT_SECONDS,
        "the restart in the metrics",
    )
    for name in METRIC_NAMES:
        assert f"# TYPE {name} " in scraped, name
    assert sample(scraped, "trainguard_runs", namespace=namespace, phase="Running") == 1.0
    assert sample(scraped, "trainguard_actions_total", namespace=namespace, action="Training")

    # helm upgrade with changed values; the operator pod is replaced (Recreate): the run's
    # pod is left alone and the run keeps training in the same attempt.
    pod_uid = pods(cluster, namespace)[0]["metadata"]["uid"]
    changed = {
        "operator": {"watchNamespaces": [namespace], "workers": 4, "resyncSeconds": 10},
        "resources": {"requests": {"cpu": "200m", "memory": "300Mi"}},
    }
    upgrade(cluster, release, changed)
    deployment = get(cluster, release.namespace, "deployment", release.account)
    assert "--workers=4" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    operator.stop()
    operator.start()
    eventually(operator.healthy, WAIT_SECONDS, "the operator after the upgrade")
    holds(
        lambda: (
            running(cluster, namespace, 2) is not None
            and pods(cluster, namespace)[0]["metadata"]["uid"] == pod_uid
        ),
        RESYNC_SECONDS * 2,
        "the run keeps training in the same pod across the upgrade",
    )

    # Suspend: the pod goes; the status says so.
    patch = json.dumps({"spec": {"suspend": True}})
    cluster.kubectl("patch", "trainingrun", RUN, "-n", namespace, "--type=merge", "-p", patch)
    eventually(
        lambda: (
            get(cluster, namespace, "trainingrun", RUN)["status"].get("phase") == "Suspended"
            and not pods(cluster, namespace)
        ),
        WAIT_SECONDS,
        "the run suspended with no pod",
    )
    # Nothing was refused, and kopf had every permission it looks for (it logs when not).
    log = operator.log()
    assert "Forbidden" not in log
    assert " 403" not in log
    assert "Not enough permissions" not in log
