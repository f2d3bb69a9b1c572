"""Killing the operator at seeded random moments of its reconcile never duplicates a pod.

Ten rounds: new runs are created and one older run loses its pod (so the next attempt is
due) while the operator is down; the operator starts, and is SIGKILLed a seeded random time
after it began creating pods, in the middle of reconciling. After every kill no run has
more than one live pod; at the end each run has exactly one pod, `<run>-<status.attempt>`.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from operator_proc import CREATING_POD, apply, get_json, pool_run

from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
pytest_plugins = ("operator_fixtures",)

SEED = 20260101
ROUNDS = 10
RUNS_PER_ROUND = 2
# Reconciling a round's runs takes about this long on 2 cores.
MAX_KILL_DELAY_SECONDS = 0.6


def _pods_by_run(cluster: Cluster, namespace: str) -> dict[str, list[dict[str, Any]]]:
    pods: dict[str, list[dict[str, Any]]] = {}
    for pod in get_json(cluster, "pods", "-n", namespace)["items"]:
        run = pod["metadata"].get("labels", {}).get("trainguard.dev/run")
        if run is not None:
            pods.setdefault(run, []).append(pod)
    return pods


def _live(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods if "deletionTimestamp" not in p["metadata"]]


def _converged(cluster: Cluster, namespace: str, names: list[str]) -> bool:
    runs = {
        r["metadata"]["name"]: r
        for r in get_json(cluster, "trainingruns", "-n", namespace)["items"]
    }
    pods = _pods_by_run(cluster, namespace)
    for name in names:
        attempt = runs[name].get("status", {}).get("attempt")
        if attempt is None or [p["metadata"]["name"] for p in pods.get(name, [])] != [
            f"{name}-{attempt}"
        ]:
            return False
    return True


def test_operator_killed_mid_reconcile_leaves_one_pod_per_run(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    rng = random.Random(SEED)
    operator.kill()
    names: list[str] = []
    kills = []
    for round_ in range(ROUNDS):
        batch = [f"chaos-{round_}-{i}" for i in range(RUNS_PER_ROUND)]
        runs = [pool_run(node_pool, name) for name in batch]
        apply(cluster, namespace, *runs)
        if names:
            # An older run loses its pod: its next attempt is due when the operator returns.
            victim = rng.choice(names)
            cluster.kubectl(
                "delete",
                "pods",
                "-n",
                namespace,
                "-l",
                f"trainguard.dev/run={victim}",
                "--wait=false",
            )
        names += batch

        operator.start()
        operator.wait_for(CREATING_POD)
        delay = rng.uniform(0, MAX_KILL_DELAY_SECONDS)
        time.sleep(delay)
        operator.kill()
        kills.append(round(delay, 2))
        for run, pods in _pods_by_run(cluster, namespace).items():
            assert len(_live(pods)) <= 1, (round_, run, _live(pods))

    operator.start()
    eventually(lambda: _converged(cluster, namespace, names), 90, "every run to have its one pod")
    print(f"killed {len(kills)} times, at {kills} s after the first pod creation")
