"""What the operator reads from pods and PersistentVolumes (pure helpers of its k8s package)."""

from __future__ import annotations

from typing import Any

import pytest

from trainguard.operator.k8s.pods import pod_view, scheduler_message
from trainguard.operator.k8s.volumes import pv_source
from trainguard.operator.policies.lifecycle import PodView

pytestmark = pytest.mark.unit

UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient ephemeral-storage.",
}


def pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "llm-2",
            "labels": {"trainguard.dev/run": "llm", "trainguard.dev/attempt": "2"},
            "annotations": {"trainguard.dev/spec-hash": "abc"},
        },
        "spec": {},
        "status": status,
    }


def test_pending_pod() -> None:
    assert pod_view(pod()) == PodView(name="llm-2", attempt=2, spec_hash="abc")


def test_unschedulable_pod_carries_the_schedulers_message() -> None:
    view = pod_view(pod(phase="Pending", conditions=[UNSCHEDULABLE]))
    assert view is not None
    assert view.unschedulable == UNSCHEDULABLE["message"]


def test_scheduled_running_and_deleting() -> None:
    body = pod(phase="Running", conditions=[{**UNSCHEDULABLE, "status": "True", "reason": ""}])
    body["spec"]["nodeName"] = "gpu-0"
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    view = pod_view(body)
    assert view == PodView("llm-2", 2, "Running", "gpu-0", True, "abc", None)


def test_a_failed_preflight_carries_its_exit_code_and_termination_message() -> None:
    message = '{"reason":"GPU memory held: 3 GiB by pid 41"}'
    statuses = [
        {"name": "agent", "state": {"running": {}}},
        {"name": "preflight", "state": {"terminated": {"exitCode": 12, "message": message}}},
    ]
    view = pod_view(pod(phase="Failed", initContainerStatuses=statuses, message="init failed"))
    assert view is not None
    assert (view.phase, view.preflight_exit, view.message) == ("Failed", 12, message)


def test_the_steps_summaries_become_reports_and_words_of_evidence() -> None:
    preflight = (
        '{"attempt":2,"failure":"StorageCorrupt","message":"integrity l1: the disk corrupts'
        ' data","node":"gpu-a","passed":false,"readMbps":600.0,"writeMbps":80.0}'
    )
    staged = '{"attempt":2,"phase":"Complete","filesDone":3,"filesTotal":3}'
    statuses = [
        {"name": "preflight", "state": {"terminated": {"exitCode": 10, "message": preflight}}},
        {"name": "stage-data", "state": {"terminated": {"exitCode": 0, "message": staged}}},
    ]
    view = pod_view(pod(phase="Failed", initContainerStatuses=statuses))
    assert view is not None
    assert (view.preflight_report, view.staging_report) == (preflight, staged)
    assert view.message == (
        "StorageCorrupt (attempt 2 on gpu-a): integrity l1: the disk corrupts data; "
        "write 80 MB/s, read 600 MB/s"
    )


def test_a_failed_staging_is_the_evidence_of_its_pods_failure() -> None:
    passed = '{"attempt":2,"message":"all passed","passed":true}'
    failed = '{"attempt":2,"phase":"Failed","message":"shard-7: no answer within 60 s"}'
    statuses = [
        {"name": "preflight", "state": {"terminated": {"exitCode": 0, "message": passed}}},
        {"name": "stage-data", "state": {"terminated": {"exitCode": 4, "message": failed}}},
    ]
    view = pod_view(pod(phase="Failed", initContainerStatuses=statuses, message="init failed"))
    assert view is not None and view.preflight_exit == 0
    assert view.message is not None
    assert view.message.startswith("failed (attempt 2): shard-7: no answer within 60 s")


def test_a_failed_pod_without_preflight_carries_the_pods_message() -> None:
    view = pod_view(pod(phase="Failed", message="The node was low on resource"))
    assert view is not None
    assert (view.preflight_exit, view.message) == (None, "The node was low on resource")


@pytest.mark.parametrize("attempt", [None, "", "x", "0", "-1"])
def test_a_pod_without_a_valid_attempt_is_not_ours(attempt: str | None) -> None:
    body = pod()
    if attempt is None:
        del body["metadata"]["labels"]["trainguard.dev/attempt"]
    else:
        body["metadata"]["labels"]["trainguard.dev/attempt"] = attempt
    assert pod_view(body) is None


def test_scheduler_message_only_for_unschedulable() -> None:
    assert scheduler_message(pod()) is None
    other = {**UNSCHEDULABLE, "reason": "SchedulingGated"}
    assert scheduler_message(pod(conditions=[other])) is None


@pytest.mark.parametrize(
    ("spec", "found"),
    [
        ({"nfs": {"server": "nas", "path": "/x"}, "accessModes": ["ReadWriteMany"]}, ("nfs", None)),
        (
            {"capacity": {"storage": "1Gi"}, "csi": {"driver": "nfs.csi.k8s.io"}},
            ("csi", "nfs.csi.k8s.io"),
        ),
        ({"flexVolume": {"driver": "example/moosefs"}}, ("flexVolume", "example/moosefs")),
        ({"local": {"path": "/mnt/disk"}, "nodeAffinity": {}}, ("local", None)),
        ({"storageClassName": "x"}, (None, None)),
    ],
)
def test_pv_source(spec: dict[str, Any], found: tuple[str | None, str | None]) -> None:
    assert pv_source({"spec": spec}) == found
