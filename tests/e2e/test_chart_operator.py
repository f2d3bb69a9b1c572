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
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart import Release, install, token_kubeconfig, uninstall, upgrade
from trainguard.api.constants import CRD_NAME
from trainguard.operator.metrics import ENV_METRICS_PORT
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.nodes import gpu_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TRAINGUARD = Path(sys.executable).parent / "trainguard"
POOL_LABEL = "trainguard.dev/test-pool"
RUN = "charted"
WAIT_SECONDS = 60.0
# Short resync: a restarted operator has reconciled every run within seconds.
RESYNC_SECONDS = 3
STOP_SECONDS = 10.0
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


def eventually(check: Callable[[], Any], what: str, timeout: float = WAIT_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.3)
    return value


def holds(check: Callable[[], Any], what: str, seconds: float) -> None:
    """Fail unless `check` stays truthy for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check(), what
        time.sleep(0.3)


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as response:
        text: str = response.read().decode()
        return text


class Operator:
    """`trainguard operator` as a subprocess with the chart's token, restartable."""

    def __init__(self, kubeconfig: Path, namespace: str, log_path: Path) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log_path = log_path
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [
            str(TRAINGUARD),
            "operator",
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={self.namespace}",
            f"--resync-seconds={RESYNC_SECONDS}",
            "--agent-image=trainguard:e2e",
            f"--liveness=http://127.0.0.1:{self.health_port}/healthz",
        ]
        env = {
            "PATH": str(TRAINGUARD.parent),
            ENV_METRICS_PORT: str(self.metrics_port),
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_SECONDS)

    def healthy(self) -> bool:
        try:
            http_get(f"http://127.0.0.1:{self.health_port}/healthz")
        except OSError:
            return False
        return True

    def metrics(self) -> str:
        return http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def release(cluster: Cluster, namespace: str) -> Iterator[Release]:
    """The chart, watching the test's namespace; its CRD installed by helm when missing."""
    installed = install(cluster, {"operator": {"watchNamespaces": [namespace]}})
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
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
) -> Iterator[Operator]:
    kubeconfig = token_kubeconfig(cluster, release, tmp_path / "token-kubeconfig")
    running = Operator(kubeconfig, namespace, tmp_path / "operator.log")
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
    cluster: Cluster, namespace: str, pool: str, release: Release, operator: Operator
) -> None:
    eventually(operator.healthy, "kopf's health endpoint")
    run = {
        "apiVersion": "trainguard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": RUN},
        "spec": {
            "trainer": {"image": "trainer:1", "command": ["python", "train.py"]},
            "model": {"parameters": 125_000_000},
            "placement": {"nodeSelector": {POOL_LABEL: pool}},
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(run))
    eventually(lambda: running(cluster, namespace, 1), "attempt 1 training")
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
    restarted = eventually(lambda: running(cluster, namespace, 2), "attempt 2 training")
    assert restarted["status"]["restarts"] == 1

    scraped = eventually(
        lambda: (
            (m := operator.metrics())
            and sample(m, "trainguard_restarts_total", namespace=namespace) == 1.0
            and m
        ),
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
    eventually(operator.healthy, "the operator after the upgrade")
    holds(
        lambda: (
            running(cluster, namespace, 2) is not None
            and pods(cluster, namespace)[0]["metadata"]["uid"] == pod_uid
        ),
        "the run keeps training in the same pod across the upgrade",
        seconds=RESYNC_SECONDS * 2,
    )

    # Suspend: the pod goes; the status says so.
    patch = json.dumps({"spec": {"suspend": True}})
    cluster.kubectl("patch", "trainingrun", RUN, "-n", namespace, "--type=merge", "-p", patch)
    eventually(
        lambda: (
            get(cluster, namespace, "trainingrun", RUN)["status"].get("phase") == "Suspended"
            and not pods(cluster, namespace)
        ),
        "the run suspended with no pod",
    )
    # Nothing was refused, and kopf had every permission it looks for (it logs when not).
    log = operator.log()
    assert "Forbidden" not in log
    assert " 403" not in log
    assert "Not enough permissions" not in log
