"""The escalation ladder on the local control plane: verdicts -> status -> actions.

The agent's verdicts reach the status, and the operator restarts in place, moves the run off
a sick node, or stops it: at a repeated failure with `Stop`, or when restarts without progress
exceed `maxRestarts`. With `Continue` a repeated failure is restarted and the run trains on
with the condition kept.

The agent is simulated by writing the run's heartbeat Lease as it would at a renewal (its
holder is the pod, its annotations the verdict, steps and evidence). The runs are pinned to
two kwok nodes of the test's own, deleted afterwards.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, condition, events_of, get_json, pods_of, pool_run

from trainguard.operator.build.names import rbac_name
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.demo.env import token_kubeconfig
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.statuses import StatusRecorder, read_recorded, watch_command

# The ladder itself: a run's word taints its node at once (the confirmed policy, whose
# node checks need process-backed nodes, is tests/e2e/test_node_health.py's).
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.taint_policy("immediate"),
]
pytest_plugins = ("operator_fixtures",)


def _status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = get_json(cluster, "trainingrun", "minimal", "-n", namespace).get(
        "status", {}
    )
    return status


def _renew(
    cluster: Cluster, namespace: str, verdict: str, step: int, saved: int, pod: str = "minimal-1"
) -> None:
    """Renew the run's Lease as its agent would, with the agent's own identity.

    Only the run's agent (its ServiceAccount `minimal-trainguard`) and the operator may write
    the Lease where the chart's admission policy is installed: the test speaks as the agent.
    """
    evidence = json.dumps({"reason": f"simulated {verdict}"}, separators=(",", ":"))
    annotations = {
        "trainguard.dev/verdict": verdict,
        "trainguard.dev/step": str(step),
        "trainguard.dev/saved-step": str(saved),
        "trainguard.dev/evidence": evidence,
    }
    patch = {"metadata": {"annotations": annotations}, "spec": {"holderIdentity": pod}}
    with tempfile.TemporaryDirectory() as directory:
        agent = token_kubeconfig(
            cluster, namespace, rbac_name("minimal"), Path(directory) / "agent", "10m"
        )
        subprocess.run(
            [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(agent),
             "patch", "lease", "minimal-heartbeat", "-n", namespace, "--type=merge",
             "-p", json.dumps(patch)],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip


def _start(cluster: Cluster, namespace: str, pool: str, **recovery: Any) -> dict[str, Any]:
    apply(cluster, namespace, pool_run(pool, spec={"recovery": recovery}))
    eventually(
        lambda: _status(cluster, namespace).get("phase") == "Running", 60, "the run to be Running"
    )
    return _status(cluster, namespace)


def _kubectl(cluster: Cluster) -> list[str]:
    return [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]


def _pods(cluster: Cluster, namespace: str) -> dict[str, str | None]:
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName")
        for p in pods_of(cluster, namespace, "minimal")
        if not p["metadata"].get("deletionTimestamp")
    }


def _taints(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    taints: list[dict[str, Any]] = get_json(cluster, "node", node)["spec"].get("taints") or []
    return taints


def test_a_failure_verdict_reaches_the_status_at_once(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, pool_run(node_pool))
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


def test_ghost_memory_taints_the_node_and_moves_the_run_elsewhere(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    sick = _start(cluster, namespace, node_pool)["node"]
    _renew(cluster, namespace, "GhostMemory", 120, 100)
    eventually(lambda: "minimal-2" in _pods(cluster, namespace), 30, "attempt 2")
    status = eventually(
        lambda: (s := _status(cluster, namespace)).get("phase") == "Running" and s, 30, "Running"
    )
    assert _pods(cluster, namespace) == {"minimal-2": status["node"]}
    assert status["node"] != sick and status["attempt"] == 2
    assert [(n["node"], n["reason"]) for n in status["excludedNodes"]] == [(sick, "GhostMemory")]
    assert status["lastFailure"]["cause"] == "GhostMemory"
    assert status["lastFailure"]["attempt"] == 1 and status["restarts"] == 1
    assert {"key": "trainguard.dev/unhealthy", "value": "GhostMemory", "effect": "NoSchedule"} in (
        _taints(cluster, sick)
    )
    pod = get_json(cluster, "pod", "minimal-2", "-n", namespace)
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [sick]
    [event] = [e for e in events_of(cluster, namespace, "minimal") if e["reason"] == "GhostMemory"]
    assert event["type"] == "Warning" and "simulated GhostMemory" in event["message"]


def test_deaths_restart_in_place_then_reschedule_on_the_same_pool(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    node = _start(cluster, namespace, node_pool, inPlaceRestarts=1)["node"]
    _renew(cluster, namespace, "Dead", 100, 90)
    status = eventually(
        lambda: (s := _status(cluster, namespace)).get("inPlaceRestarts") == 1 and s, 10, "restart"
    )
    assert status["lastFailure"]["cause"] == "Dead" and status["restarts"] == 1
    assert _pods(cluster, namespace) == {"minimal-1": node}  # in place: the same pod
    # The supervisor restarted the trainer; the agent reports it healthy, then dead again.
    _renew(cluster, namespace, "Healthy", 150, 140)
    eventually(lambda: _status(cluster, namespace).get("verdict") == "Healthy", 15, "Healthy")
    _renew(cluster, namespace, "Dead", 400, 390)
    eventually(lambda: "minimal-2" in _pods(cluster, namespace), 30, "attempt 2")
    status = _status(cluster, namespace)
    assert (status["restarts"], status["inPlaceRestarts"]) == (2, 0)
    assert not status.get("excludedNodes")  # a software failure keeps the node
    assert not any(t["key"] == "trainguard.dev/unhealthy" for t in _taints(cluster, node))


def test_a_repeated_failure_at_the_same_step_stops_the_run(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    _start(cluster, namespace, node_pool, sameStepWindow=10, onRepeatedFailure="Stop")
    _renew(cluster, namespace, "Dead", 100, 90)
    eventually(lambda: _status(cluster, namespace).get("inPlaceRestarts") == 1, 10, "restart")
    _renew(cluster, namespace, "Healthy", 101, 90)
    eventually(lambda: _status(cluster, namespace).get("verdict") == "Healthy", 15, "Healthy")
    _renew(cluster, namespace, "Dead", 105, 90)
    run = eventually(
        lambda: (
            (r := get_json(cluster, "trainingrun", "minimal", "-n", namespace))["status"].get(
                "phase"
            )
            == "Failed"
            and r
        ),
        15,
        "Failed",
    )
    repeated = condition(run, "RepeatedFailureAtStep")
    assert repeated is not None and repeated["status"] == "True"
    failed = condition(run, "Failed")
    assert failed is not None and failed["reason"] == "RepeatedFailureAtStep"
    eventually(lambda: not _pods(cluster, namespace), 30, "the pod to be deleted")
    time.sleep(4)  # a resync later, still no new attempt
    assert not _pods(cluster, namespace)


def _run(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return get_json(cluster, "trainingrun", "minimal", "-n", namespace)


def test_a_repeated_failure_with_continue_trains_on_and_keeps_the_condition(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    _start(cluster, namespace, node_pool, sameStepWindow=10, onRepeatedFailure="Continue")
    _renew(cluster, namespace, "Dead", 100, 90)
    eventually(lambda: _status(cluster, namespace).get("inPlaceRestarts") == 1, 10, "restart")
    _renew(cluster, namespace, "Healthy", 101, 90)
    eventually(lambda: _status(cluster, namespace).get("verdict") == "Healthy", 15, "Healthy")
    _renew(cluster, namespace, "Dead", 105, 90)
    run = eventually(
        lambda: (r := _run(cluster, namespace))["status"].get("inPlaceRestarts") == 2 and r,
        15,
        "a second restart in place",
    )
    repeated = condition(run, "RepeatedFailureAtStep")
    assert repeated is not None and repeated["status"] == "True", repeated
    failed = condition(run, "Failed")
    assert failed is not None and failed["status"] == "False", failed
    # The restarted trainer reports healthy: the run trains on, Ready, in the same pod, and the
    # pattern stays on record (the Argo CD check reads it as Degraded).
    _renew(cluster, namespace, "Healthy", 106, 90)
    run = eventually(
        lambda: (r := _run(cluster, namespace))["status"].get("verdict") == "Healthy" and r,
        15,
        "Healthy again",
    )
    assert run["status"]["phase"] == "Running"
    ready = condition(run, "Ready")
    assert ready is not None and ready["status"] == "True", ready
    assert condition(run, "RepeatedFailureAtStep") == repeated
    assert _pods(cluster, namespace) == {"minimal-1": run["status"]["node"]}

    # A changed spec (the fix a person deploys) is a new attempt; the condition stays as set,
    # for the generation it was set for.
    patch = {"spec": {"trainer": {"args": ["--lr", "1e-4"]}}}
    cluster.kubectl(
        "patch", "trainingrun", "minimal", "-n", namespace, "--type=merge",
        "-p", json.dumps(patch),
    )  # fmt: skip
    run = eventually(
        lambda: (
            (r := _run(cluster, namespace))["status"].get("attempt") == 2
            and r["status"].get("phase") == "Running"
            and r
        ),
        60,
        "attempt 2 Running",
    )
    generation = run["metadata"]["generation"]
    assert run["status"]["observedGeneration"] == generation
    kept = condition(run, "RepeatedFailureAtStep")
    assert kept is not None and kept["status"] == "True", kept
    assert kept["observedGeneration"] < generation, (kept, generation)


def test_failures_without_progress_beyond_max_restarts_fail_the_run(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    _start(cluster, namespace, node_pool, inPlaceRestarts=1, maxRestarts=1)
    _renew(cluster, namespace, "Dead", 100, 90)
    eventually(lambda: _status(cluster, namespace).get("inPlaceRestarts") == 1, 10, "restart")
    _renew(cluster, namespace, "Healthy", 150, 90)
    eventually(lambda: _status(cluster, namespace).get("verdict") == "Healthy", 15, "Healthy")
    # Dead again, far from the first step, with no newer verified checkpoint: no progress.
    _renew(cluster, namespace, "Dead", 400, 90)
    run = eventually(
        lambda: (r := _run(cluster, namespace))["status"].get("phase") == "Failed" and r,
        15,
        "Failed",
    )
    failed = condition(run, "Failed")
    assert failed is not None and failed["status"] == "True", failed
    assert failed["reason"] == "MaxRestartsExceeded", failed
    assert condition(run, "RepeatedFailureAtStep") is None  # steps far apart: no pattern
    assert run["status"]["restarts"] == 1
    eventually(lambda: not _pods(cluster, namespace), 30, "the pod to be deleted")


def test_a_failed_preflight_excludes_the_node(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    sick = _start(cluster, namespace, node_pool)["node"]
    # The kubelet's report of a preflight that found the node's storage corrupt (exit 10).
    message = json.dumps({"reason": "storage corrupt: read-back mismatch"})
    failed = {
        "phase": "Failed",
        "initContainerStatuses": [
            {
                "name": "preflight", "image": "trainguard:e2e", "imageID": "", "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 10, "reason": "Error", "message": message}},
            }
        ],
    }  # fmt: skip
    cluster.kubectl(
        "patch", "pod", "minimal-1", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": failed}),
    )  # fmt: skip
    eventually(lambda: "minimal-2" in _pods(cluster, namespace), 30, "attempt 2")
    status = _status(cluster, namespace)
    assert [(n["node"], n["reason"]) for n in status["excludedNodes"]] == [
        (sick, "PreflightFailed")
    ]
    assert "storage corrupt" in status["lastFailure"]["message"]


def _pod_of_next_attempt(pod: dict[str, Any], attempt: int) -> dict[str, Any]:
    """The pod the operator would create for `attempt`: the current one's, renamed."""
    meta = pod["metadata"]
    name = f"minimal-{attempt}"
    labels = {**meta["labels"], "trainguard.dev/attempt": str(attempt)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": meta.get("annotations") or {},
            "ownerReferences": meta["ownerReferences"],
        },
        "spec": pod["spec"],
    }


def test_a_failed_pod_the_status_does_not_record_yet_reads_recovering(
    cluster: Cluster,
    namespace: str,
    node_pool: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    """Degraded=True (PodFailed, phase Recovering), then the ladder's restart of it.

    The scene of an operator stopped between creating attempt 2's pod and writing the status:
    attempt 1's pod is gone, attempt 2's pod exists and has failed, the status still says
    attempt 1. The operator started again reports the failed pod as it finds it, then climbs
    the ladder for it in the next cycle.
    """
    _start(cluster, namespace, node_pool)
    operator.stop()
    current = get_json(cluster, "pod", "minimal-1", "-n", namespace)
    cluster.kubectl("delete", "pod", "minimal-1", "-n", namespace, "--grace-period=0", "--force")
    apply(cluster, namespace, _pod_of_next_attempt(current, 2))
    eventually(
        lambda: (
            get_json(cluster, "pod", "minimal-2", "-n", namespace)["status"].get("phase")
            == "Running"
        ),
        30,
        "attempt 2's pod to run on its kwok node",
    )
    failed = {"phase": "Failed", "reason": "Error", "message": "simulated failure of attempt 2"}
    cluster.kubectl(
        "patch", "pod", "minimal-2", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": failed}),
    )  # fmt: skip
    assert _status(cluster, namespace)["attempt"] == 1
    recorder = StatusRecorder(watch_command(_kubectl(cluster)), tmp_path / "statuses")
    recorder.start()
    try:
        operator.start()
        eventually(lambda: "minimal-3" in _pods(cluster, namespace), 60, "attempt 3")
    finally:
        recorder.stop()
    seen = [
        r.obj["status"]
        for r in read_recorded(tmp_path / "statuses")
        if r.obj["metadata"]["namespace"] == namespace
    ]
    recovering = next((s for s in seen if s.get("phase") == "Recovering"), None)
    assert recovering is not None, [s.get("phase") for s in seen]
    degraded = condition({"status": recovering}, "Degraded")
    assert degraded is not None and (degraded["status"], degraded["reason"]) == (
        "True",
        "PodFailed",
    )
    assert recovering["attempt"] == 2
    status = _status(cluster, namespace)
    assert status["lastFailure"]["cause"] == "PodFailed"
    assert status["lastFailure"]["attempt"] == 2
    assert "simulated failure of attempt 2" in status["lastFailure"]["message"]
