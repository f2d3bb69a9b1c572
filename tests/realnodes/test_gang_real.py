"""A gang of two member pods on two real nodes: the trainer image's supervisor and torchrun.

Two pods of the trainer image built here, one on each real node, as a gang's members are: a
headless Service, each pod's hostname under it as its subdomain, and the pod contract's gang
variables (TRAINGUARD_NNODES, NODE_RANK, MASTER_ADDR = member 0's name, MASTER_PORT). Each
runs `trainguard supervise` with two ranks of the reference trainer (DDP, gloo), so one world
of four ranks spans the two nodes through the cluster's DNS and pod network. Only rank 0
saves, in member 0's L1 (an emptyDir); member 1 keeps no checkpoint.

SIGKILL of one rank on member 1 (through `kubectl exec`, as a user could): member 0's ranks
fail at their next collective, both supervisors restart their ranks in place (no pod is
recreated), and all four resume from one step, member 1's from rank 0's copy. The pods are
made here, not by the operator: this proves the members' side of a gang on real nodes.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from realnodes.conftest import RUNS_NAMESPACE, Trainguard, apply_in_runs, kubectl_json
from trainguard.contract import env
from trainguard_dev.cluster import realnode
from trainguard_dev.testing.polling import eventually

pytestmark = [pytest.mark.realnodes, pytest.mark.timeout(420, func_only=True)]

GANG = "gang-real"
MEMBERS = 2
RANKS = 2
EVERY = 10
NODES = [realnode.node_name(i) for i in range(MEMBERS)]
STATE = "/trainguard/state"
L1 = "/trainguard/l1"
DATA = "/trainguard/data"
TRAIN = [
    "python", "-m", "trainguard_harness.train", "--data-dir", DATA, "--steps", "100000",
    "--ckpt-every-steps", str(EVERY), "--keep-last", "3", "--min-step-seconds", "0.1",
    "--preset", "tiny", "--block-size", "32", "--batch-size", "4", "--threads", "1",
]  # fmt: skip
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def member(trainguard: Trainguard, index: int, claim: str) -> dict[str, Any]:
    """Member `index`'s pod, pinned to its real node."""
    contract = {
        env.NNODES: str(MEMBERS),
        env.NODE_RANK: str(index),
        env.MASTER_ADDR: f"{GANG}-0.{GANG}",
        env.MASTER_PORT: str(env.DEFAULT_MASTER_PORT),
        env.PROCS_PER_NODE: str(RANKS),
        env.L1_DIR: L1,
        env.STATE_DIR: STATE,
        "PYTHONUNBUFFERED": "1",
    }
    mounts = [
        {"name": "data", "mountPath": DATA, "readOnly": True},
        {"name": "l1", "mountPath": L1},
        {"name": "state", "mountPath": STATE},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{GANG}-{index}", "labels": {"gang": GANG}},
        "spec": {
            "nodeName": NODES[index],
            "hostname": f"{GANG}-{index}",
            "subdomain": GANG,
            "restartPolicy": "Never",
            "securityContext": {"fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "trainer",
                    "image": trainguard.trainer_image.ref,
                    "imagePullPolicy": "Never",
                    "command": ["trainguard", "supervise", "--no-gpu", "--backoff", "0.2", "--"],
                    "args": TRAIN,
                    "env": [{"name": k, "value": v} for k, v in contract.items()],
                    "securityContext": RESTRICTED,
                    "volumeMounts": mounts,
                }
            ],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
                {"name": "l1", "emptyDir": {}},
                {"name": "state", "emptyDir": {}},
            ],
        },
    }


def read_in(trainguard: Trainguard, index: int, path: str) -> Any:
    """A JSON file of member `index`'s trainer container (None if absent)."""
    script = (
        "import json, pathlib, sys\n"
        f"p = pathlib.Path({path!r})\n"
        "print(p.read_text() if p.exists() else 'null')\n"
    )
    out = trainguard.cluster.kubectl(
        "exec", "-n", RUNS_NAMESPACE, f"{GANG}-{index}", "-c", "trainer", "--",
        "python", "-c", script, check=False, timeout=30,
    )  # fmt: skip
    if out.returncode != 0:
        return None
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        return None


def supervisor(trainguard: Trainguard, index: int) -> dict[str, Any]:
    return read_in(trainguard, index, f"{STATE}/supervisor.json") or {}


def rank_pids(trainguard: Trainguard, index: int) -> dict[int, int]:
    state = supervisor(trainguard, index)
    return {int(rank): int(pid) for rank, pid in (state.get("rank_pids") or {}).items()}


def rank_steps(trainguard: Trainguard, index: int) -> list[int | None]:
    beats = [read_in(trainguard, index, f"{STATE}/heartbeat-{r}.json") for r in range(RANKS)]
    return [b.get("step") if b else None for b in beats]


def logs(trainguard: Trainguard, index: int) -> str:
    out = trainguard.cluster.kubectl(
        "logs", "-n", RUNS_NAMESPACE, f"{GANG}-{index}", "-c", "trainer", check=False
    )
    return str(out.stdout)


def test_a_gang_across_two_real_nodes_restarts_in_place_from_one_step(
    trainguard: Trainguard, shards_claim: str
) -> None:
    cluster = trainguard.cluster
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": GANG},
        "spec": {"clusterIP": "None", "selector": {"gang": GANG}, "publishNotReadyAddresses": True},
    }
    apply_in_runs(cluster, service, *(member(trainguard, i, shards_claim) for i in range(MEMBERS)))
    try:

        def detail() -> str:
            return "\n".join(f"member {i}:\n{logs(trainguard, i)[-3000:]}" for i in range(MEMBERS))

        def training_past_a_checkpoint() -> dict[int, int] | None:
            pids = [rank_pids(trainguard, i) for i in range(MEMBERS)]
            steps = [s for i in range(MEMBERS) for s in rank_steps(trainguard, i)]
            if any(len(p) != RANKS for p in pids) or any(s is None for s in steps):
                return None
            return pids[1] if min(s or 0 for s in steps) > 2 * EVERY + 2 else None

        first = eventually(
            training_past_a_checkpoint, 240, "four ranks past a checkpoint", 1.0, detail=detail
        )
        before = [rank_pids(trainguard, i) for i in range(MEMBERS)]
        cluster.kubectl(
            "exec", "-n", RUNS_NAMESPACE, f"{GANG}-1", "-c", "trainer", "--",
            "python", "-c", f"import os; os.kill({first[1]}, 9)", timeout=30,
        )  # fmt: skip

        def restarted() -> bool:
            now = [rank_pids(trainguard, i) for i in range(MEMBERS)]
            fresh = all(
                len(p) == RANKS and not set(p.values()) & set(old.values())
                for p, old in zip(now, before, strict=True)
            )
            steps = [s for i in range(MEMBERS) for s in rank_steps(trainguard, i)]
            return fresh and all(steps)

        eventually(
            restarted, 240, "every member's ranks restarted and training", 1.0, detail=detail
        )
        # In place: the same two pods, each supervisor on its second launch.
        pods = kubectl_json(cluster, "get", "pods", "-n", RUNS_NAMESPACE, "-l", f"gang={GANG}")
        assert sorted(p["metadata"]["name"] for p in pods["items"]) == [f"{GANG}-0", f"{GANG}-1"]
        assert all(p["status"]["phase"] == "Running" for p in pods["items"])
        for index in range(MEMBERS):
            assert len(supervisor(trainguard, index)["history"]) == 2
        failure = supervisor(trainguard, 1)["rank_failure"]
        assert (failure["rank"], failure["pid"], failure["signal"]) == (1, first[1], "SIGKILL")

        def resumed() -> dict[str, str] | None:
            found: dict[str, str] = {}
            for index in range(MEMBERS):
                found.update(
                    re.findall(r"rank (\d) resumed from \S*step-(\d{8})", logs(trainguard, index))
                )
            return found if len(found) == MEMBERS * RANKS else None

        steps = eventually(resumed, 60, "every rank's resume in the logs", 1.0, detail=detail)
        assert len(set(steps.values())) == 1, steps
        assert int(steps["0"]) >= 2 * EVERY  # member 0's newest, in its L0 or its L1
        # Member 1 keeps no checkpoint: its ranks resumed from rank 0's copy.
        out = cluster.kubectl(
            "exec", "-n", RUNS_NAMESPACE, f"{GANG}-1", "-c", "trainer", "--",
            "python", "-c", f"import json, os; print(json.dumps(os.listdir({L1!r})))", timeout=30,
        )  # fmt: skip
        assert not [n for n in json.loads(out.stdout) if n.startswith("step-")], out.stdout
    finally:
        cluster.kubectl(
            "delete", "pod,service", "-n", RUNS_NAMESPACE, "-l", f"gang={GANG}",
            "--wait=false", check=False,
        )  # fmt: skip
        cluster.kubectl(
            "delete", "service", GANG, "-n", RUNS_NAMESPACE, "--wait=false", check=False
        )
