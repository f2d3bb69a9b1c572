"""Whole reconcile cycles against an in-memory API: a crash at any request leaves one pod.

The fake apiserver keeps objects by path and applies server-side apply as "replace what
the manager sent"; that is enough to show the cycle's order of writes is crash-safe: the
operator is "killed" at the n-th request of a cycle (for every n), restarted with nothing
but what the API holds, and must converge to exactly one pod with the attempt recorded.
"""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from run_factory import NAMESPACE, UID, make_run

from trainguard.api.constants import ANNOTATION_ENV_CONFIG, Verdict
from trainguard.api.status import LayerCheckpoint
from trainguard.operator.k8s.client import METADATA_LIST, KubeError
from trainguard.operator.k8s.envconfigs import unused
from trainguard.operator.k8s.nodehealth import NodeChecks
from trainguard.operator.k8s.pods import current_pods, pod_view
from trainguard.operator.k8s.reconcile import Settings, reconcile
from trainguard.operator.policies.lifecycle import PodView
from trainguard.operator.policies.nodehealth import TaintPolicy
from trainguard.operator.policies.placement import NetworkList
from trainguard.operator.policies.signals import LeaseView

pytestmark = pytest.mark.unit

SETTINGS = Settings(
    "trainguard:test",
    NetworkList(),
    "test",
    NodeChecks(TaintPolicy.IMMEDIATE, "default", "trainguard:test"),
)
RUN_PATH = f"/apis/trainguard.dev/v1alpha1/namespaces/{NAMESPACE}/trainingruns/llm"


class Crash(BaseException):
    """The operator process dies here (nothing in the operator catches it)."""


@dataclass
class FakeApi:
    """Objects by REST path; fails (as a crash) at request number `crash_at`."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    crash_at: int | None = None
    writes: list[str] = field(default_factory=list)  # paths written (PATCH, POST), in order

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = "",
        accept: str = "application/json",
    ) -> dict[str, Any]:
        self.requests += 1
        if self.crash_at is not None and self.requests == self.crash_at:
            raise Crash()
        if path.startswith("/api/v1/nodes/"):
            if method == "PATCH":
                self.objects[path]["spec"] = copy.deepcopy(body["spec"])
            return self.objects[path]
        if method == "PATCH" and path.endswith("/status"):
            target = self.objects[path.removesuffix("/status")]
            target["status"] = copy.deepcopy(body["status"])
            return target
        if method == "PATCH":
            assert query == {"fieldManager": "trainguard", "force": "true"}
            self.writes.append(path)
            self.objects[path] = copy.deepcopy(body)
            return body
        if method == "DELETE":
            self.objects.pop(path, None)
            return {}
        if method == "GET" and path.endswith("/pods"):
            run = (query or {})["labelSelector"].removeprefix("trainguard.dev/run=")
            items = [p for p in self.pods() if p["metadata"]["labels"]["trainguard.dev/run"] == run]
            if accept == METADATA_LIST:  # as the apiserver answers: each pod's metadata only
                items = [{"metadata": copy.deepcopy(p["metadata"])} for p in items]
            return {"items": items}
        if method == "POST" and path.endswith("/pods"):
            assert query == {"fieldManager": "trainguard"}
            created = f"{path}/{body['metadata']['name']}"
            self.writes.append(created)
            if created in self.objects:
                raise KubeError(409, "Conflict", f"pods {body['metadata']['name']} exists")
            self.objects[created] = copy.deepcopy(body)
            return body
        if method == "POST" and path.endswith("/events"):
            self.events.append(body)
            return body
        raise AssertionError(f"unexpected {method} {path}")

    def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    def pods(self) -> list[dict[str, Any]]:
        return [o for p, o in self.objects.items() if "/pods/" in p]

    def views(self) -> list[PodView]:
        return [v for v in map(pod_view, self.pods()) if v is not None]

    def run(self) -> dict[str, Any]:
        return self.objects[RUN_PATH]


def api_with_run(**spec: Any) -> FakeApi:
    api = FakeApi()
    api.objects[RUN_PATH] = make_run(spec).to_object()
    return api


def cycle(api: FakeApi, full: bool = True) -> None:
    reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, full)  # type: ignore[arg-type]


def test_a_clean_cycle_creates_the_companions_then_the_pod_then_the_status() -> None:
    api = api_with_run()
    cycle(api)
    kinds = sorted(p.split("/")[-2] for p in api.objects if p != RUN_PATH)
    assert kinds == ["configmaps", "leases", "pods", "rolebindings", "roles", "serviceaccounts"]
    assert [p["metadata"]["name"] for p in api.pods()] == ["llm-1"]
    # The pod names the env ConfigMap, which exists before it.
    config = f"/api/v1/namespaces/{NAMESPACE}/configmaps/" + env_config_of(api.pods()[0])
    assert api.objects[config]["immutable"] is True
    assert api.writes.index(config) < api.writes.index(f"/api/v1/namespaces/{NAMESPACE}/pods/llm-1")
    assert api.run()["status"]["attempt"] == 1
    assert [e["reason"] for e in api.events] == ["Scheduling"]
    assert all(e["involvedObject"]["uid"] == UID for e in api.events)


def env_config_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["annotations"][ANNOTATION_ENV_CONFIG])


def configmaps(api: FakeApi) -> list[str]:
    return sorted(p.rpartition("/")[2] for p in api.objects if "/configmaps/" in p)


def test_a_spec_change_leaves_the_new_pods_env_configmap_alone() -> None:
    api = api_with_run()
    cycle(api)
    before = configmaps(api)
    assert before == [env_config_of(api.pods()[0])]
    api.objects[RUN_PATH]["spec"]["checkpoints"]["l1"] = {"keepLast": 4}
    cycle(api)  # the outdated pod goes, and with it the ConfigMap only it named
    cycle(api)  # the new pod comes, after its own ConfigMap
    (pod,) = api.pods()
    assert pod["metadata"]["name"] == "llm-2"
    assert configmaps(api) == [env_config_of(pod)] != before


def test_a_full_cycle_puts_back_an_env_configmap_deleted_under_a_live_pod() -> None:
    api = api_with_run()
    cycle(api)
    (name,) = configmaps(api)
    del api.objects[f"/api/v1/namespaces/{NAMESPACE}/configmaps/{name}"]
    cycle(api, full=False)  # a pod event's cycle creates nothing
    assert configmaps(api) == []
    cycle(api, full=True)  # the operator's start, a spec change: drift repaired
    assert configmaps(api) == [name] == [env_config_of(p) for p in api.pods()]


def test_a_replaced_member_keeps_the_gangs_env_configmap() -> None:
    api = api_with_run(trainer={"nodes": 3})
    cycle(api)
    names = {env_config_of(p) for p in api.pods()}
    assert len(names) == 1 and configmaps(api) == sorted(names)
    del api.objects[f"/api/v1/namespaces/{NAMESPACE}/pods/llm-1-1"]
    cycle(api)
    assert sorted(p["metadata"]["name"] for p in api.pods()) == ["llm-1-0", "llm-1-1", "llm-1-2"]
    assert configmaps(api) == sorted(names)


def test_an_env_configmap_goes_only_when_no_live_pod_names_it() -> None:
    def pod(name: str, config: str | None, deleting: bool = False) -> PodView:
        return PodView(name=name, attempt=1, env_config=config, deleting=deleting)

    old, member, going = pod("a", "env-old"), pod("b", "env-new"), pod("c", "env-gone", True)
    # The cycle deletes `a`; `b` stays; `c` is already being deleted.
    assert unused([old, member, going], [member, going], "env-new") == ["env-gone", "env-old"]
    # A member replaced in its attempt: the gang's other members still name its ConfigMap.
    assert unused([pod("a", "env-new"), member], [member], "env-new") == []
    # The current one stays even when no pod names it yet; pods from before env ConfigMaps
    # name none.
    assert unused([pod("a", None)], [], "env-new") == []


def test_a_crash_at_any_request_still_ends_with_exactly_one_pod() -> None:
    clean = api_with_run()
    cycle(clean)
    for crash_at in range(1, clean.requests + 1):
        api = api_with_run()
        api.crash_at = crash_at
        with pytest.raises(Crash):
            cycle(api)
        api.crash_at = None
        for _ in range(3):  # the restarted operator's resume, then pod events
            cycle(api)
        assert [p["metadata"]["name"] for p in api.pods()] == ["llm-1"], crash_at
        assert api.run()["status"]["attempt"] == 1, crash_at


def test_a_crash_while_moving_to_the_next_attempt_never_doubles_it() -> None:
    for crash_at in range(1, 10):
        api = api_with_run()
        cycle(api)
        api.objects = {p: o for p, o in api.objects.items() if "/pods/" not in p}  # pod lost
        api.requests, api.crash_at = 0, crash_at
        with contextlib.suppress(Crash):
            cycle(api, full=False)
        api.crash_at = None
        for _ in range(3):
            cycle(api)
        assert [p["metadata"]["name"] for p in api.pods()] == ["llm-2"], crash_at
        status = api.run()["status"]
        assert status["attempt"] == 2, crash_at


def test_suspend_then_resume_moves_to_the_next_attempt() -> None:
    api = api_with_run()
    cycle(api)
    api.run()["spec"]["suspend"] = True
    cycle(api)
    assert api.pods() == []
    assert api.run()["status"]["phase"] == "Suspended"
    api.run()["spec"]["suspend"] = False
    cycle(api)
    assert [p["metadata"]["name"] for p in api.pods()] == ["llm-2"]
    assert api.run()["status"]["restarts"] == 0
    reasons = [e["reason"] for e in api.events]
    assert reasons == ["Scheduling", "Suspended", "Scheduling", "AttemptFenced"]


def test_an_invalid_spec_is_reported_not_acted_on() -> None:
    api = api_with_run()
    api.run()["spec"]["trainer"]["command"] = []
    outcome = reconcile(api, copy.deepcopy(api.run()), [], SETTINGS, True)  # type: ignore[arg-type]
    assert outcome.invalid is not None and "command" in outcome.invalid
    assert api.pods() == []
    status = api.run()["status"]
    assert status["phase"] == "Failed"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "InvalidSpec")


def test_a_lagging_watch_never_makes_the_operator_move_to_the_next_attempt() -> None:
    # The status says attempt 1 was created, but the watch has not delivered its pod yet:
    # the operator must find the pod with the apiserver rather than create attempt 2.
    api = api_with_run()
    cycle(api)
    for _ in range(3):
        outcome = reconcile(api, copy.deepcopy(api.run()), [], SETTINGS, False)  # type: ignore[arg-type]
        assert outcome.status.attempt == 1
    assert [p["metadata"]["name"] for p in api.pods()] == ["llm-1"]


def test_the_lease_signals_reach_the_status_and_stay_without_a_lease() -> None:
    api = api_with_run()
    signals = LeaseView(Verdict.DEAD, step=120, saved_step=100, holder="llm-1")
    reconcile(api, copy.deepcopy(api.run()), [], SETTINGS, True, lease=signals)  # type: ignore[arg-type]
    status = api.run()["status"]
    assert (status["verdict"], status["step"], status["checkpointStep"]) == ("Dead", 120, 100)
    cycle(api, full=False)  # no Lease in this cycle's view: the status keeps the signals
    assert api.run()["status"]["verdict"] == "Dead"


def test_a_death_is_timed_from_the_agents_verdict_start_to_the_status_write() -> None:
    api = api_with_run()
    cycle(api)
    told: list[tuple[str, float, dict[str, Any] | None]] = []

    def detected(namespace: str, seconds: float) -> None:
        # What the apiserver holds when the cycle tells: the write was answered.
        told.append((namespace, seconds, copy.deepcopy(api.run()["status"].get("lastFailure"))))

    settings = replace(SETTINGS, detected=detected)
    since = datetime.now(UTC) - timedelta(seconds=2)
    dead = LeaseView(Verdict.DEAD, 120, 100, '{"reason":"gone"}', holder="llm-1", since=since)
    before = datetime.now(UTC)
    for _ in range(3):  # the same death seen again is recorded, and timed, once
        reconcile(api, copy.deepcopy(api.run()), api.views(), settings, False, lease=dead)  # type: ignore[arg-type]
    after = datetime.now(UTC)
    [(namespace, seconds, failure)] = told
    assert namespace == NAMESPACE
    assert (before - since).total_seconds() <= seconds <= (after - since).total_seconds()
    assert failure is not None and (failure["cause"], failure["attempt"]) == ("Dead", 1)


def test_a_ghost_memory_verdict_taints_excludes_and_moves_to_the_next_attempt() -> None:
    api = api_with_run(recovery={"backoff": {"initialSeconds": 0}})
    api.objects["/api/v1/nodes/gpu-a"] = {"metadata": {"name": "gpu-a", "resourceVersion": "1"}}
    cycle(api)
    api.objects[f"/api/v1/namespaces/{NAMESPACE}/pods/llm-1"]["spec"]["nodeName"] = "gpu-a"
    sick = LeaseView(Verdict.GHOST_MEMORY, 120, 100, '{"reason":"held"}', holder="llm-1")
    for _ in range(3):  # the same Lease seen again is no new failure
        reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, False, lease=sick)  # type: ignore[arg-type]
    status = api.run()["status"]
    assert [p["metadata"]["name"] for p in api.pods()] == ["llm-2"]
    assert [n["node"] for n in status["excludedNodes"]] == ["gpu-a"]
    assert (status["restarts"], status["lastFailure"]["cause"]) == (1, "GhostMemory")
    taints = api.objects["/api/v1/nodes/gpu-a"]["spec"]["taints"]
    assert taints == [
        {"key": "trainguard.dev/unhealthy", "value": "GhostMemory", "effect": "NoSchedule"}
    ]
    assert "GhostMemory" in [e["reason"] for e in api.events]


def test_a_rescheduled_run_shows_no_verdict_until_the_new_attempts_agent_reports() -> None:
    api = api_with_run(recovery={"backoff": {"initialSeconds": 0}})
    api.objects["/api/v1/nodes/gpu-a"] = {"metadata": {"name": "gpu-a", "resourceVersion": "1"}}
    cycle(api)
    api.objects[f"/api/v1/namespaces/{NAMESPACE}/pods/llm-1"]["spec"]["nodeName"] = "gpu-a"
    sick = LeaseView(Verdict.GHOST_MEMORY, 120, 100, '{"reason":"held"}', holder="llm-1")
    reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, False, lease=sick)  # type: ignore[arg-type]
    # While attempt 1's pod goes, the status still speaks of it.
    assert api.run()["status"]["verdict"] == "GhostMemory"
    for _ in range(3):  # attempt 2 created; the Lease still says what attempt 1's agent said
        reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, False, lease=sick)  # type: ignore[arg-type]
    status = api.run()["status"]
    assert [p["metadata"]["name"] for p in api.pods()] == ["llm-2"]
    assert status["attempt"] == 2 and "verdict" not in status, status.get("verdict")
    assert status["lastFailure"]["cause"] == "GhostMemory"
    assert (status["step"], status["checkpointStep"]) == (120, 100)  # the run's progress
    fresh = LeaseView(Verdict.HEALTHY, 100, 100, holder="llm-2")
    reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, False, lease=fresh)  # type: ignore[arg-type]
    assert api.run()["status"]["verdict"] == "Healthy"


def test_the_first_move_off_a_sick_node_is_not_held_by_the_restart_back_off() -> None:
    api = api_with_run(recovery={"backoff": {"initialSeconds": 30, "maxSeconds": 60}})
    api.objects["/api/v1/nodes/gpu-a"] = {"metadata": {"name": "gpu-a", "resourceVersion": "1"}}
    cycle(api)
    api.objects[f"/api/v1/namespaces/{NAMESPACE}/pods/llm-1"]["spec"]["nodeName"] = "gpu-a"
    sick = LeaseView(Verdict.GHOST_MEMORY, 120, 100, '{"reason":"held"}', holder="llm-1")
    for _ in range(3):
        reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, False, lease=sick)  # type: ignore[arg-type]
    # The node is excluded and the run leaves it at once: a delay heals no node.
    assert [p["metadata"]["name"] for p in api.pods()] == ["llm-2"]
    status = api.run()["status"]
    assert status["attempt"] == 2 and status["restarts"] == 1
    assert [e["node"] for e in status["excludedNodes"]] == ["gpu-a"]


def test_the_next_attempt_waits_for_the_restart_back_off_and_books_a_cycle() -> None:
    api = api_with_run(recovery={"backoff": {"initialSeconds": 30, "maxSeconds": 60}})
    api.objects["/api/v1/nodes/gpu-a"] = {"metadata": {"name": "gpu-a", "resourceVersion": "1"}}
    cycle(api)
    pod = api.objects[f"/api/v1/namespaces/{NAMESPACE}/pods/llm-1"]
    pod["spec"]["nodeName"] = "gpu-a"
    # The supervisor gave up: the pod Failed on a healthy node, which the run keeps.
    pod["status"] = {"phase": "Failed", "message": "the supervisor gave up"}
    outcomes = [
        reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, False)  # type: ignore[arg-type]
        for _ in range(3)
    ]
    # The old pod is gone, the next one held back: the first restart waits 30 s.
    assert api.pods() == []
    status = api.run()["status"]
    assert status["attempt"] == 1 and status["restarts"] == 1
    messages = [c["message"] for c in status["conditions"]]
    assert any("restart back-off: attempt 2 not before" in m for m in messages), messages
    assert outcomes[-1].retry_after is not None and 25 < outcomes[-1].retry_after <= 30


def _env(pod: dict[str, Any], name: str) -> str | None:
    trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
    return next((e.get("value") for e in trainer["env"] if e["name"] == name), None)


def test_the_next_attempt_is_told_the_fence_of_the_attempt_it_supersedes() -> None:
    """Attempt 1 reported step 100 on its layer: the fence is stored before pod 2 exists."""
    shipped = (LayerCheckpoint(layer="s3", step=100, verified=True),)
    for crash_at in [None, *range(1, 14)]:
        api = api_with_run(recovery={"backoff": {"initialSeconds": 0}})
        api.objects["/api/v1/nodes/gpu-a"] = {"metadata": {"name": "gpu-a", "resourceVersion": "1"}}
        cycle(api)
        api.objects[f"/api/v1/namespaces/{NAMESPACE}/pods/llm-1"]["spec"]["nodeName"] = "gpu-a"
        sick = LeaseView(
            Verdict.GHOST_MEMORY, 120, 100, '{"reason":"held"}', holder="llm-1", layers=shipped
        )
        api.requests, api.crash_at = 0, crash_at
        with contextlib.suppress(Crash):
            for _ in range(3):
                reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, False, lease=sick)  # type: ignore[arg-type]
        api.crash_at = None
        for _ in range(3):
            reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, False, lease=sick)  # type: ignore[arg-type]
        [pod] = api.pods()
        assert pod["metadata"]["name"] == "llm-2", crash_at
        fences = [(f["attempt"], f["step"]) for f in api.run()["status"]["fences"]]
        assert fences == [(1, 100)], crash_at
        assert _env(pod, "TRAINGUARD_FENCES") == '{"1":100}', crash_at
        if crash_at is None:
            fenced = [e for e in api.events if e["reason"] == "AttemptFenced"]
            assert len(fenced) == 1 and "up to step 100" in fenced[0]["message"]


def test_an_attempt_that_never_renewed_the_lease_is_fenced_without_a_step() -> None:
    api = api_with_run()
    cycle(api)
    api.objects = {p: o for p, o in api.objects.items() if "/pods/" not in p}  # pod lost
    stale = LeaseView(Verdict.HEALTHY, holder="someone-else")
    reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, False, lease=stale)  # type: ignore[arg-type]
    [pod] = api.pods()
    assert pod["metadata"]["name"] == "llm-2"
    assert [(f["attempt"], f.get("step")) for f in api.run()["status"]["fences"]] == [(1, None)]
    assert _env(pod, "TRAINGUARD_FENCES") == '{"1":null}'


def test_invalid_checkpoints_the_agent_told_of_reach_the_status() -> None:
    api = api_with_run()
    cycle(api)
    summary = json.dumps(
        {
            "counts": {"backup": 1, "l1": 2},
            "last": {
                "layer": "backup",
                "step": 142,
                "file": "optimizer.safetensors",
                "reason": "xxh3-128 hash mismatch",
                "found": "Restore",
                "time": "2026-12-04T10:00:00Z",
            },
        }
    )
    told = LeaseView(Verdict.HEALTHY, 150, 140, holder="llm-1", invalid_checkpoints=summary)
    reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, False, lease=told)  # type: ignore[arg-type]
    status = api.run()["status"]
    assert status["lastInvalidCheckpoint"] == {
        "layer": "backup",
        "step": 142,
        "file": "optimizer.safetensors",
        "reason": "xxh3-128 hash mismatch",
        "found": "Restore",
        "time": "2026-12-04T10:00:00Z",
        "attempt": 1,
    }
    assert status["invalidCheckpoints"] == [
        {"layer": "backup", "attempt": 1, "count": 1},
        {"layer": "l1", "attempt": 1, "count": 2},
    ]
    # A Lease renewed by another attempt's pod does not speak for this one; nor does an
    # unreadable summary, and what the status holds stays.
    for other in (replace(told, holder="llm-7"), replace(told, invalid_checkpoints="{not json")):
        reconcile(api, copy.deepcopy(api.run()), api.views(), SETTINGS, False, lease=other)  # type: ignore[arg-type]
        assert api.run()["status"]["lastInvalidCheckpoint"]["step"] == 142
    cycle(api, full=False)  # no Lease in this cycle's view
    assert api.run()["status"]["invalidCheckpoints"][0]["count"] == 1


def test_a_gangs_members_the_watch_has_not_delivered_are_neither_created_again_nor_mourned() -> (
    None
):
    # A thousand members are created in one cycle; the next cycle's watch has delivered
    # only some of them. The apiserver, asked for the pods' metadata, has them all: the
    # cycle creates nothing, deletes nothing, keeps the attempt.
    api = api_with_run(trainer={"nodes": 3})
    cycle(api)
    assert len(api.pods()) == 3
    delivered = [v for v in api.views() if v.member == 0]
    before = api.requests
    seen: list[tuple[str, str]] = []
    request = api.request

    def spy(method: str, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        seen.append((method, path))
        return request(method, path, *args, **kwargs)

    api.request = spy  # type: ignore[method-assign]
    outcome = reconcile(api, copy.deepcopy(api.run()), delivered, SETTINGS, False)  # type: ignore[arg-type]
    assert outcome.status.attempt == 1
    assert len(api.pods()) == 3
    assert not [m for m, p in seen if m in ("POST", "DELETE") and "/pods" in p], seen
    assert ("GET", f"/api/v1/namespaces/{NAMESPACE}/pods") in seen  # the apiserver was asked
    assert api.requests > before


class MetadataOnlyApi:
    """Answers a pod list the way the apiserver does when asked for metadata only."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.accepted: list[str] = []

    def request(self, method: str, path: str, *_: Any, **kwargs: Any) -> dict[str, Any]:
        assert (method, path) == ("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
        self.accepted.append(kwargs["accept"])
        return {"items": [{"metadata": copy.deepcopy(p["metadata"])} for p in self.pods]}


def test_current_pods_asks_for_metadata_and_keeps_what_the_watch_knows() -> None:
    def pod(name: str, created: str, **status: Any) -> dict[str, Any]:
        labels = {"trainguard.dev/run": "llm", "trainguard.dev/attempt": "1"}
        meta = {"name": name, "labels": labels, "creationTimestamp": created}
        return {"metadata": meta, "spec": {"nodeName": status.pop("node", None)}, "status": status}

    running = pod("llm-1-0", "2026-01-01T00:00:00Z", phase="Running", node="gpu-0")
    recreated_old = pod("llm-1-1", "2026-01-01T00:00:00Z", phase="Running", node="gpu-1")
    recreated_new = pod("llm-1-1", "2026-01-01T00:01:00Z")
    undelivered = pod("llm-1-2", "2026-01-01T00:01:00Z")
    gone = pod("llm-1-3", "2026-01-01T00:00:00Z", phase="Running", node="gpu-3")
    leaving = copy.deepcopy(running)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:02:00Z"
    api = MetadataOnlyApi([leaving, recreated_new, undelivered])
    watched = [v for v in map(pod_view, (running, recreated_old, gone)) if v is not None]

    views = {v.name: v for v in current_pods(api, NAMESPACE, "llm", watched)}  # type: ignore[arg-type]

    assert api.accepted == [METADATA_LIST]
    assert sorted(views) == ["llm-1-0", "llm-1-1", "llm-1-2"]  # the one the apiserver lost
    # The watch's view of a pod it delivered (phase, node), marked as the apiserver marks it.
    assert (views["llm-1-0"].phase, views["llm-1-0"].node) == ("Running", "gpu-0")
    assert views["llm-1-0"].deleting
    # A pod of the same name made since, and one not delivered yet: just created.
    for name in ("llm-1-1", "llm-1-2"):
        assert (views[name].phase, views[name].node, views[name].deleting) == (
            "Pending",
            None,
            False,
        )
