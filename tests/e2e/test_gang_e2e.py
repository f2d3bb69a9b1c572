"""Gangs on kwok nodes: placed whole, or told Unschedulable and held off, mended member by member.

Every member is placed on its own node with a stable name; a gang larger than its nodes is told
as Unschedulable, taken down whole, then placed once nodes appear; a member whose node is lost,
or whose agent finds ghost memory on its node, is replaced alone on another node. Each of those,
and a rank failure a member's agent reports, is one gang restart: the operator records the next
generation once and writes it on every member's Lease.

kwok simulates the members' kubelets (no trainer runs): these scenarios prove what the operator
does with the pods, the Service and the status, not a rendezvous (process-backed nodes share one
address and have no cluster DNS, so a real one cannot run here).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from operator_proc import POOL_LABEL, apply, condition, get_json, pods_of, pool_run

from trainguard.api.constants import (
    ANNOTATION_ENV_CONFIG,
    ANNOTATION_GANG_GENERATION,
    ANNOTATION_VERDICT,
    ANNOTATION_VERDICT_GENERATION,
    ANNOTATION_VERDICT_SINCE,
    LABEL_MEMBER,
    Verdict,
)
from trainguard.operator.build.names import rbac_name
from trainguard.operator.policies.lifecycle import GANG_RETRY_SECONDS, GANG_UNSCHEDULABLE_SECONDS
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.nodes import gpu_node
from trainguard_dev.testing.podenv import config_map_data, container_environment
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
pytest_plugins = ("operator_fixtures",)

# Each member asks for a whole node's GPUs (kwok GPU nodes have 8): one member per node.
WHOLE_NODE = {"resources": {"gpus": 8}, "procsPerNode": 1}


def gang(pool: str, name: str, nodes: int) -> dict[str, Any]:
    return pool_run(pool, name, {"trainer": {**WHOLE_NODE, "nodes": nodes}})


def run_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return get_json(cluster, "trainingrun", name, "-n", namespace)


def progressing(cluster: Cluster, namespace: str, name: str, reason: str, says: str) -> Any:
    """The run once its Progressing condition has `reason` and a message containing `says`."""
    found = condition(run_of(cluster, namespace, name), "Progressing")
    return found if found and found["reason"] == reason and says in found["message"] else None


@pytest.fixture
def extra_node(cluster: Cluster, namespace: str) -> Iterator[str]:
    """The name of a third pool node, added by the test itself; deleted afterwards."""
    name = f"{namespace}-gpu-2"
    try:
        yield name
    finally:
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def test_a_gang_places_each_member_on_its_own_node_with_a_stable_name(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, gang(node_pool, "pair", 2))
    run = eventually(
        lambda: (
            (r := run_of(cluster, namespace, "pair")).get("status", {}).get("membersReady") == "2/2"
            and r
        ),
        60,
        "both members running",
    )
    status = run["status"]
    assert status["phase"] == "Running" and status["attempt"] == 1
    members = status["members"]
    assert [(m["index"], m["pod"], m["phase"]) for m in members] == [
        (0, "pair-1-0", "Running"),
        (1, "pair-1-1", "Running"),
    ]
    assert len({m["node"] for m in members}) == 2
    found = condition(run, "Progressing")
    assert found is not None and "all 2 members running" in found["message"]
    pods = {p["metadata"]["name"]: p for p in pods_of(cluster, namespace, "pair")}
    assert sorted(pods) == ["pair-1-0", "pair-1-1"]
    for index in range(2):
        pod = pods[f"pair-1-{index}"]
        assert pod["spec"]["hostname"] == f"pair-{index}"
        assert pod["spec"]["subdomain"] == "pair-gang"
        assert pod["metadata"]["labels"][LABEL_MEMBER] == str(index)
        trainer = pod["spec"]["containers"][0]
        config = pod["metadata"]["annotations"][ANNOTATION_ENV_CONFIG]
        shared = get_json(cluster, "configmap", config, "-n", namespace)
        told = container_environment(trainer, config_map_data(shared))
        assert told["TRAINGUARD_NODE_RANK"] == str(index)
        assert told["TRAINGUARD_NNODES"] == "2"
        assert told["TRAINGUARD_MASTER_ADDR"] == "pair-0.pair-gang"
    service = get_json(cluster, "service", "pair-gang", "-n", namespace)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["metadata"]["ownerReferences"][0]["name"] == "pair"
    leases = get_json(cluster, "leases", "-n", namespace)["items"]
    assert {lease["metadata"]["name"] for lease in leases} >= {
        "pair-heartbeat",
        "pair-heartbeat-1",
    }
    wide = cluster.kubectl("get", "tr", "pair", "-n", namespace, "-o", "wide").stdout
    header, row = wide.splitlines()[:2]
    assert "MEMBERS" in header.split() and "2/2" in row.split()


def test_a_gang_larger_than_its_nodes_holds_none_until_nodes_appear(
    cluster: Cluster,
    namespace: str,
    node_pool: str,
    extra_node: str,
    operator: OperatorProcess,
) -> None:
    # Three members, two nodes: one member cannot be placed.
    apply(cluster, namespace, gang(node_pool, "trio", 3))
    eventually(
        lambda: progressing(
            cluster, namespace, "trio", "Unschedulable", "1 of 3 members cannot be scheduled"
        ),
        30 + GANG_UNSCHEDULABLE_SECONDS,
        "the gang's members reported unschedulable",
    )
    found = eventually(
        lambda: progressing(
            cluster, namespace, "trio", "Unschedulable", "1 of 3 members could not be placed"
        ),
        30 + GANG_UNSCHEDULABLE_SECONDS,
        "the gang taken down",
    )
    assert found["status"] == "False"
    assert found["message"].startswith("gang trio (attempt 1): ")
    assert "every member deleted" in found["message"]
    # No partial gang is left: the placed members are deleted with the unplaced one.
    eventually(lambda: pods_of(cluster, namespace, "trio") == [], 30, "every member deleted")
    status = run_of(cluster, namespace, "trio")["status"]
    assert status["phase"] == "Pending" and status.get("members", []) == []
    assert status["gangRetryTime"] and status["restarts"] == 0
    warnings = [
        e
        for e in get_json(cluster, "events", "-n", namespace)["items"]
        if e["involvedObject"]["name"] == "trio" and e["reason"] == "Unschedulable"
    ]
    assert warnings and warnings[0]["type"] == "Warning"

    # A third node appears: the next try places the whole gang (not counted as a restart).
    node = gpu_node(extra_node)
    node["metadata"]["labels"][POOL_LABEL] = node_pool
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(node))
    run = eventually(
        lambda: (
            (r := run_of(cluster, namespace, "trio")).get("status", {}).get("membersReady") == "3/3"
            and r
        ),
        GANG_RETRY_SECONDS + 60,
        "the whole gang running after the retry",
    )
    status = run["status"]
    assert status["attempt"] == 2 and status["restarts"] == 0
    assert "gangRetryTime" not in status
    assert sorted(p["metadata"]["name"] for p in pods_of(cluster, namespace, "trio")) == [
        "trio-2-0",
        "trio-2-1",
        "trio-2-2",
    ]


def pair_running_with_a_spare_node(
    cluster: Cluster, namespace: str, node_pool: str, extra_node: str
) -> dict[str, Any]:
    """Gang "pair" of 2 running on a pool with a third node to spare; its pods by name."""
    node = gpu_node(extra_node)
    node["metadata"]["labels"][POOL_LABEL] = node_pool
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(node))
    apply(cluster, namespace, gang(node_pool, "pair", 2))
    eventually(
        lambda: run_of(cluster, namespace, "pair").get("status", {}).get("membersReady") == "2/2",
        60,
        "both members running",
    )
    return {p["metadata"]["name"]: p for p in pods_of(cluster, namespace, "pair")}


def member_1_replaced(
    cluster: Cluster, namespace: str, first: dict[str, Any]
) -> dict[str, Any] | None:
    """The pair's pods by name once member 1 is a new pod and Running, else None."""
    pods = {p["metadata"]["name"]: p for p in pods_of(cluster, namespace, "pair")}
    again = pods.get("pair-1-1")
    if again is None or again["metadata"]["uid"] == first["pair-1-1"]["metadata"]["uid"]:
        return None
    return pods if again.get("status", {}).get("phase") == "Running" else None


def as_agent(namespace: str, run: str) -> str:
    """The kubectl option that writes as the run's agent.

    Where the chart's admission policy is installed, only the agent's ServiceAccount (and the
    operator) may write a heartbeat Lease.
    """
    return f"--as=system:serviceaccount:{namespace}:{rbac_name(run)}"


def gang_told(cluster: Cluster, namespace: str, run: str, members: int) -> list[str]:
    """The generation written on each member's Lease, member by member ("" where none)."""
    names = [f"{run}-heartbeat", *(f"{run}-heartbeat-{m}" for m in range(1, members))]
    return [
        (
            get_json(cluster, "lease", name, "-n", namespace)["metadata"].get("annotations") or {}
        ).get(ANNOTATION_GANG_GENERATION, "")
        for name in names
    ]


def gang_restarts(cluster: Cluster, namespace: str, run: str) -> list[dict[str, Any]]:
    return [
        e
        for e in get_json(cluster, "events", "-n", namespace)["items"]
        if e["involvedObject"]["name"] == run and e["reason"] == "GangRestart"
    ]


def assert_one_gang_restart(
    cluster: Cluster, namespace: str, status: dict[str, Any], cause: str
) -> None:
    """Generation 1, caused by member 1, recorded once and told to both members."""
    restart = status["gangRestart"]
    assert (restart["generation"], restart["member"], restart["cause"]) == (1, 1, cause)
    eventually(
        lambda: gang_told(cluster, namespace, "pair", 2) == ["1", "1"],
        30,
        "generation 1 on both members' Leases",
    )
    (told,) = gang_restarts(cluster, namespace, "pair")
    assert told["type"] == "Warning" and "generation 1" in told["message"]


def test_a_member_whose_node_is_lost_is_replaced_alone_on_another_node(
    cluster: Cluster,
    namespace: str,
    node_pool: str,
    extra_node: str,
    operator: OperatorProcess,
) -> None:
    first = pair_running_with_a_spare_node(cluster, namespace, node_pool, extra_node)
    lost_node = first["pair-1-1"]["spec"]["nodeName"]
    # Member 1's agent renewed its Lease a minute ago, then its node vanished: no kubelet,
    # no agent (kwok runs none, so the renewal is written here as the agent writes it).
    renewed = (datetime.now(UTC) - timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    cluster.kubectl(
        as_agent(namespace, "pair"), "patch", "lease", "pair-heartbeat-1", "-n", namespace,
        "--type=merge", "-p",
        json.dumps({"spec": {"holderIdentity": "pair-1-1", "renewTime": renewed}}),
    )  # fmt: skip
    cluster.kubectl("delete", "node", lost_node)

    pods = eventually(
        lambda: member_1_replaced(cluster, namespace, first), 60, "member 1 replaced and running"
    )
    assert sorted(pods) == ["pair-1-0", "pair-1-1"]
    assert pods["pair-1-1"]["spec"]["nodeName"] not in (lost_node, None)
    # Member 0 kept its pod; the gang stayed in its attempt.
    assert pods["pair-1-0"]["metadata"]["uid"] == first["pair-1-0"]["metadata"]["uid"]
    status = eventually(
        lambda: (
            (s := run_of(cluster, namespace, "pair")["status"]).get("membersReady") == "2/2" and s
        ),
        30,
        "the gang running again",
    )
    assert status["attempt"] == 1 and status["restarts"] == 1
    assert [e["node"] for e in status["excludedNodes"]] == [lost_node]
    assert status["excludedNodes"][0]["reason"] == "NodeLost"
    # Member 0's ranks wait on a peer that will not answer: told to restart at once.
    assert_one_gang_restart(cluster, namespace, status, "NodeLost")
    terms = pods["pair-1-1"]["spec"]["affinity"]["nodeAffinity"]
    fields = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert fields[0]["matchFields"][0]["values"] == [lost_node]
    assert "affinity" not in pods["pair-1-0"]["spec"]


def test_a_member_whose_agent_finds_ghost_memory_is_moved_alone_off_its_node(
    cluster: Cluster,
    namespace: str,
    node_pool: str,
    extra_node: str,
    operator: OperatorProcess,
) -> None:
    first = pair_running_with_a_spare_node(cluster, namespace, node_pool, extra_node)
    sick_node = first["pair-1-1"]["spec"]["nodeName"]
    # Member 1's agent reads memory no live process holds on its node's GPUs and says so in its
    # Lease (kwok runs no agent, so the renewal is written here as the agent writes it). An
    # agent starts after its pod's creation second (`creationTimestamp` has whole seconds; a
    # renewal within it reads as the predecessor's), and so does this one.
    created = datetime.fromisoformat(first["pair-1-1"]["metadata"]["creationTimestamp"])
    time.sleep(max(0.0, (created + timedelta(seconds=1) - datetime.now(UTC)).total_seconds()))
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    cluster.kubectl(
        as_agent(namespace, "pair"), "patch", "lease", "pair-heartbeat-1", "-n", namespace,
        "--type=merge", "-p",
        json.dumps({
            "metadata": {"annotations": {ANNOTATION_VERDICT: Verdict.GHOST_MEMORY.value}},
            "spec": {"holderIdentity": "pair-1-1", "renewTime": now},
        }),
    )  # fmt: skip

    pods = eventually(
        lambda: member_1_replaced(cluster, namespace, first), 90, "member 1 replaced and running"
    )
    assert pods["pair-1-1"]["spec"]["nodeName"] not in (sick_node, None)
    # Member 0 kept its pod; the gang stayed in its attempt; the stale Lease (the replaced pod's
    # word) does not move the replacement.
    assert pods["pair-1-0"]["metadata"]["uid"] == first["pair-1-0"]["metadata"]["uid"]
    status = eventually(
        lambda: (
            (s := run_of(cluster, namespace, "pair")["status"]).get("membersReady") == "2/2" and s
        ),
        30,
        "the gang running again",
    )
    assert status["attempt"] == 1
    assert [(e["node"], e["reason"]) for e in status["excludedNodes"]] == [
        (sick_node, Verdict.GHOST_MEMORY.value)
    ]
    reasons = [
        e["reason"]
        for e in get_json(cluster, "events", "-n", namespace)["items"]
        if e["involvedObject"]["name"] == "pair"
    ]
    assert Verdict.GHOST_MEMORY.value in reasons
    later = {p["metadata"]["name"]: p for p in pods_of(cluster, namespace, "pair")}
    assert later["pair-1-1"]["metadata"]["uid"] == pods["pair-1-1"]["metadata"]["uid"]
    assert_one_gang_restart(cluster, namespace, status, Verdict.GHOST_MEMORY.value)


def renew_as_agent(
    cluster: Cluster, namespace: str, member: int, verdict: Verdict, generation: int
) -> None:
    """What member `member`'s agent writes (kwok runs no agent, so the renewal is written here)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    name = "pair-heartbeat" if member == 0 else f"pair-heartbeat-{member}"
    annotations = {
        ANNOTATION_VERDICT: verdict.value,
        ANNOTATION_VERDICT_SINCE: now,
        ANNOTATION_VERDICT_GENERATION: str(generation),
    }
    cluster.kubectl(
        as_agent(namespace, "pair"), "patch", "lease", name, "-n", namespace, "--type=merge", "-p",
        json.dumps({
            "metadata": {"annotations": annotations},
            "spec": {"holderIdentity": f"pair-1-{member}", "renewTime": now},
        }),
    )  # fmt: skip


def test_a_rank_failure_on_member_1_is_one_gang_restart_told_to_every_member(
    cluster: Cluster,
    namespace: str,
    node_pool: str,
    extra_node: str,
    operator: OperatorProcess,
) -> None:
    first = pair_running_with_a_spare_node(cluster, namespace, node_pool, extra_node)
    renew_as_agent(cluster, namespace, 0, Verdict.HEALTHY, 0)
    # A rank of member 1 died in a launch of generation 0.
    renew_as_agent(cluster, namespace, 1, Verdict.DEAD, 0)
    status = eventually(
        lambda: run_of(cluster, namespace, "pair").get("status", {}).get("gangRestart"),
        30,
        "a gang restart recorded",
    )
    assert (status["generation"], status["member"], status["cause"]) == (1, 1, "Dead")
    eventually(
        lambda: gang_told(cluster, namespace, "pair", 2) == ["1", "1"],
        30,
        "generation 1 on both members' Leases",
    )
    # Member 0's ranks then fail with the broken collective, a launch of generation 0 too:
    # the same failure, ordered once.
    renew_as_agent(cluster, namespace, 0, Verdict.DEAD, 0)
    run = eventually(
        lambda: (r := run_of(cluster, namespace, "pair"))["status"].get("verdict") == "Dead" and r,
        30,
        "member 0's Dead in the status",
    )
    assert run["status"]["gangRestart"]["generation"] == 1
    assert [m.get("generation") for m in run["status"]["members"]] == [0, 0]
    assert len(gang_restarts(cluster, namespace, "pair")) == 1
    # No pod was replaced: the members restart their ranks in place.
    pods = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(cluster, namespace, "pair")
    }
    assert pods == {name: pod["metadata"]["uid"] for name, pod in first.items()}
