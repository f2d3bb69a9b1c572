"""Gangs of member pods, operator side: API bounds, members' pods, Service, Leases, lifecycle.

The lifecycle creates a gang's members together, replaces a lost one alone, and takes a gang
that cannot be placed down whole.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from run_factory import make_run

from trainguard.api import TrainingRun
from trainguard.api.constants import (
    ANNOTATION_ENV_CONFIG,
    LABEL_ATTEMPT,
    LABEL_MEMBER,
    LABEL_RUN,
    MAX_NODES,
    Reason,
    Verdict,
)
from trainguard.api.trainingrun import MAX_GANG_RUN_NAME_LENGTH
from trainguard.api.types import MAX_LABEL_LENGTH
from trainguard.contract import env
from trainguard.contract.env import PodEnv
from trainguard.operator.build.constants import OperatorReason
from trainguard.operator.build.lease import leases
from trainguard.operator.build.names import gang_service_name, member_hostname, pod_name
from trainguard.operator.build.pod import (
    PodInputs,
    gang_pods,
    pods_env_config,
    spec_hash,
    training_pod,
)
from trainguard.operator.build.role import role
from trainguard.operator.build.service import gang_service
from trainguard.operator.k8s.leases import lease_view
from trainguard.operator.k8s.pods import pod_view
from trainguard.operator.k8s.reconcile import _with_signals, companions
from trainguard.operator.policies import signals
from trainguard.operator.policies.lifecycle import (
    GANG_RETRY_SECONDS,
    GANG_UNSCHEDULABLE_SECONDS,
    PodView,
    decide,
    lost_members,
    observed,
    sick_members,
    state,
)
from trainguard.operator.policies.signals import LeaseView
from trainguard_dev.testing.podenv import config_map_data, container_environment

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

GANG = {"trainer": {"nodes": 3}}
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def gang_run(status: dict[str, Any] | None = None, nodes: int = 3) -> TrainingRun:
    return make_run({"trainer": {"nodes": nodes}}, status)


def env_of(
    manifest: dict[str, Any], run: TrainingRun, container: str = "trainer"
) -> dict[str, str]:
    """A container's variables, the run's env ConfigMap's included (downward ones left out)."""
    spec = manifest["spec"]
    (found,) = [c for c in [*spec["initContainers"], *spec["containers"]] if c["name"] == container]
    attempt = int(manifest["metadata"]["labels"][LABEL_ATTEMPT])
    return container_environment(found, config_map_data(pods_env_config(run, attempt)))


# -- API ---------------------------------------------------------------------------------------


def test_the_longest_gang_run_name_leaves_every_member_name_a_dns_label() -> None:
    name = "g" * MAX_GANG_RUN_NAME_LENGTH
    assert len(member_hostname(name, MAX_NODES - 1)) <= MAX_LABEL_LENGTH
    assert len(gang_service_name(name)) <= MAX_LABEL_LENGTH
    make_run(GANG, name=name)  # accepted
    with pytest.raises(ValidationError, match="needs a name of at most 58"):
        make_run(GANG, name=name + "g")
    # A one-pod run keeps the run name's own bound.
    make_run(name="r" * MAX_LABEL_LENGTH)


# -- builders ----------------------------------------------------------------------------------


def test_a_one_pod_run_builds_exactly_the_pod_it_always_built() -> None:
    run = make_run()
    inputs = PodInputs(2, ("gpu-9",), "agent:1")
    (only,) = gang_pods(run, inputs)
    assert only == training_pod(run, inputs)
    assert only["metadata"]["name"] == "llm-2"
    assert LABEL_MEMBER not in only["metadata"]["labels"]
    assert "hostname" not in only["spec"] and "subdomain" not in only["spec"]
    assert env_of(only, run)[env.LEASE_NAME] == "llm-heartbeat"
    assert env.MASTER_ADDR not in env_of(only, run)
    assert [c["kind"] for c in companions(run)] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Lease",
    ]


def test_each_member_has_its_stable_name_rank_and_lease() -> None:
    run = gang_run()
    pods = gang_pods(run, PodInputs(4, ("gpu-9",), "agent:1"))
    assert [p["metadata"]["name"] for p in pods] == ["llm-4-0", "llm-4-1", "llm-4-2"]
    for member, manifest in enumerate(pods):
        spec, labels = manifest["spec"], manifest["metadata"]["labels"]
        assert spec["hostname"] == f"llm-{member}"  # the same in every attempt
        assert spec["subdomain"] == "llm-gang"
        assert labels[LABEL_MEMBER] == str(member)
        assert labels[LABEL_ATTEMPT] == "4"
        # Every member carries the run's exclusions.
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-9"]
        told = PodEnv.from_env(env_of(manifest, run))
        assert (told.nnodes, told.node_rank) == (3, member)
        assert told.master_addr == "llm-0.llm-gang"
        assert told.master_port == env.DEFAULT_MASTER_PORT
        assert told.lease == ("llm-heartbeat" if member == 0 else f"llm-heartbeat-{member}")
        # Init steps and the agent are told the same contract (the agent renews its Lease).
        agent_env = env_of(manifest, run, "agent")
        assert agent_env[env.LEASE_NAME] == told.lease
        assert agent_env[env.NODE_RANK] == str(member)
        # What every member is told alike travels once, in the run's env ConfigMap.
        assert env.NNODES not in {e["name"] for e in manifest["spec"]["containers"][0]["env"]}
    # The members differ only in what names them, and share one env ConfigMap.
    assert pods[0]["spec"]["volumes"] == pods[2]["spec"]["volumes"]
    assert len({p["metadata"]["annotations"][ANNOTATION_ENV_CONFIG] for p in pods}) == 1
    assert spec_hash(run.spec) == pods[1]["metadata"]["annotations"]["trainguard.dev/spec-hash"]


def test_the_gang_service_is_headless_publishes_unready_members_and_selects_the_run() -> None:
    run = gang_run()
    service = gang_service(run)
    assert service["metadata"]["name"] == "llm-gang"
    assert service["metadata"]["ownerReferences"][0]["uid"] == run.metadata.uid
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    # The run's label alone: every attempt's members are found.
    assert service["spec"]["selector"] == {LABEL_RUN: "llm"}
    kinds = [c["kind"] for c in companions(run)]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "Lease", "Lease", "Lease", "Service"]


def test_every_member_gets_its_own_lease_and_the_role_names_them_all() -> None:
    run = gang_run()
    names = [lease["metadata"]["name"] for lease in leases(run)]
    assert names == ["llm-heartbeat", "llm-heartbeat-1", "llm-heartbeat-2"]
    assert [lease["metadata"]["labels"][LABEL_MEMBER] for lease in leases(run)] == ["0", "1", "2"]
    (lease_rule, _) = role(run)["rules"]
    assert lease_rule["resourceNames"] == names
    assert role(make_run())["rules"][0]["resourceNames"] == ["llm-heartbeat"]
    assert LABEL_MEMBER not in leases(make_run())[0]["metadata"]["labels"]


def test_a_member_lease_counts_only_when_its_own_pod_renewed_it() -> None:
    (_, second, _) = leases(gang_run())
    view = lease_view(
        {**second, "spec": {**second["spec"], "holderIdentity": pod_name("llm", 4, 1)}}
    )
    assert view.member == 1
    assert signals.renewed_by(view, "llm", 4)
    assert not signals.renewed_by(view, "llm", 3)
    own = LeaseView(holder="llm-4")
    assert signals.renewed_by(own, "llm", 4)  # a one-pod run's Lease, as before


def test_a_member_pod_is_read_with_its_index_creation_and_unschedulable_time() -> None:
    manifest = gang_pods(gang_run(), PodInputs(1, agent_image="agent:1"))[2]
    manifest["metadata"]["creationTimestamp"] = "2026-01-01T11:59:00Z"
    manifest["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available",
                "lastTransitionTime": "2026-01-01T12:00:00Z",
            }
        ],
    }
    view = pod_view(manifest)
    assert view is not None
    assert (view.attempt, view.member) == (1, 2)
    assert view.unschedulable == "0/2 nodes are available"
    assert view.unschedulable_since == NOW
    assert view.created == NOW - timedelta(seconds=60)


# -- lifecycle ---------------------------------------------------------------------------------


def member(attempt: int, index: int, **fields: Any) -> PodView:
    return PodView(
        name=pod_name("llm", attempt, index),
        attempt=attempt,
        member=index,
        spec_hash=spec_hash(gang_run().spec),
        **fields,
    )


def running(attempt: int, index: int) -> PodView:
    return member(attempt, index, phase="Running", node=f"gpu-{index}")


def test_a_new_gang_creates_every_member_at_once() -> None:
    decision = decide(gang_run(), (), spec_hash(gang_run().spec), NOW)
    assert (decision.attempt, decision.create) == (1, True)
    told = state(gang_run(), decision, None)
    assert told.reason == Reason.SCHEDULING
    assert "created the 3 members of gang llm, pods llm-1-0 to llm-1-2 (attempt 1)" in told.message


def test_a_running_gang_is_kept_and_reported_member_by_member() -> None:
    run = gang_run({"attempt": 1})
    pods = (running(1, 0), running(1, 1), member(1, 2, node="gpu-2"))
    decision = decide(run, pods, spec_hash(run.spec), NOW)
    assert not decision.create and decision.delete == ()
    assert [p.member for p in decision.members] == [0, 1, 2]
    assert decision.current == pods[0]
    seen = observed(run, decision, None)
    assert seen.members_ready == "2/3"
    assert [(m.index, m.pod, m.node, m.phase) for m in seen.members] == [
        (0, "llm-1-0", "gpu-0", "Running"),
        (1, "llm-1-1", "gpu-1", "Running"),
        (2, "llm-1-2", "gpu-2", "Pending"),
    ]
    assert not seen.started  # not before every member runs
    assert state(run, decision, None).reason == OperatorReason.STARTING
    every = decide(run, (*pods[:2], running(1, 2)), spec_hash(run.spec), NOW)
    told = state(run, every, None)
    assert told.reason == Reason.TRAINING and told.ready
    assert observed(run, every, None).started


@pytest.mark.parametrize(
    "last",
    [None, member(1, 2, phase="Failed", node="gpu-2")],
    ids=["member-gone", "member-failed"],
)
def test_a_gang_that_lost_a_member_replaces_that_member_alone(last: PodView | None) -> None:
    run = gang_run({"attempt": 1, "restarts": 0})
    pods = (running(1, 0), running(1, 1), *([last] if last else []))
    decision = decide(run, pods, spec_hash(run.spec), NOW)
    # Same attempt, member 2 alone; the others keep their pods.
    assert (decision.attempt, decision.create, decision.replace) == (1, True, (2,))
    assert decision.delete == ((last,) if last else ())
    assert decision.cause is Reason.POD_DELETED
    told = state(run, decision, None)
    assert "gang llm (attempt 1): replacing member 2" in told.message
    assert "the other members keep their pods" in told.message
    seen = observed(run, decision, None)
    assert seen.attempt == 1 and seen.restarts == 1
    assert [m.index for m in seen.members] == [0, 1]
    built = gang_pods(run, PodInputs(1, ("gpu-2",), "agent:1"), decision.replace)
    assert [p["metadata"]["name"] for p in built] == ["llm-1-2"]


def test_a_failed_member_0_is_left_to_the_ladder() -> None:
    run = gang_run({"attempt": 1})
    pods = (member(1, 0, phase="Failed", node="gpu-0"), running(1, 1), running(1, 2))
    decision = decide(run, pods, spec_hash(run.spec), NOW)
    assert not decision.create and decision.delete == () and decision.current == pods[0]


def test_a_member_whose_lease_expired_is_a_candidate_for_a_lost_node() -> None:
    run = gang_run({"attempt": 1})
    pods = tuple(running(1, m) for m in range(3))
    old = NOW - timedelta(seconds=60)
    leases_seen = (
        LeaseView(holder="llm-1-0", member=0, renewed=old, duration_seconds=15),  # the ladder's
        LeaseView(holder="llm-1-1", member=1, renewed=old, duration_seconds=15),
        LeaseView(holder="llm-1-2", member=2, renewed=NOW, duration_seconds=15),
    )
    assert lost_members(run, pods, leases_seen, NOW) == (pods[1],)
    # A Lease last renewed by another attempt's pod says nothing of this one.
    stale = (LeaseView(holder="llm-0-1", member=1, renewed=old, duration_seconds=15),)
    assert lost_members(run, pods, stale, NOW) == ()


def test_a_member_whose_own_agent_finds_its_node_sick_is_named_with_the_cause() -> None:
    created = NOW - timedelta(seconds=120)
    pods = tuple(member(1, m, phase="Running", node=f"gpu-{m}", created=created) for m in range(4))

    def lease(index: int, verdict: Verdict, renewed: datetime = NOW) -> LeaseView:
        return LeaseView(holder=f"llm-1-{index}", member=index, renewed=renewed, verdict=verdict)

    leases_seen = (
        lease(0, Verdict.GHOST_MEMORY),  # member 0's is the run's own: the ladder's
        lease(1, Verdict.GHOST_MEMORY),
        lease(2, Verdict.IO_STUCK),
        lease(3, Verdict.DEAD),  # software: its supervisor restarts the ranks in place
    )
    assert sick_members(pods, leases_seen) == (
        (pods[1], Verdict.GHOST_MEMORY.value),
        (pods[2], Verdict.IO_STUCK.value),
    )
    # The replacement keeps its predecessor's name: the Lease its predecessor renewed (before
    # the replacement was created) says nothing about the replacement's node.
    replacement = member(1, 1, phase="Running", node="gpu-9", created=NOW)
    before = (lease(1, Verdict.GHOST_MEMORY, renewed=NOW - timedelta(seconds=5)),)
    assert sick_members((replacement,), before) == ()
    # Nor one renewed within the second the replacement was made: `creationTimestamp` has
    # whole seconds, so the predecessor's renewal moments before it may read as later.
    same_second = (lease(1, Verdict.GHOST_MEMORY, renewed=NOW + timedelta(milliseconds=400)),)
    assert sick_members((replacement,), same_second) == ()
    renewed_after = (lease(1, Verdict.GHOST_MEMORY, renewed=NOW + timedelta(seconds=1)),)
    assert sick_members((replacement,), renewed_after) == (
        (replacement, Verdict.GHOST_MEMORY.value),
    )
    # Another attempt's pod's Lease, and a member already leaving, are not this pod's.
    assert (
        sick_members(
            pods[1:2],
            (LeaseView(holder="llm-0-1", member=1, renewed=NOW, verdict=Verdict.GHOST_MEMORY),),
        )
        == ()
    )
    leaving = member(1, 1, phase="Running", node="gpu-1", created=created, deleting=True)
    assert sick_members((leaving,), leases_seen) == ()


def unschedulable(attempt: int, index: int, since: datetime) -> PodView:
    return member(
        attempt, index, unschedulable="0/2 nodes are available", unschedulable_since=since
    )


def test_a_gang_that_cannot_be_placed_waits_the_bound_then_goes_down_and_retries() -> None:
    run = gang_run({"attempt": 1})
    hash_ = spec_hash(run.spec)
    pods = (running(1, 0), running(1, 1), unschedulable(1, 2, NOW))
    # Within the bound: kept, and the state says what the scheduler says.
    early = decide(run, pods, hash_, NOW + timedelta(seconds=GANG_UNSCHEDULABLE_SECONDS - 1))
    assert early.delete == () and early.unplaced is None
    told = state(run, early, None)
    assert told.reason == OperatorReason.UNSCHEDULABLE
    assert "gang llm (attempt 1): 1 of 3 members cannot be scheduled yet" in told.message
    # Past it: every member goes, the placed ones too (no partial gang holds nodes).
    later = NOW + timedelta(seconds=GANG_UNSCHEDULABLE_SECONDS)
    down = decide(run, pods, hash_, later)
    assert set(down.delete) == set(pods)
    assert down.unplaced is not None and (down.unplaced.members, down.unplaced.total) == (1, 3)
    assert down.retry_time == later + timedelta(seconds=GANG_RETRY_SECONDS)
    told = state(run, down, None)
    assert told.reason == OperatorReason.UNSCHEDULABLE and told.warning
    assert "gang llm (attempt 1): 1 of 3 members could not be placed" in told.message
    assert "every member deleted" in told.message
    seen = observed(run, down, None)
    assert seen.gang_retry_time == down.retry_time and seen.members == ()
    # Held until the retry time, then the next attempt, not counted as a restart.
    held = gang_run({"attempt": 1, "gangRetryTime": "2026-01-01T12:01:00Z", "restarts": 0})
    wait = decide(held, (), hash_, NOW + timedelta(seconds=59))
    assert not wait.create and wait.retry_time is not None
    assert state(held, wait, None).reason == OperatorReason.UNSCHEDULABLE
    assert observed(held, wait, None).gang_retry_time == wait.retry_time
    retry = decide(held, (), hash_, NOW + timedelta(seconds=60))
    assert (retry.attempt, retry.create, retry.cause) == (2, True, Reason.SCHEDULING)
    seen = observed(held, retry, None)
    assert seen.restarts == 0 and seen.gang_retry_time is None


def test_members_of_a_gang_taken_down_still_listed_are_deleted_and_the_retry_kept() -> None:
    """A watch that has delivered the unplaced member's deletion but not the placed ones'."""
    held = gang_run({"attempt": 1, "gangRetryTime": "2026-01-01T12:01:00Z", "restarts": 0})
    hash_ = spec_hash(held.spec)
    placed = (running(1, 0), running(1, 1))
    again = decide(held, placed, hash_, NOW + timedelta(seconds=1))
    assert set(again.delete) == set(placed) and not again.create
    assert again.retry_time == datetime(2026, 1, 1, 12, 1, tzinfo=UTC)
    seen = observed(held, again, None)
    assert seen.gang_retry_time == again.retry_time and seen.members == ()
    assert state(held, again, None).reason == OperatorReason.UNSCHEDULABLE
    # Once they are gone the next attempt waits for the retry time, not counted as a restart.
    assert not decide(held, (), hash_, NOW + timedelta(seconds=2)).create
    # Pods of a newer attempt than the status's are that attempt's own, never taken down.
    newer = (running(2, 0), running(2, 1), running(2, 2))
    kept = decide(held, newer, hash_, NOW + timedelta(seconds=61))
    assert kept.delete == () and not kept.create


def test_a_one_pod_run_that_cannot_be_placed_is_never_taken_down() -> None:
    run = make_run(None, {"attempt": 1})
    lone = PodView(
        name="llm-1",
        attempt=1,
        spec_hash=spec_hash(run.spec),
        unschedulable="0/2 nodes are available",
        unschedulable_since=NOW - timedelta(hours=1),
    )
    decision = decide(run, (lone,), spec_hash(run.spec), NOW)
    assert decision.delete == () and decision.current == lone and decision.members == ()


def test_a_spec_change_deletes_every_member() -> None:
    run = gang_run({"attempt": 1})
    pods = tuple(running(1, m) for m in range(3))
    changed = tuple(
        PodView(name=p.name, attempt=1, member=p.member, phase="Running", spec_hash="old")
        for p in pods
    )
    decision = decide(run, changed, spec_hash(run.spec), NOW)
    assert set(decision.delete) == set(changed) and decision.cause is Reason.SPEC_CHANGED
    assert "deleting pod llm-1-0, llm-1-1, llm-1-2" in state(run, decision, None).message


def test_member_verdicts_reach_the_status_from_their_own_leases() -> None:
    run = gang_run({"attempt": 1})
    pods = tuple(running(1, m) for m in range(3))
    decision = decide(run, pods, spec_hash(run.spec), NOW)
    own = LeaseView(verdict=Verdict.HEALTHY, holder="llm-1-0", member=0, step=7)
    others = (
        LeaseView(verdict=Verdict.DEAD, holder="llm-1-1", member=1),
        LeaseView(verdict=Verdict.HEALTHY, holder="llm-0-2", member=2),  # an earlier attempt's
    )
    seen = _with_signals(observed(run, decision, None), own, "llm", decision, others)
    assert [m.verdict for m in seen.members] == [Verdict.HEALTHY, Verdict.DEAD, None]
    assert seen.step == 7  # the run's step is member 0's (rank 0)


def test_shrinking_a_gang_to_one_pod_deletes_every_member_at_once() -> None:
    one = make_run(None, {"attempt": 1})
    pods = tuple(running(1, m) for m in range(3))
    decision = decide(one, pods, spec_hash(one.spec), NOW)
    assert decision.cause is Reason.SPEC_CHANGED and set(decision.delete) == set(pods)


def test_a_member_still_terminating_is_replaced_once_gone() -> None:
    run = gang_run({"attempt": 1})
    leaving = member(1, 2, phase="Running", node="gpu-2", deleting=True)
    decision = decide(run, (running(1, 0), running(1, 1), leaving), spec_hash(run.spec), NOW)
    assert not decision.create and decision.replace == ()
