"""A gang's restart generation: when the operator orders one, how it is told, how agents carry it.

The policy (`policies.gang`) orders generation + 1 once per failure of the gang: a member
replaced, or a rank failure a member's agent reports about a launch of the current generation;
a verdict about an older launch (the collective's other victims, the ordered stops) orders
nothing. A whole cycle records it once (status and one Event) and writes it on every member's
Lease; the agent hands it to its supervisor (`gang.json`) and says which generation its verdict
is about.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from run_factory import make_run
from test_reconcile_cycle import SETTINGS, FakeApi, api_with_run

from trainguard.agent.main import Agent
from trainguard.agent.verdicts import DEAD, HEALTHY, HUNG, Verdict
from trainguard.api import TrainingRun
from trainguard.api.constants import (
    ANNOTATION_GANG_GENERATION,
    ANNOTATION_VERDICT,
    ANNOTATION_VERDICT_GENERATION,
    LABEL_MEMBER,
    Reason,
)
from trainguard.api.constants import Verdict as RunVerdict
from trainguard.contract import env
from trainguard.contract.files import (
    SUPERVISOR_FAILED_GENERATION,
    SUPERVISOR_GANG_GENERATION,
    read_gang_order,
    write_json,
)
from trainguard.operator.build.names import pod_name
from trainguard.operator.k8s.leases import lease_view
from trainguard.operator.k8s.reconcile import reconcile
from trainguard.operator.policies import gang
from trainguard.operator.policies.signals import LeaseView

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
ATTEMPT = 2


def gang_run(generation: int = 0, nodes: int = 3) -> TrainingRun:
    status: dict[str, Any] = {"attempt": ATTEMPT}
    if generation:
        status["gangRestart"] = {
            "generation": generation,
            "member": 1,
            "cause": "Dead",
            "time": "2026-01-01T11:00:00Z",
            "message": "earlier",
        }
    return make_run({"trainer": {"nodes": nodes}}, status)


def member_lease(
    member: int,
    verdict: RunVerdict = RunVerdict.HEALTHY,
    generation: int | None = 0,
    since: datetime | None = None,
    attempt: int = ATTEMPT,
    ordered: int | None = None,
) -> LeaseView:
    return LeaseView(
        verdict=verdict,
        holder=pod_name("llm", attempt, member),
        member=member,
        generation=generation,
        since=since,
        ordered_generation=ordered,
    )


# -- the policy --------------------------------------------------------------------------------


def test_a_rank_failure_on_any_member_orders_the_next_generation_naming_it() -> None:
    leases = [member_lease(0), member_lease(1), member_lease(2, RunVerdict.DEAD, 0)]
    restart = gang.order(gang_run(), leases, [], NOW)
    assert restart is not None
    assert (restart.generation, restart.member, restart.cause) == (1, 2, "Dead")
    assert "member 2 reported Dead" in restart.message
    hung = [member_lease(1, RunVerdict.HUNG, 3)]
    restart = gang.order(gang_run(3), hung, [], NOW)
    assert restart is not None and (restart.generation, restart.cause) == (4, "Hung")


def test_a_failure_about_an_older_generation_orders_nothing() -> None:
    # Member 0's ranks failed with the broken collective of generation 0; generation 1 covers it.
    leases = [member_lease(0, RunVerdict.DEAD, 0), member_lease(1, RunVerdict.DEAD, 0)]
    assert gang.order(gang_run(1), leases, [], NOW) is None
    assert gang.failing("llm", ATTEMPT, leases, 1) == []


def test_a_failure_the_operator_missed_orders_past_it() -> None:
    leases = [member_lease(1, RunVerdict.DEAD, 4)]
    restart = gang.order(gang_run(2), leases, [], NOW)
    assert restart is not None and restart.generation == 5


def test_the_failure_that_began_first_names_the_cause() -> None:
    leases = [
        member_lease(0, RunVerdict.DEAD, 0, since=NOW),
        member_lease(2, RunVerdict.DEAD, 0, since=NOW - timedelta(seconds=1)),
    ]
    restart = gang.order(gang_run(), leases, [], NOW)
    assert restart is not None and (restart.generation, restart.member) == (1, 2)


def test_healthy_members_a_stale_lease_or_one_pod_order_nothing() -> None:
    assert gang.order(gang_run(), [member_lease(m) for m in range(3)], [], NOW) is None
    # Renewed by the pod of an earlier attempt: not this gang's news.
    stale = [member_lease(1, RunVerdict.DEAD, 0, attempt=ATTEMPT - 1)]
    assert gang.order(gang_run(), stale, [], NOW) is None
    # A member whose agent does not say which launch it speaks of (no supervisor) orders nothing.
    assert gang.order(gang_run(), [member_lease(1, RunVerdict.DEAD, None)], [], NOW) is None
    one = make_run({}, {"attempt": 1})
    lone = LeaseView(verdict=RunVerdict.DEAD, holder=pod_name("llm", 1), generation=0)
    assert gang.order(one, [lone], [gang.Replaced(0, "NodeLost", "n")], NOW) is None


def test_a_replaced_member_orders_the_next_generation() -> None:
    gone = [gang.Replaced(2, Reason.NODE_LOST.value, "gpu-7")]
    restart = gang.order(gang_run(1), [member_lease(0)], gone, NOW)
    assert restart is not None
    assert (restart.generation, restart.member, restart.cause) == (2, 2, "NodeLost")
    assert "member 2 lost its node on gpu-7" in restart.message


def test_every_member_not_told_the_generation_is_told() -> None:
    assert gang.unsent(gang_run(0), [member_lease(m) for m in range(3)]) == []
    leases = [member_lease(0, ordered=2), member_lease(1, ordered=1)]
    assert gang.unsent(gang_run(2), leases) == [1, 2]  # member 2's Lease not seen yet


def test_the_lease_carries_both_generations() -> None:
    view = lease_view(
        {
            "metadata": {
                "labels": {LABEL_MEMBER: "1"},
                "annotations": {
                    ANNOTATION_GANG_GENERATION: "3",
                    ANNOTATION_VERDICT_GENERATION: "2",
                    ANNOTATION_VERDICT: "Dead",
                },
            }
        }
    )
    assert (view.member, view.ordered_generation, view.generation) == (1, 3, 2)


# -- whole cycles ------------------------------------------------------------------------------


class GangApi(FakeApi):
    """The in-memory API, also taking the merge patches that tell members their generation."""

    def __init__(self) -> None:
        super().__init__()
        self.merge_patches: list[str] = []

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = "",
        accept: str = "application/json",
    ) -> dict[str, Any]:
        if method == "PATCH" and content_type == "application/merge-patch+json":
            self.merge_patches.append(path)
            target = self.objects[path]
            annotations = target["metadata"].setdefault("annotations", {})
            annotations.update(body["metadata"]["annotations"])
            return target
        return super().request(method, path, body, query, content_type, accept)


def running_gang() -> GangApi:
    api = GangApi()
    api.objects.update(api_with_run(trainer={"nodes": 2}).objects)
    reconcile(api, copy.deepcopy(api.run()), [], SETTINGS, True)  # type: ignore[arg-type]
    for pod in api.pods():
        pod["status"] = {"phase": "Running"}
        pod["spec"]["nodeName"] = f"gpu-{pod['metadata']['labels'][LABEL_MEMBER]}"
    return api


def leases_of(api: GangApi) -> list[dict[str, Any]]:
    return [o for p, o in api.objects.items() if "/leases/" in p]


def renew(lease: dict[str, Any], verdict: str, generation: int) -> None:
    """What the member's agent writes (`Agent.annotations`)."""
    member = lease["metadata"]["labels"][LABEL_MEMBER]
    lease["spec"]["holderIdentity"] = pod_name("llm", 1, int(member))
    lease["metadata"].setdefault("annotations", {}).update(
        {ANNOTATION_VERDICT: verdict, ANNOTATION_VERDICT_GENERATION: str(generation)}
    )


def gang_cycle(api: GangApi) -> dict[str, Any]:
    views = [lease_view(lease) for lease in leases_of(api)]
    own = next(v for v in views if v.member == 0)
    others = tuple(v for v in views if v.member)
    run = copy.deepcopy(api.run())
    outcome = reconcile(api, run, api.views(), SETTINGS, False, None, own, others)  # type: ignore[arg-type]
    return outcome.status.to_object()


def test_a_member_rank_failure_is_ordered_once_and_written_on_every_members_lease() -> None:
    api = running_gang()
    member0, member1 = sorted(leases_of(api), key=lambda lease: lease["metadata"]["name"])
    renew(member0, "Healthy", 0)
    renew(member1, "Dead", 0)
    status = gang_cycle(api)
    assert status["gangRestart"]["generation"] == 1
    assert (status["gangRestart"]["member"], status["gangRestart"]["cause"]) == (1, "Dead")
    assert [m.get("generation") for m in status["members"]] == [0, 0]
    assert len(api.merge_patches) == 2
    for lease in leases_of(api):
        assert lease["metadata"]["annotations"][ANNOTATION_GANG_GENERATION] == "1"
    told = [e for e in api.events if e["reason"] == Reason.GANG_RESTART]
    assert len(told) == 1 and told[0]["type"] == "Warning"
    # Member 0's ranks fail with the broken collective, and the Dead of generation 0 stays on
    # member 1's Lease until its restarted ranks are watched: no second order, no second Event.
    renew(member0, "Dead", 0)
    status = gang_cycle(api)
    assert status["gangRestart"]["generation"] == 1
    assert len(api.merge_patches) == 2
    assert len([e for e in api.events if e["reason"] == Reason.GANG_RESTART]) == 1
    # The next failure, about a launch of generation 1, is a new one.
    renew(member0, "Healthy", 1)
    renew(member1, "Hung", 1)
    assert gang_cycle(api)["gangRestart"]["generation"] == 2


# -- the agent ---------------------------------------------------------------------------------


class Api:
    """The API's stand-in: the Lease as stored, the operator's annotation included."""

    def __init__(self) -> None:
        self.stored: dict[str, str] = {}
        self.sent: dict[str, str] = {}

    def renew(self, duration: int, annotations: dict[str, str]) -> dict[str, str]:
        self.sent = annotations
        return {**self.stored, **annotations}

    def event(self, reason: str, message: str, warning: bool) -> None:
        pass


def member_agent(tmp_path: Path, nodes: int = 2) -> tuple[Agent, Api, Path]:
    state = tmp_path / "state"
    state.mkdir()
    environ = {env.STATE_DIR: str(state), env.L1_DIR: str(tmp_path / "l1")}
    if nodes > 1:
        environ.update(
            {env.NNODES: str(nodes), env.NODE_RANK: "1", env.MASTER_ADDR: "llm-0.llm-gang"}
        )
    api = Api()
    return Agent(environ, api), api, state


def test_a_members_agent_hands_the_ordered_generation_to_its_supervisor(tmp_path: Path) -> None:
    agent, api, state = member_agent(tmp_path)
    agent.report(Verdict(HEALTHY, "ok"), force=True)
    assert read_gang_order(state / "gang.json") == 0  # renewed once: no order yet
    api.stored[ANNOTATION_GANG_GENERATION] = "2"
    agent.report(Verdict(HEALTHY, "ok"), force=True)
    assert read_gang_order(state / "gang.json") == 2


def test_a_one_pod_agent_writes_no_gang_file(tmp_path: Path) -> None:
    agent, api, state = member_agent(tmp_path, nodes=1)
    api.stored[ANNOTATION_GANG_GENERATION] = "2"
    agent.report(Verdict(HEALTHY, "ok"), force=True)
    assert not (state / "gang.json").exists()
    assert ANNOTATION_VERDICT_GENERATION not in api.sent


def test_the_verdict_says_which_launch_it_is_about(tmp_path: Path) -> None:
    agent, api, state = member_agent(tmp_path)
    supervisor = {
        "state": "running",
        SUPERVISOR_GANG_GENERATION: 4,
        SUPERVISOR_FAILED_GENERATION: 3,
    }
    write_json(state / "supervisor.json", supervisor)
    agent.report(Verdict(DEAD, "rank 1 absent"), force=True)
    assert api.sent[ANNOTATION_VERDICT_GENERATION] == "3"  # the launch that failed
    agent.report(Verdict(HUNG, "frozen"), force=True)
    assert api.sent[ANNOTATION_VERDICT_GENERATION] == "4"  # the one running
    write_json(state / "supervisor.json", {**supervisor, SUPERVISOR_FAILED_GENERATION: None})
    agent.report(Verdict(DEAD, "gone"), force=True)
    assert api.sent[ANNOTATION_VERDICT_GENERATION] == "4"
    assert json.loads(json.dumps(api.sent))  # plain strings, as annotations must be
