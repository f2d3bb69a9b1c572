"""Bad input ends in one clear state and one Event, with no new attempt: on real kubelet words.

The pod statuses and Events are those a real kubelet (v1.36, containerd 2) reported for a
missing Secret, a missing claim, an init step that failed and an image that cannot be pulled
(as a container and as a native sidecar), recorded by `tests/realnodes/record_pod_statuses.py`
in `recorded/kubelet-pod-statuses.json`. Each is grafted onto the run's pod (the recorded
container `main` plays the trainer) and goes through whole reconcile cycles.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from run_factory import NAMESPACE
from test_reconcile_cycle import FakeApi, api_with_run, cycle

from trainguard.api.constants import Reason
from trainguard.initsteps.stage_data import ExitCode
from trainguard.operator.build.constants import Container
from trainguard.operator.k8s.pods import pod_view
from trainguard.operator.policies.inputs import STAGING_SOURCE_EXITS
from trainguard.operator.policies.lifecycle import PodView

pytestmark = pytest.mark.unit

RECORDED = json.loads(
    (Path(__file__).parent / "recorded" / "kubelet-pod-statuses.json").read_text()
)
POD_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods/llm-1"
NODE = "real-node-0"
SECRET = "nosuch"
CLAIM = "nosuch"
S3_LAYER = {"name": "s3", "uri": "s3://bucket/llm", "credentialsSecret": {"name": SECRET}}
DATA_CLAIM = {"source": {"pvc": {"claimName": CLAIM}}, "size": "1Gi"}


class KubeletApi(FakeApi):
    """The fake apiserver, also answering a list of a pod's Events from the recorded ones."""

    def __init__(self, base: FakeApi, recorded_events: list[dict[str, Any]]) -> None:
        super().__init__(base.objects, base.events)
        self.recorded_events = recorded_events
        self.event_lists = 0

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = "",
    ) -> dict[str, Any]:
        if method == "GET" and path == f"/api/v1/namespaces/{NAMESPACE}/events":
            self.event_lists += 1
            selector = (query or {})["fieldSelector"]
            assert "involvedObject.name=llm-1" in selector, selector
            reason = selector.rsplit("reason=", 1)[1]
            return {"items": [e for e in self.recorded_events if e["reason"] == reason]}
        return super().request(method, path, body, query, content_type)


def recorded(case: str, renamed: dict[str, str] | None = None) -> dict[str, Any]:
    """The recorded status of a case, its containers renamed to the run's."""
    status = copy.deepcopy(RECORDED[case]["status"])
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            container["name"] = (renamed or {}).get(container["name"], container["name"])
    return status


def kubelet_reports(api: FakeApi, status: dict[str, Any], scheduled: bool = True) -> None:
    """The run's pod as the scheduler and kubelet left it (on a Ready node)."""
    pod = api.objects[POD_PATH]
    if scheduled:
        pod["spec"]["nodeName"] = NODE
        ready = {"conditions": [{"type": "Ready", "status": "True"}]}
        api.objects[f"/api/v1/nodes/{NODE}"] = {"metadata": {"name": NODE}, "status": ready}
    pod["status"] = status


def condition(api: FakeApi, kind: str) -> dict[str, Any]:
    return next(c for c in api.run()["status"]["conditions"] if c["type"] == kind)


def warnings(api: FakeApi) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in api.events if e["type"] == "Warning"]


def cycles(api: FakeApi, n: int = 4) -> None:
    for _ in range(n):  # resyncs and pod events: the same words seen again
        cycle(api, full=False)


def assert_one_state(api: FakeApi, reason: Reason, *named: str) -> str:
    """The run holds `reason` with a message naming `named`, told once, on attempt 1 only."""
    progressing = condition(api, "Progressing")
    assert progressing["reason"] == reason, progressing
    assert all(n in progressing["message"] for n in named), progressing["message"]
    told = [m for r, m in warnings(api) if r == reason]
    assert len(told) == 1, api.events
    assert all(n in told[0] for n in named), told
    assert [p["metadata"]["name"] for p in api.pods()] == ["llm-1"]
    status = api.run()["status"]
    assert (status["attempt"], status["restarts"]) == (1, 0)
    assert "lastFailure" not in status
    return str(progressing["message"])


def test_a_missing_secret_is_named_from_the_pods_failed_mount_events() -> None:
    api = KubeletApi(
        api_with_run(checkpoints={"remote": [S3_LAYER]}), RECORDED["missing-secret"]["events"]
    )
    cycle(api)
    kubelet_reports(api, recorded("missing-secret", {"main": Container.TRAINER}))
    cycles(api)
    message = assert_one_state(api, Reason.SECRET_NOT_FOUND, SECRET, "remote layer s3", NAMESPACE)
    assert "starts once it exists" in message
    assert condition(api, "Progressing")["status"] == "False"
    assert api.run()["status"]["phase"] == "Pending"
    assert api.event_lists == 4  # one list per cycle, only while the volumes wait
    # The Secret created: the kubelet mounts it and starts the pod, which goes on as it is.
    running = recorded("missing-secret", {"main": Container.TRAINER})
    for kind in running["conditions"]:
        kind["status"] = "True"
    running["containerStatuses"][0]["state"] = {"running": {}}
    running["phase"] = "Running"
    kubelet_reports(api, running)
    cycles(api, 2)
    assert condition(api, "Progressing")["reason"] == Reason.TRAINING
    assert api.event_lists == 4
    assert [p["metadata"]["name"] for p in api.pods()] == ["llm-1"]


def test_a_missing_data_source_secret_is_named_with_its_use() -> None:
    source = {"uri": "s3://bucket/shards", "credentialsSecret": {"name": SECRET}}
    api = KubeletApi(
        api_with_run(data={"source": source, "size": "1Gi"}),
        RECORDED["missing-secret"]["events"],
    )
    cycle(api)
    kubelet_reports(api, recorded("missing-secret", {"main": Container.TRAINER}))
    cycles(api)
    message = assert_one_state(api, Reason.SECRET_NOT_FOUND, SECRET, "the data source")
    assert "remote layer" not in message


def test_a_missing_data_claim_is_named_with_its_use() -> None:
    api = api_with_run(data=DATA_CLAIM)
    cycle(api)
    kubelet_reports(api, recorded("missing-claim"), scheduled=False)
    cycles(api)
    message = assert_one_state(api, Reason.CLAIM_NOT_FOUND, CLAIM, "the data source")
    assert "scheduled once it exists" in message


@pytest.mark.parametrize(
    ("case", "container", "fix"),
    [
        ("missing-image", Container.TRAINER, "spec.trainer.image"),
        ("missing-image-init", Container.AGENT, "--agent-image"),
    ],
)
def test_an_image_that_cannot_be_pulled_is_named_with_the_kubelets_words(
    case: str, container: str, fix: str
) -> None:
    api = api_with_run()
    cycle(api)
    status = recorded(case, {"main": Container.TRAINER})
    kubelet_reports(api, status)
    cycles(api)
    named = ("trainguard.local/not-built:1", container, "ErrImagePull", "connection refused", fix)
    assert_one_state(api, Reason.IMAGE_PULL_FAILED, *named)
    # Back-off in between pulls: the same state, no second Event.
    waiting = next(
        c
        for key in ("initContainerStatuses", "containerStatuses")
        for c in status.get(key) or []
        if c["name"] == container
    )
    waiting["state"] = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}}
    cycles(api, 2)
    assert_one_state(api, Reason.IMAGE_PULL_FAILED, container)


def source_failure(code: int) -> dict[str, Any]:
    """The recorded failed init step, as stage-data leaves it: its code and its report."""
    status = recorded("init-fails", {"main": Container.TRAINER})
    terminated = status["initContainerStatuses"][0]["state"]["terminated"]
    terminated["exitCode"] = code
    terminated["message"] = json.dumps(
        {"attempt": 1, "phase": "Failed", "message": "cannot list s3://shards/: connection refused"}
    )
    return status


def test_a_data_source_stage_data_cannot_read_fails_the_run_without_new_attempts() -> None:
    api = api_with_run(data={"source": {"uri": "s3://shards/"}, "size": "1Gi"})
    cycle(api)
    kubelet_reports(api, source_failure(ExitCode.SOURCE_ERROR))
    cycles(api)
    message = assert_one_state(
        api, Reason.DATA_SOURCE_UNREACHABLE, "stage-data", "exit 5", "connection refused"
    )
    assert "delete pod llm-1" in message
    assert condition(api, "Failed")["status"] == "True"
    assert api.run()["status"]["phase"] == "Failed"
    # Retried on purpose: the failed pod deleted, the next attempt tries the source again.
    api.objects.pop(POD_PATH)
    cycle(api, full=False)
    assert [p["metadata"]["name"] for p in api.pods()] == ["llm-2"]
    assert condition(api, "Failed")["status"] == "False"


def test_a_spec_change_retries_a_run_held_by_its_data_source() -> None:
    api = api_with_run(data={"source": {"uri": "s3://shards/"}, "size": "1Gi"})
    cycle(api)
    kubelet_reports(api, source_failure(ExitCode.SOURCE_HUNG))
    cycles(api)
    api.run()["spec"]["data"]["source"]["uri"] = "s3://shards-fixed/"
    api.run()["metadata"]["generation"] = 2
    cycles(api, 2)
    assert [p["metadata"]["name"] for p in api.pods()] == ["llm-2"]
    assert condition(api, "Failed")["status"] == "False"


def test_a_failed_init_step_that_may_be_the_nodes_fault_stays_with_the_ladder() -> None:
    # Exit 3 as recorded (no termination message): not the source's fault for sure.
    api = api_with_run(recovery={"backoff": {"initialSeconds": 0}})
    cycle(api)
    kubelet_reports(api, recorded("init-fails", {"main": Container.TRAINER}))
    cycle(api, full=False)
    status = api.run()["status"]
    assert status["lastFailure"]["cause"] == Reason.POD_FAILED
    assert status["lastFailure"]["message"] == "init step stage-data exited 3 (Error)"


def test_the_source_exit_codes_are_stage_datas() -> None:
    assert {ExitCode.SOURCE_HUNG, ExitCode.SOURCE_ERROR} == STAGING_SOURCE_EXITS


def view(status: dict[str, Any]) -> PodView | None:
    """The operator's view of the run's pod on a node, with this status."""
    labels = {"trainguard.dev/attempt": "1"}
    body = {"metadata": {"name": "llm-1", "labels": labels}, "spec": {"nodeName": NODE}}
    return pod_view({**body, "status": status})


def test_what_the_operator_reads_of_pods_that_cannot_start() -> None:
    image = view(recorded("missing-image-init", {"main": Container.TRAINER}))
    assert image is not None and not image.volumes_pending
    assert [(w.container, w.reason) for w in image.waiting] == [("agent", "ErrImagePull")]
    secret = view(recorded("missing-secret"))
    assert secret is not None and secret.volumes_pending and secret.waiting == ()
