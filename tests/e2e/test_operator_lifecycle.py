"""A run's life: suspend, resume, a spec change, deletion that takes its children and only them.

And its end: a pod whose containers exited 0 completes the run, and nothing restarts it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from operator_proc import apply, condition, get_json, pods_of, pool_run

from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]
pytest_plugins = ("operator_fixtures",)

COMPANIONS = (
    ("serviceaccount", "life-trainguard"),
    ("role", "life-trainguard"),
    ("rolebinding", "life-trainguard"),
    ("lease", "life-heartbeat"),
)


def _run(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return get_json(cluster, "trainingrun", "life", "-n", namespace)


def _patch_spec(cluster: Cluster, namespace: str, spec: dict[str, Any]) -> None:
    cluster.kubectl(
        "patch",
        "trainingrun",
        "life",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": spec}),
    )


def _running_attempt(cluster: Cluster, namespace: str, attempt: int) -> dict[str, Any] | None:
    run = _run(cluster, namespace)
    status = run.get("status", {})
    pods = pods_of(cluster, namespace, "life")
    if status.get("phase") == "Running" and status.get("attempt") == attempt and len(pods) == 1:
        return run
    return None


def _exists(cluster: Cluster, namespace: str, kind: str, name: str) -> bool:
    return cluster.kubectl("get", kind, name, "-n", namespace, check=False).returncode == 0


def test_suspend_resume_change_and_delete(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    run = pool_run(node_pool, "life")
    bystanders = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "life-notes"}, "data": {}},
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "life-other", "labels": {"trainguard.dev/run": "other"}},
            "spec": {},
        },
    ]
    apply(cluster, namespace, run, *bystanders)
    eventually(lambda: _running_attempt(cluster, namespace, 1), 60, "attempt 1 running")

    # Suspend: the pod goes, the run's other children and status stay.
    _patch_spec(cluster, namespace, {"suspend": True})
    suspended = eventually(
        lambda: (
            (r := _run(cluster, namespace))["status"]["phase"] == "Suspended"
            and not pods_of(cluster, namespace, "life")
            and r
        ),
        60,
        "the run to be suspended with no pod",
    )
    found = condition(suspended, "Suspended")
    assert found is not None and found["status"] == "True"
    assert suspended["status"]["attempt"] == 1
    assert "node" not in suspended["status"]
    for kind, name in COMPANIONS:
        assert _exists(cluster, namespace, kind, name), kind

    # Resume: the next attempt, not a restart.
    _patch_spec(cluster, namespace, {"suspend": False})
    resumed = eventually(lambda: _running_attempt(cluster, namespace, 2), 60, "attempt 2 running")
    assert [p["metadata"]["name"] for p in pods_of(cluster, namespace, "life")] == ["life-2"]
    assert resumed["status"]["restarts"] == 0

    # A spec change replaces the pod with one built from the new spec.
    _patch_spec(cluster, namespace, {"trainer": {"args": ["--lr", "1e-4"]}})
    eventually(lambda: _running_attempt(cluster, namespace, 3), 60, "attempt 3 running")
    [pod] = pods_of(cluster, namespace, "life")
    assert pod["metadata"]["name"] == "life-3"
    assert pod["spec"]["containers"][0]["args"] == ["--lr", "1e-4"]

    # Deletion takes the run's children and nothing else.
    cluster.kubectl("delete", "trainingrun", "life", "-n", namespace, "--wait=true", timeout=60)
    eventually(
        lambda: (
            not pods_of(cluster, namespace, "life")
            and not any(_exists(cluster, namespace, kind, name) for kind, name in COMPANIONS)
        ),
        60,
        "the children to be garbage-collected",
    )
    assert _exists(cluster, namespace, "configmap", "life-notes")
    assert _exists(cluster, namespace, "lease", "life-other")
    assert operator.alive()


def test_a_trainer_that_exits_0_completes_the_run(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, pool_run(node_pool, "done"))

    def phase() -> str | None:
        status = get_json(cluster, "trainingrun", "done", "-n", namespace).get("status", {})
        found: str | None = status.get("phase")
        return found

    eventually(lambda: phase() == "Running", 60, "the run to be Running")
    # The kubelet's report of a pod whose containers exited 0 (kwok's pods never finish alone).
    pod = get_json(cluster, "pod", "done-1", "-n", namespace)
    finished = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    statuses = [
        {"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
         "restartCount": 0, "state": finished}
        for c in pod["spec"]["containers"]
    ]  # fmt: skip
    cluster.kubectl(
        "patch", "pod", "done-1", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Succeeded", "containerStatuses": statuses}}),
    )  # fmt: skip
    eventually(lambda: phase() == "Completed", 30, "the run to be Completed")
    run = get_json(cluster, "trainingrun", "done", "-n", namespace)
    complete = condition(run, "Complete")
    assert complete is not None and complete["status"] == "True", complete
    assert complete["reason"] == "Completed", complete
    assert run["status"].get("completionTime")
    time.sleep(4)  # a resync later, no new attempt: a finished run stays finished
    assert [p["metadata"]["name"] for p in pods_of(cluster, namespace, "done")] == ["done-1"]
    assert phase() == "Completed"
