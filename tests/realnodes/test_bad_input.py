"""Bad input on real nodes: one clear condition and one Event, within a bound, no new attempt.

The chart's operator (resync every 5 s, see `install_chart`) runs the reference trainer's
run with one input wrong: a trainer image no node holds (every registry of a real node is a
closed port, so the pull fails at once), a remote layer's credentials Secret that does not
exist, a data claim that does not exist. Each run must say what it lacks, by name, in its
`Progressing` condition and in exactly one Warning Event, and must not start a second
attempt while the input stays missing. A Secret created afterwards lets the run start: the
kubelet mounts it on its next try, with no new attempt and no manual deletion.
The unit tests replay the kubelet's words recorded by `record_pod_statuses.py` beside this.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from realnodes.conftest import (
    REAL_NODE_SELECTOR,
    RUNS_NAMESPACE,
    Trainguard,
    apply_in_runs,
    kubectl_json,
    run_pods,
    run_status,
)
from trainguard.api.constants import (
    SECRET_KEY_S3_ACCESS_KEY_ID,
    SECRET_KEY_S3_ENDPOINT_URL,
    SECRET_KEY_S3_SECRET_ACCESS_KEY,
    Reason,
)
from trainguard.operator.build.constants import OperatorReason
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.runs import (
    REFERENCE_MIN_STEP_SECONDS,
    REFERENCE_PARAMETERS,
    REFERENCE_STEPS,
    reference_command,
    training_run,
)
from trainguard_dev.testing.servers import S3_ACCESS_KEY, S3_SECRET_KEY, SeaweedFS

# Only the test itself is timed: the session's real nodes, images and chart come from the
# first test's fixtures (minutes on a fresh cache), whose every step is bounded on its own.
pytestmark = [pytest.mark.realnodes, pytest.mark.timeout(300, func_only=True)]

NOT_BUILT = "trainguard.local/not-built:1"
ABSENT_CLAIM = "absent-shards"
# Seconds from the kubelet's (or scheduler's) report to the run's condition: a pod event
# starts a cycle at once; a FailedMount Event starts none, so up to one resync (5 s) after it.
# The bounds below add the pod's creation and its init steps before the trainer's pull.
CLAIM_BOUND = 30
SECRET_BOUND = 45
IMAGE_BOUND = 120
# Long enough for many resyncs and kubelet retries: the Event stays single, no attempt 2.
SETTLE_SECONDS = 30
# The kubelet retries a failed mount with a back-off doubling up to about 2 minutes.
SECRET_FIXED_BOUND = 180


def _warnings(cluster: Cluster, name: str, reason: str) -> list[dict[str, Any]]:
    listed = kubectl_json(
        cluster, "get", "events", "-n", RUNS_NAMESPACE,
        "--field-selector",
        f"involvedObject.kind=TrainingRun,involvedObject.name={name},reason={reason}",
    )  # fmt: skip
    return [e for e in listed["items"] if e.get("type") == "Warning"]


def _progressing(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Progressing"), {})


def _run(trainguard: Trainguard, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The reference trainer on the real nodes, without data unless `spec` adds some."""
    base = {
        "trainer": {
            "image": trainguard.trainer_image.ref,
            "command": reference_command(REFERENCE_STEPS, REFERENCE_MIN_STEP_SECONDS),
        },
        "model": {"parameters": REFERENCE_PARAMETERS},
        "placement": {"nodeSelector": dict(REAL_NODE_SELECTOR)},
    }
    return training_run(name, spec, namespace=RUNS_NAMESPACE, base=base)


def _held(cluster: Cluster, name: str, reason: Reason, named: str, bound: float) -> str:
    """The run's message once it holds `reason` naming `named` (within `bound` s).

    Then, after a while, it still holds it, told by one Warning Event, with one attempt.
    """
    started = time.monotonic()

    def holds() -> str | None:
        condition = _progressing(run_status(cluster, name))
        if condition.get("reason") == reason and named in condition.get("message", ""):
            return str(condition["message"])
        return None

    message = eventually(
        holds, timeout=bound, what=f"{reason} naming {named}",
        detail=lambda: json.dumps(run_status(cluster, name))[:2000],
    )  # fmt: skip
    print(f"{reason} after {time.monotonic() - started:.1f} s: {message}")
    time.sleep(SETTLE_SECONDS)
    status = run_status(cluster, name)
    assert _progressing(status).get("reason") == reason, status
    assert (status.get("attempt"), status.get("restarts", 0)) == (1, 0), status
    assert "lastFailure" not in status, status
    told = _warnings(cluster, name, reason)
    assert len(told) == 1 and told[0].get("count", 1) == 1, json.dumps(told, indent=1)
    assert named in told[0]["message"]
    assert [p["metadata"]["name"] for p in run_pods(cluster, name)] == [f"{name}-1"]
    return message


def test_a_trainer_image_no_node_holds_is_named_and_not_retried_by_new_attempts(
    trainguard: Trainguard, run_name: str
) -> None:
    cluster = trainguard.cluster
    apply_in_runs(cluster, _run(trainguard, run_name, {"trainer": {"image": NOT_BUILT}}))
    message = _held(cluster, run_name, Reason.IMAGE_PULL_FAILED, NOT_BUILT, IMAGE_BOUND)
    assert "container trainer" in message and "spec.trainer.image" in message


def test_a_missing_data_claim_is_named_and_the_pod_waits_unscheduled(
    trainguard: Trainguard, run_name: str
) -> None:
    cluster = trainguard.cluster
    data = {"source": {"pvc": {"claimName": ABSENT_CLAIM}}, "size": "10Mi"}
    apply_in_runs(cluster, _run(trainguard, run_name, {"data": data}))
    message = _held(cluster, run_name, Reason.CLAIM_NOT_FOUND, ABSENT_CLAIM, CLAIM_BOUND)
    assert "the data source" in message
    (pod,) = run_pods(cluster, run_name)
    assert not pod["spec"].get("nodeName"), pod["status"]


def test_a_missing_secret_is_named_and_creating_it_lets_the_run_start(
    trainguard: Trainguard, real_s3: SeaweedFS, run_name: str
) -> None:
    cluster = trainguard.cluster
    bucket = f"tg-{uuid.uuid4().hex[:12]}"
    real_s3.client().create_bucket(Bucket=bucket)
    secret = f"{run_name}-credentials"
    layer = {
        "name": "s3",
        "uri": f"s3://{bucket}/{run_name}",
        "credentialsSecret": {"name": secret},
    }
    apply_in_runs(cluster, _run(trainguard, run_name, {"checkpoints": {"remote": [layer]}}))
    message = _held(cluster, run_name, Reason.SECRET_NOT_FOUND, secret, SECRET_BOUND)
    assert "remote layer s3" in message
    apply_in_runs(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret, "namespace": RUNS_NAMESPACE},
            "stringData": {
                SECRET_KEY_S3_ACCESS_KEY_ID: S3_ACCESS_KEY,
                SECRET_KEY_S3_SECRET_ACCESS_KEY: S3_SECRET_KEY,
                SECRET_KEY_S3_ENDPOINT_URL: real_s3.endpoint,
            },
        },
    )

    def started() -> dict[str, Any] | None:
        status = run_status(cluster, run_name)
        reason = _progressing(status).get("reason")
        return status if reason in (Reason.TRAINING, OperatorReason.STARTING) else None

    status = eventually(
        started, timeout=SECRET_FIXED_BOUND, what="the run starting once the Secret exists",
        detail=lambda: json.dumps(run_status(cluster, run_name))[:2000],
    )  # fmt: skip
    assert (status.get("attempt"), status.get("restarts", 0)) == (1, 0), status
    (pod,) = run_pods(cluster, run_name)
    ready = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
    assert ready.get("PodReadyToStartContainers") == "True", pod["status"]
