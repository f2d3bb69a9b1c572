"""The operator as a real subprocess, and helpers for its end-to-end tests.

The fixtures built on these are in `operator_fixtures` (loaded by the tests with
``pytest_plugins``).
"""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from trainguard.api.constants import CRD_NAME
from trainguard_dev.cluster.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / f"{CRD_NAME}.yaml"
EXAMPLES = REPO / "examples"
TRAINGUARD = Path(sys.executable).parent / "trainguard"
POOL_LABEL = "trainguard.dev/test-pool"
STOP_SECONDS = 10.0
# Short resync: tests that wait on something no watch reports do not wait long.
RESYNC_SECONDS = "3"
# The operator logs this as it applies a pod: it is in the middle of a reconcile.
CREATING_POD = ": creating pod "


class OperatorProcess:
    """`trainguard operator -n <namespace>` against the test cluster, started and killed."""

    def __init__(
        self,
        cluster: Cluster,
        namespaces: list[str],
        log_path: Path,
        kubeconfig: Path | None = None,
    ) -> None:
        self.cluster = cluster
        # The admin's kubeconfig by default; a ServiceAccount token's to test RBAC.
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.namespaces = namespaces
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        """Start the operator (appending to the same log across restarts)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        argv = [str(TRAINGUARD), "operator", "--kubeconfig", str(self.kubeconfig)]
        for namespace in self.namespaces:
            argv += ["--namespace", namespace]
        argv += ["--resync-seconds", RESYNC_SECONDS, "--agent-image", "trainguard:e2e"]
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        """The running operator's PID."""
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: the operator dies wherever it is, as in a node or OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=STOP_SECONDS)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill()

    def alive(self) -> bool:
        """Whether the operator process is running."""
        return self.proc is not None and self.proc.poll() is None

    def wait_for(self, marker: str, timeout: float = 30.0) -> None:
        """Wait until the operator, since its latest start, logged a line containing `marker`."""
        header = f"===== start {self.starts} ====="
        eventually(
            lambda: marker in self.log().rpartition(header)[2],
            timeout,
            f"{marker!r} after operator start {self.starts}",
        )

    def log(self) -> str:
        """Everything the operator printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def get_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    """`kubectl get ... -o json`, decoded."""
    data: dict[str, Any] = json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)
    return data


def eventually(check: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or check}")
        time.sleep(0.3)


def example(name: str) -> dict[str, Any]:
    """One of the checked-in examples, parsed."""
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return data


def pinned(run: dict[str, Any], pool: str) -> dict[str, Any]:
    """The run, restricted to the test's own nodes."""
    pinned_run = copy.deepcopy(run)
    placement = pinned_run["spec"].setdefault("placement", {})
    placement.setdefault("nodeSelector", {})[POOL_LABEL] = pool
    return pinned_run


def apply(cluster: Cluster, namespace: str, *objects: dict[str, Any]) -> None:
    """Create or update objects in the namespace."""
    text = yaml.safe_dump_all(list(objects))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=text)


def pods_of(cluster: Cluster, namespace: str, run: str) -> list[dict[str, Any]]:
    """The pods labelled as the run's."""
    items: list[dict[str, Any]] = get_json(
        cluster, "pods", "-n", namespace, "-l", f"trainguard.dev/run={run}"
    )["items"]
    return items


def condition(run: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """A condition of a run's status."""
    for found in run.get("status", {}).get("conditions", []):
        if found["type"] == kind:
            return dict(found)
    return None


def events_of(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events about a run."""
    items: list[dict[str, Any]] = get_json(
        cluster,
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.kind=TrainingRun,involvedObject.name={name}",
    )["items"]
    return items


def diagnostics(cluster: Cluster, namespace: str, operator: OperatorProcess | None) -> str:
    """What a failed test needs: the operator's log, descriptions and Events."""
    parts = []
    if operator is not None:
        parts.append(f"----- operator log ({operator.log_path}) -----\n{operator.log()[-20000:]}")
    for args in (
        ("describe", "trainingruns", "-n", namespace),
        ("describe", "pods", "-n", namespace),
        ("get", "events", "-n", namespace, "--sort-by=.metadata.creationTimestamp"),
    ):
        result = cluster.kubectl(*args, check=False)
        parts.append(f"----- kubectl {' '.join(args)} -----\n{result.stdout}{result.stderr}")
    return "\n".join(parts)
