"""What the operator's end-to-end tests share: kubectl reads, runs on the test's nodes, diagnostics.

The operator process, the run builders and the polling helper are `trainguard_dev.testing`'s;
the fixtures built on these are in `operator_fixtures` (loaded by the tests with
``pytest_plugins``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from trainguard.api.constants import CRD_NAME
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import example_run, pinned

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / f"{CRD_NAME}.yaml"
POOL_LABEL = "trainguard.dev/test-pool"
# Short resync: tests that wait on something no watch reports do not wait long.
RESYNC_SECONDS = 3
AGENT_IMAGE = "trainguard:e2e"
# The operator logs this as it applies a pod: it is in the middle of a reconcile.
CREATING_POD = ": creating pod "


def get_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    """`kubectl get ... -o json`, decoded."""
    data: dict[str, Any] = json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)
    return data


def pool_run(pool: str, name: str | None = None, spec: dict[str, Any] | None = None) -> Obj:
    """examples/minimal.yaml (renamed, `spec` merged in), pinned to the test's own nodes."""
    return pinned(example_run("minimal", name, spec), POOL_LABEL, pool)


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
