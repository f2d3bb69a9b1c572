"""The escalation ladder on the local control plane: the agent's verdicts reach the status.

The agent is simulated by annotating the run's heartbeat Lease as it would at a renewal.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from operator_proc import OperatorProcess, apply, eventually, example, get_json, pinned

from trainguard.devcluster.cluster import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
pytest_plugins = ("operator_fixtures",)


def _status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = get_json(cluster, "trainingrun", "minimal", "-n", namespace).get(
        "status", {}
    )
    return status


def _renew(cluster: Cluster, namespace: str, verdict: str, step: int, saved: int) -> None:
    evidence = json.dumps({"reason": f"simulated {verdict}"}, separators=(",", ":"))
    cluster.kubectl(
        "annotate", "--overwrite", "lease", "minimal-heartbeat", "-n", namespace,
        f"trainguard.dev/verdict={verdict}", f"trainguard.dev/step={step}",
        f"trainguard.dev/saved-step={saved}", f"trainguard.dev/evidence={evidence}",
    )  # fmt: skip


def test_a_failure_verdict_reaches_the_status_at_once(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, pinned(example("minimal"), node_pool))
    eventually(
        lambda: _status(cluster, namespace).get("phase") == "Running", 60, "the run to be Running"
    )
    # A death is an event of the Lease: the cycle runs at once, not at the next resync.
    _renew(cluster, namespace, "Dead", 120, 100)
    start = time.monotonic()
    eventually(lambda: _status(cluster, namespace).get("verdict") == "Dead", 10, "verdict Dead")
    assert time.monotonic() - start < 2.5  # the resync runs every 3 s
    status = _status(cluster, namespace)
    assert (status["step"], status["checkpointStep"]) == (120, 100)
