"""Node health: the taint policy, node checks and remediation (pure parts and one node's story).

The story runs `report_node` and `check_node` against an in-memory API that applies merge
patches as the apiserver does; the e2e tier (tests/e2e/test_node_health.py) runs the same on
process-backed nodes with the real apiserver and check pods that really run.
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from trainguard.api.constants import LABEL_NODE_HEALTH, TAINT_UNHEALTHY
from trainguard.operator.build.nodecheck import check_pod, check_pod_name
from trainguard.operator.k8s.client import KubeError
from trainguard.operator.k8s.nodehealth import NodeChecks, check_node, record_of, report_node
from trainguard.operator.policies.nodehealth import (
    CHECK_TIMEOUT_SECONDS,
    NOT_RUN_RETRY_SECONDS,
    Action,
    CheckResult,
    Health,
    NodeRecord,
    Outcome,
    TaintPolicy,
    after_check,
    check_due,
    judge,
    on_report,
    recheck_delay,
)

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
NODE = "gpu-a"
CHECKS = NodeChecks(TaintPolicy.CONFIRMED, "trainguard-system", "tg:1", 60.0)


@pytest.mark.parametrize(
    ("policy", "cause", "expected"),
    [
        (TaintPolicy.CONFIRMED, "GhostMemory", Health.SUSPECT),
        (TaintPolicy.CONFIRMED, "IOStuck", Health.SUSPECT),
        (TaintPolicy.CONFIRMED, "PreflightFailed", Health.SUSPECT),
        # The control plane's own evidence: no tenant can forge a NotReady node.
        (TaintPolicy.CONFIRMED, "NodeLost", Health.UNHEALTHY),
        (TaintPolicy.CONFIRMED, "LeaseExpired", Health.UNHEALTHY),
        (TaintPolicy.IMMEDIATE, "GhostMemory", Health.UNHEALTHY),
        (TaintPolicy.NEVER, "GhostMemory", None),
        (TaintPolicy.NEVER, "NodeLost", None),
    ],
)
def test_the_policy_decides_what_a_report_does(
    policy: TaintPolicy, cause: str, expected: Health | None
) -> None:
    assert on_report(policy, cause) is expected


def pod_status(phase: str, exit_code: int | None = None, message: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if exit_code is not None:
        terminated = {"exitCode": exit_code, "message": message}
        status["containerStatuses"] = [{"state": {"terminated": terminated}}]
    return {"status": status}


def test_judge_reads_the_check_pods_end() -> None:
    started = NOW - timedelta(seconds=5)
    assert judge(pod_status("Succeeded", 0, "ok"), NOW, started) == CheckResult(
        Outcome.PASSED, "ok"
    )
    held = pod_status("Failed", 12, "gpu: GPU 0: 1024 of 81920 MiB already used")
    assert judge(held, NOW, started).outcome is Outcome.FAILED
    assert "1024" in judge(held, NOW, started).message
    # Refused by the kubelet (its GPUs still held), or the program broke: says nothing.
    refused = {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"}}
    assert judge(refused, NOW, started).outcome is Outcome.NOT_RUN
    assert judge(pod_status("Failed", 2, "usage"), NOW, started).outcome is Outcome.NOT_RUN
    assert judge(pod_status("Pending"), NOW, started).outcome is Outcome.RUNNING
    late = NOW - timedelta(seconds=CHECK_TIMEOUT_SECONDS + 1)
    assert judge(pod_status("Pending"), NOW, late).outcome is Outcome.NOT_RUN


def record(**changes: Any) -> NodeRecord:
    base = NodeRecord(
        health=Health.UNHEALTHY,
        ready=True,
        boot_id="boot-1",
        ready_since=NOW - timedelta(hours=1),
        last_check=NOW - timedelta(seconds=30),
        last_outcome=Outcome.FAILED,
        checked_boot_id="boot-1",
        failed_checks=1,
    )
    return dataclasses.replace(base, **changes)


def test_rechecks_back_off_and_come_at_once_after_a_reboot_or_ready() -> None:
    assert not check_due(record(), NOW, 60)
    assert check_due(record(last_check=NOW - timedelta(seconds=61)), NOW, 60)
    # Doubling per failed check, capped.
    assert recheck_delay(record(failed_checks=3), 60) == 240
    assert recheck_delay(record(failed_checks=30), 60) == 1800
    # A check that did not run is tried again soon.
    assert recheck_delay(record(last_outcome=Outcome.NOT_RUN), 60) == NOT_RUN_RETRY_SECONDS
    assert check_due(record(boot_id="boot-2"), NOW, 60)  # rebooted
    assert check_due(record(ready_since=NOW - timedelta(seconds=5)), NOW, 60)  # Ready again
    assert not check_due(record(ready=False, last_check=None), NOW, 60)  # cannot run there
    assert check_due(record(last_check=None, health=Health.SUSPECT), NOW, 60)


def test_after_a_check() -> None:
    passed, failed = CheckResult(Outcome.PASSED, ""), CheckResult(Outcome.FAILED, "")
    not_run = CheckResult(Outcome.NOT_RUN, "")
    assert after_check(Health.SUSPECT, failed) is Action.TAINT
    assert after_check(Health.SUSPECT, passed) is Action.CLEAR
    assert after_check(Health.UNHEALTHY, passed) is Action.UNTAINT
    assert after_check(Health.UNHEALTHY, failed) is Action.KEEP
    assert after_check(Health.SUSPECT, not_run) is Action.KEEP
    assert after_check(Health.UNHEALTHY, not_run) is Action.KEEP


def test_the_check_pod_runs_preflight_on_every_gpu_of_its_node_restricted() -> None:
    pod = check_pod(NODE, "trainguard-system", "tg:1", 8, 512)
    spec = pod["spec"]
    assert spec["nodeName"] == NODE and spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["tolerations"] == [{"operator": "Exists"}]  # it must run on a tainted node
    (container,) = spec["containers"]
    assert container["command"][:2] == ["trainguard", "preflight"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["metadata"]["namespace"] == "trainguard-system"
    assert "nvidia.com/gpu" not in str(check_pod(NODE, "ns", "tg:1", 0, 512))
    long = "n" * 200
    assert len(check_pod_name(long)) <= 63 and check_pod_name(long) != check_pod_name(long + "x")


class NodeApi:
    """Nodes, check pods and Events by path; merge patches applied as the apiserver does."""

    def __init__(self) -> None:
        node = {
            "metadata": {"name": NODE, "resourceVersion": "1", "labels": {}, "annotations": {}},
            "spec": {},
            "status": {
                "allocatable": {"nvidia.com/gpu": "2"},
                "nodeInfo": {"bootID": "boot-1"},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "lastTransitionTime": "2026-12-03T10:00:00Z",
                    }
                ],
            },
        }
        self.node = node
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = "",
    ) -> dict[str, Any]:
        if path == f"/api/v1/nodes/{NODE}" and method == "GET":
            return copy.deepcopy(self.node)
        if path == f"/api/v1/nodes/{NODE}" and method == "PATCH":
            meta = body["metadata"]
            assert meta.pop("resourceVersion") == self.node["metadata"]["resourceVersion"]
            for key in ("labels", "annotations"):
                for name, value in (meta.get(key) or {}).items():
                    if value is None:
                        self.node["metadata"][key].pop(name, None)
                    else:
                        self.node["metadata"][key][name] = value
            if "spec" in body:
                self.node["spec"]["taints"] = copy.deepcopy(body["spec"]["taints"])
            version = int(self.node["metadata"]["resourceVersion"]) + 1
            self.node["metadata"]["resourceVersion"] = str(version)
            return self.node
        if path.endswith("/events"):
            self.events.append(body)
            return body
        if "/pods" in path:
            name = path.rsplit("/", 1)[-1]
            if method == "POST":
                self.pods[body["metadata"]["name"]] = copy.deepcopy(body)
                return body
            if method == "DELETE":
                self.pods.pop(name, None)
                return {}
            if method == "GET" and name in self.pods:
                return self.pods[name]
            raise KubeError(404, "NotFound", name)
        raise AssertionError(f"unexpected {method} {path}")

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", path)
        except KubeError:
            return None

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.events]

    def taints(self) -> list[dict[str, Any]]:
        return list(self.node["spec"].get("taints") or [])

    def end_check(self, phase: str, exit_code: int, message: str) -> None:
        (pod,) = self.pods.values()
        pod.update(pod_status(phase, exit_code, message))
        pod["metadata"]["creationTimestamp"] = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_reported_node_is_tainted_only_when_its_check_fails_then_untainted() -> None:
    api = NodeApi()
    health = report_node(api, CHECKS, NODE, "GhostMemory", "run team-a/llm (attempt 1)", NOW)  # type: ignore[arg-type]
    assert health is Health.SUSPECT
    assert api.node["metadata"]["labels"] == {LABEL_NODE_HEALTH: "suspect"}
    assert api.taints() == [] and api.reasons() == ["NodeSuspected"]
    # The check pod is started on the node, with its two GPUs.
    check_node(api, CHECKS, copy.deepcopy(api.node), NOW)  # type: ignore[arg-type]
    (pod,) = api.pods.values()
    assert pod["spec"]["nodeName"] == NODE
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    api.end_check("Failed", 12, "gpu: GPU 0 (H200): 1024 of 143771 MiB already used")
    check_node(api, CHECKS, copy.deepcopy(api.node), NOW)  # type: ignore[arg-type]
    assert api.pods == {}  # read, then removed
    assert api.taints() == [
        {"key": TAINT_UNHEALTHY, "value": "GhostMemory", "effect": "NoSchedule"}
    ]
    notes = api.node["metadata"]["annotations"]
    assert notes["trainguard.dev/unhealthy-reason"].startswith(
        "GhostMemory reported by run team-a/llm (attempt 1)"
    )
    assert notes["trainguard.dev/last-check"].startswith("failed: gpu: GPU 0 (H200): 1024")
    assert api.reasons()[-1] == "NodeTainted"
    # Not due yet; after the back-off a check runs again: still failing, still tainted.
    later = NOW + timedelta(seconds=61)
    check_node(api, CHECKS, copy.deepcopy(api.node), NOW)  # type: ignore[arg-type]
    assert api.pods == {}
    check_node(api, CHECKS, copy.deepcopy(api.node), later)  # type: ignore[arg-type]
    api.end_check("Failed", 12, "gpu: still held")
    check_node(api, CHECKS, copy.deepcopy(api.node), later)  # type: ignore[arg-type]
    assert api.taints() and api.reasons()[-1] == "NodeCheckFailed"
    assert api.node["metadata"]["annotations"]["trainguard.dev/failed-checks"] == "2"
    # Rebooted: checked at once; it passes and the taint goes.
    api.node["status"]["nodeInfo"]["bootID"] = "boot-2"
    record = record_of(api.node)
    assert record is not None and check_due(record, later, 60)
    check_node(api, CHECKS, copy.deepcopy(api.node), later)  # type: ignore[arg-type]
    api.end_check("Succeeded", 0, "gpu: 2 GPUs, 0 of 287542 MiB used")
    check_node(api, CHECKS, copy.deepcopy(api.node), later)  # type: ignore[arg-type]
    assert api.taints() == [] and api.reasons()[-1] == "NodeUntainted"
    assert LABEL_NODE_HEALTH not in api.node["metadata"]["labels"]
    assert api.node["metadata"]["annotations"]["trainguard.dev/last-check"].startswith("passed")
    assert record_of(api.node) is None  # nothing held: the pass no longer lists it


def test_a_report_the_check_does_not_confirm_taints_nothing() -> None:
    api = NodeApi()
    report_node(api, CHECKS, NODE, "IOStuck", "run team-a/llm (attempt 2)", NOW)  # type: ignore[arg-type]
    check_node(api, CHECKS, copy.deepcopy(api.node), NOW)  # type: ignore[arg-type]
    api.end_check("Succeeded", 0, "integrity l1: 64 MiB written, fsynced and read back intact")
    check_node(api, CHECKS, copy.deepcopy(api.node), NOW)  # type: ignore[arg-type]
    assert api.taints() == []
    assert api.reasons() == ["NodeSuspected", "NodeCheckPassed"]
    assert "not confirmed" in api.events[-1]["message"]


def test_immediate_and_never() -> None:
    api = NodeApi()
    immediate = NodeChecks(TaintPolicy.IMMEDIATE, "ns", "tg:1")
    report_node(api, immediate, NODE, "GhostMemory", "run a/b (attempt 1)", NOW)  # type: ignore[arg-type]
    assert api.taints()[0]["value"] == "GhostMemory"
    assert api.node["metadata"]["labels"] == {LABEL_NODE_HEALTH: "unhealthy"}
    quiet = NodeApi()
    never = NodeChecks(TaintPolicy.NEVER, "ns", "tg:1")
    assert report_node(quiet, never, NODE, "GhostMemory", "run a/b (attempt 1)", NOW) is None  # type: ignore[arg-type]
    assert quiet.taints() == [] and quiet.events == []
