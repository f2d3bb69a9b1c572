"""Ghost VRAM, end to end: memory held after a death moves the run to a fresh node.

Real operator, agent, supervisor and trainer on the process-backed nodes, and a real S3 server
(SeaweedFS on loopback) as the run's remote layer, its keys in a Secret that only the agent and
the restore step mount. Once a checkpoint is verified on S3, node A's simulated GPU keeps
memory that no process accounts for and the training process is SIGKILLed: the supervisor
restarts it in place, but the dead process's memory is never released. The agent reports it
past the release bound (GhostMemory, its cause GPUMemoryNotReleased); the operator taints
node A, excludes it, and creates attempt 2, which lands on node B with an empty L1, restores
the newest checkpoint from S3 and trains on. A watch of the run's pods shows that nothing of
the run is placed on A again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, events_of, get_json
from recovery_helpers import bound_pod, status_of

from trainguard.api.constants import (
    LABEL_RUN,
    SECRET_KEY_S3_ACCESS_KEY_ID,
    SECRET_KEY_S3_ENDPOINT_URL,
    SECRET_KEY_S3_SECRET_ACCESS_KEY,
    TAINT_UNHEALTHY,
)
from trainguard.contract.files import read_json
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.pods import heartbeat, state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess, stop_process
from trainguard_dev.testing.runs import make_shards, reference_run
from trainguard_dev.testing.servers import S3_ACCESS_KEY, S3_SECRET_KEY, SeaweedFS

pytest_plugins = ("operator_fixtures", "integration.s3_fixtures")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

RUN = "ghost"
SECRET = "s3-credentials"
LAYER = "s3"
EVERY_STEPS = 20
# Under the ghost threshold (2048 MiB): alone, on a live trainer, it is no verdict; left by a
# death, it is memory not released.
GHOST_MIB = 1024
RELEASE_SECONDS = 3
CAUSE = "GPUMemoryNotReleased"


def _secret(seaweedfs: SeaweedFS) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET},
        "stringData": {
            SECRET_KEY_S3_ACCESS_KEY_ID: S3_ACCESS_KEY,
            SECRET_KEY_S3_SECRET_ACCESS_KEY: S3_SECRET_KEY,
            SECRET_KEY_S3_ENDPOINT_URL: seaweedfs.endpoint,
        },
    }


def _run(shards: Path, bucket: str) -> dict[str, Any]:
    layer = {"name": LAYER, "uri": f"s3://{bucket}/{RUN}", "credentialsSecret": {"name": SECRET}}
    return reference_run(
        RUN,
        shards,
        EVERY_STEPS,
        {
            "checkpoints": {"flushTimeoutSeconds": 5, "remote": [layer]},
            "monitor": {
                "startupGraceSeconds": 5,
                "ghostMemory": {"releaseTimeoutSeconds": RELEASE_SECONDS},
            },
            "recovery": {"backoff": {"initialSeconds": 1, "maxSeconds": 10}},
        },
    )


class PodWatch:
    """Every (pod, node) binding of the run's pods, as a `kubectl get --watch` streams them."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        template = '{.metadata.name}{" "}{.spec.nodeName}{"\\n"}'
        self.process = subprocess.Popen(
            [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig),
             "get", "pods", "-n", namespace, "-l", f"{LABEL_RUN}={RUN}", "--watch",
             "-o", f"jsonpath={template}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.bindings: set[tuple[str, str]] = set()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            name, _, node = line.strip().partition(" ")
            if name and node:
                self.bindings.add((name, node))

    def stop(self) -> set[tuple[str, str]]:
        """Stop watching; every binding seen."""
        stop_process(self.process)
        self._thread.join(timeout=10)
        return set(self.bindings)


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """A few synthetic token shards, the data source of the run."""
    return make_shards(tmp_path / "shards")


@pytest.mark.parametrize("operator", ["chart-rbac"], indirect=True)
def test_memory_held_after_a_death_moves_the_run_to_a_fresh_node_restored_from_s3(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    shards: Path,
    seaweedfs: SeaweedFS,
    bucket: str,
    process_nodes: list[str],
) -> None:
    assert len(process_nodes) >= 2, process_nodes
    watch = PodWatch(cluster, namespace)
    try:
        apply(cluster, namespace, _secret(seaweedfs), _run(shards, bucket))
        first = eventually(lambda: bound_pod(cluster, namespace, RUN, 1), what="attempt 1 bound")
        node_a = first["spec"]["nodeName"]
        state_a = state_dir(cluster.root, first)

        # Trained, and a checkpoint verified on the S3 layer, as the run's status says.
        def shipped() -> int | None:
            layers = {
                c["layer"]: c for c in status_of(cluster, namespace, RUN).get("checkpoints", [])
            }
            s3 = layers.get(LAYER, {})
            return s3.get("step") if s3.get("verified") and s3.get("step") else None

        shipped_step = eventually(shipped, timeout=180, what="a checkpoint verified on S3")
        listed = seaweedfs.client().list_objects_v2(Bucket=bucket, Prefix=f"{RUN}/")
        assert any(o["Key"].endswith("MANIFEST.json") for o in listed.get("Contents", []))
        eventually(
            lambda: status_of(cluster, namespace, RUN).get("verdict") == "Healthy",
            what="Healthy verdict in the status",
        )

        # Node A's GPU keeps memory no process accounts for, and the trainer dies.
        before = eventually(lambda: heartbeat(state_a), what="heartbeat")
        sim = cluster.root / "procnodes" / node_a / "gpu-sim.json"
        sim.write_text(json.dumps({"ghost_mib": GHOST_MIB}))
        os.kill(int(before["pid"]), signal.SIGKILL)
        killed_at = time.monotonic()

        def tainted() -> str | None:
            node = get_json(cluster, "node", node_a)
            taints = node["spec"].get("taints") or []
            ours = [t for t in taints if t["key"] == TAINT_UNHEALTHY]
            return ours[0]["value"] if ours and ours[0]["effect"] == "NoSchedule" else None

        cause = eventually(tainted, timeout=60, what=f"{node_a} tainted {TAINT_UNHEALTHY}")
        tainted_s = time.monotonic() - killed_at
        assert cause == CAUSE, cause
        status = status_of(cluster, namespace, RUN)
        excluded = {e["node"]: e["reason"] for e in status.get("excludedNodes", [])}
        assert excluded == {node_a: cause}
        failure = status["lastFailure"]
        assert (failure["cause"], failure["node"], failure["attempt"]) == (cause, node_a, 1)
        assert "not released" in failure["message"], failure["message"]
        assert status["verdict"] == "GhostMemory"

        # Attempt 2 on the other node, with nothing of A's disk: restored from S3.
        second = eventually(
            lambda: bound_pod(cluster, namespace, RUN, 2), timeout=90, what="attempt 2 bound"
        )
        node_b = second["spec"]["nodeName"]
        assert node_b != node_a
        state_b = state_dir(cluster.root, second)
        restored = eventually(
            lambda: read_json(state_b / "restore.json"), timeout=90, what="attempt 2 restored"
        )
        assert restored["from_layer"] == LAYER, restored
        assert restored["step"] >= shipped_step, (restored, shipped_step)

        def trained_on() -> dict[str, Any] | None:
            beat = heartbeat(state_b)
            return beat if beat and (beat.get("step") or 0) > restored["step"] else None

        eventually(trained_on, timeout=120, what="training on B past the restored step")
        eventually(
            lambda: (
                (s := status_of(cluster, namespace, RUN)).get("node") == node_b
                and s.get("attempt") == 2
                and (s.get("step") or 0) > restored["step"]
            ),
            timeout=60,
            what="the status following attempt 2 on B",
        )
        events = events_of(cluster, namespace, RUN)
        reasons = {e["reason"] for e in events}
        assert {"Dead", "VerdictGhostMemory", CAUSE, "Restored"} <= reasons, reasons
        told = [e["message"] for e in events if e["reason"] == "Restored"]
        assert any(f"step {restored['step']} from layer {LAYER}" in m for m in told), told

        # The keys reached the agent and the restore step only, and nothing ever printed them.
        containers = {c["name"]: c for c in [*first["spec"]["initContainers"],
                                             *first["spec"]["containers"]]}  # fmt: skip
        secrets_env = {"name": "TRAINGUARD_LAYER_SECRETS_S3", "value": "/trainguard/credentials/s3"}
        for name in ("agent", "restore"):
            assert secrets_env in containers[name]["env"], name
        trainer = containers["trainer"]
        assert not [m for m in trainer["volumeMounts"] if m["name"].startswith("credentials-")]
        assert not [e for e in trainer["env"] if "SECRETS" in e["name"]]
        logs = [p.read_text() for d in (state_a, state_b) for p in d.parents[1].glob("*.log")]
        said = [
            json.dumps(status_of(cluster, namespace, RUN)),
            *(e["message"] for e in events),
            *logs,
        ]
        assert len(logs) >= 8, logs  # agent, preflight, stage-data, restore, trainer per pod
        assert not [t for t in said if S3_SECRET_KEY in t or S3_ACCESS_KEY in t]
    finally:
        bindings = watch.stop()
    print(f"ghost memory -> {node_a} tainted in {tainted_s:.1f} s; restored step "
          f"{restored['step']} from {LAYER} on {node_b}")  # fmt: skip
    # Nothing of the run is placed on A after attempt 1: the watch saw every binding.
    on_a = {name for name, node in bindings if node == node_a}
    assert on_a == {f"{RUN}-1"}, bindings
    assert (f"{RUN}-2", node_b) in bindings
