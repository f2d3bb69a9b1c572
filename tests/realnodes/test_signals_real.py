"""Honest signals on real nodes: what the e2e tier shows on process-backed nodes, shown here.

The chart's operator runs in-cluster on a real node (`trainguard`), the runs are the reference
trainer in the trainer image built here, and each scenario asserts what its e2e version does
(`trainguard_dev.testing.signals`, `tests/full_example.py`); only the plumbing is this tier's:

- the servers (SeaweedFS, the Hub stand-in, sshd) listen on the host's address on the pod
  network, which pods on both real nodes reach;
- the test acts on the trainer as a user could (`kubectl exec` into its container), reads
  its files where the kubelet keeps the pod's state volume, reads the operator's metrics at
  its pod's address, and stops the operator by freezing its container (`ctr task pause`);
- the pods' identity (the full example's `s3` layer has no Secret) is the real nodes'
  environment, which their container runtime gives every container, as a cloud's pod
  identity does (`gpusim_runtime`);
- a real node has the CPUs and memory of this machine, not an H200 host's: the full example's
  trainer asks for less (a site value, like the sizes).

Scenarios: a corrupt remote checkpoint skipped by restore and told (Event, status, metric);
two deaths timed from the agent's verdict start (the detection-latency histogram); data
staged from S3 with its own Secret; examples/full.yaml staging from S3 and shipping to the
Hub, S3, an SSH host and a backup volume.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from full_example import (
    GPU_TAINT,
    HF_TOKEN,
    ExampleSite,
    backup_claim,
    example,
    remote_layers,
    ships_everywhere,
    site_values,
    upload_shards,
)
from integration.hub_standin import HubServer, serving
from realnodes.conftest import (
    RELEASE_NAMESPACE,
    RUNS_NAMESPACE,
    S3_LAYER,
    S3_SECRET,
    Trainguard,
    apply_in_runs,
    bound_pod,
    exec_python,
    kubectl_json,
    pod_state,
    real_run,
    run_events,
    run_pods,
    run_status,
    s3_bucket,
    s3_checkpoints,
    shipped_step,
    training,
)
from trainguard.api.constants import FoundBy, Phase
from trainguard.contract.env import lease_name
from trainguard.contract.files import RESTORE_FILENAME, read_json
from trainguard.layers.base import CHANGED_ON_LAYER
from trainguard.layers.lineage import checkpoint_key
from trainguard.operator.build.constants import Container
from trainguard.operator.build.pod import POD_FS_GROUP
from trainguard_dev.cluster import realnode
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.procnode import claim_dir, shared_claim
from trainguard_dev.demo.env import create_claim
from trainguard_dev.demo.nodes import AGENT_UID
from trainguard_dev.testing.pods import heartbeat
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.runs import make_shards
from trainguard_dev.testing.servers import INSTALL_HINT, SSHD, SeaweedFS, Sshd, start_sshd
from trainguard_dev.testing.signals import (
    VICTIM,
    assert_data_secrets_in_stage_data_alone,
    assert_deaths_timed_from_the_verdict,
    assert_invalid_checkpoint_told,
    assert_staged,
    flip_a_byte,
    invalid_checkpoint_events,
    invalid_checkpoints,
)

# Only the test itself is timed: the session's real nodes, images and chart come from the
# first test's fixtures (minutes on a fresh cache), whose every step is bounded on its own.
pytestmark = [pytest.mark.realnodes, pytest.mark.timeout(420, func_only=True)]

EVERY_STEPS = 10
HTTP_TIMEOUT_S = 5
METRICS_PORT_NAME = "metrics"
# A real node's share of this machine for the full example's trainer (an H200 host's 16 CPUs
# and 200Gi are not here): the reference trainer runs one thread; its container (supervisor,
# launcher, trainer, each with torch loaded) is limited to this memory.
REAL_TRAINER_CPU = 1
REAL_TRAINER_MEMORY = "8Gi"
SHARDS_SECRET = "shards-s3"
STAGED_SHARDS = 8
TRAINED_STEPS = 5
GONE_TIMEOUT_S = 120


# ----- the operator in-cluster ------------------------------------------------------------


def _operator_pod(cluster: Cluster) -> dict[str, Any]:
    pods = kubectl_json(cluster, "get", "pods", "-n", RELEASE_NAMESPACE)["items"]
    (pod,) = [p for p in pods if p["status"].get("phase") == "Running"]
    return dict(pod)


def operator_metrics(cluster: Cluster) -> str:
    """The in-cluster operator's `/metrics`, read at its pod's address on the pod network."""
    pod = _operator_pod(cluster)
    (port,) = [
        p["containerPort"]
        for container in pod["spec"]["containers"]
        for p in container.get("ports", [])
        if p.get("name") == METRICS_PORT_NAME
    ]
    url = f"http://{pod['status']['podIP']}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
        text: str = response.read().decode()
    return text


def _operator_task(trainguard: Trainguard) -> tuple[realnode.RealNode, str]:
    """The operator container's node and its containerd task (the container's id)."""
    pod = _operator_pod(trainguard.cluster)
    (status,) = pod["status"]["containerStatuses"]
    node = trainguard.cluster.real_nodes.node(pod["spec"]["nodeName"])
    return node, str(status["containerID"]).split("://", 1)[1]


# ----- a corrupt remote checkpoint -------------------------------------------------------


def _suspend(cluster: Cluster, name: str, suspend: bool) -> None:
    cluster.kubectl(
        "patch", "trainingrun", name, "-n", RUNS_NAMESPACE, "--type=merge",
        "-p", json.dumps({"spec": {"suspend": suspend}}),
    )  # fmt: skip


def test_a_corrupt_remote_checkpoint_is_skipped_by_restore_and_told(
    trainguard: Trainguard, shards_claim: str, run_name: str, real_s3: SeaweedFS
) -> None:
    """A byte flipped in the newest S3 checkpoint while the run is suspended; then resumed.

    The new attempt's restore step skips it, resumes from the one before, and the finding
    is told: a Warning Event, `status.lastInvalidCheckpoint`, the per-layer count and the
    operator's `trainguard_checkpoints_invalid_total`. The corrupt checkpoint stays on S3.
    """
    cluster = trainguard.cluster
    bucket = s3_bucket(real_s3, cluster)
    layer = {
        "name": S3_LAYER,
        "uri": f"s3://{bucket}/{run_name}",
        "credentialsSecret": {"name": S3_SECRET},
        # The one before the corrupt one is still there to resume from.
        "keep": 3,
    }
    spec = {
        "checkpoints": {"flushTimeoutSeconds": 10, "remote": [layer]},
        "monitor": {"startupGraceSeconds": 5},
    }
    counted = invalid_checkpoints(operator_metrics(cluster), RUNS_NAMESPACE, S3_LAYER)
    training(
        trainguard, real_run(trainguard, run_name, shards_claim, EVERY_STEPS, spec), EVERY_STEPS
    )
    eventually(
        lambda: len(s3_checkpoints(real_s3, bucket, run_name)) >= 2,
        timeout=120,
        what="two checkpoints on S3",
    )
    # Suspended: the newest L1 checkpoint flushed to S3, the pod gone, nothing ships.
    _suspend(cluster, run_name, True)
    eventually(lambda: not run_pods(cluster, run_name), timeout=120, what="the pod gone")
    eventually(
        lambda: run_status(cluster, run_name).get("phase") == Phase.SUSPENDED, what="Suspended"
    )
    shipped = s3_checkpoints(real_s3, bucket, run_name)
    victim = max(shipped)
    assert victim.origin.attempt == 1, shipped
    # The newest the run reported: the newest attempt 2 may resume from (its fence).
    assert victim.step == shipped_step(cluster, run_name), (sorted(shipped), victim)
    before = max(ref.step for ref in shipped if ref.step < victim.step)
    s3 = real_s3.client()
    key = f"{run_name}/{checkpoint_key(victim, VICTIM)}"
    data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=key, Body=flip_a_byte(data))

    _suspend(cluster, run_name, False)
    pod = eventually(
        lambda: bound_pod(cluster, run_name, 2), timeout=60, what="attempt 2 bound to a node"
    )
    state = pod_state(trainguard, pod)
    restored = eventually(
        lambda: read_json(state / RESTORE_FILENAME), timeout=120, what="attempt 2 restored"
    )
    assert (restored["from_layer"], restored["step"]) == (S3_LAYER, before), restored

    def told() -> list[dict[str, Any]]:
        last = run_status(cluster, run_name).get("lastInvalidCheckpoint") or {}
        events = invalid_checkpoint_events(run_events(cluster, run_name))
        return events if last.get("step") == victim.step and events else []

    events = eventually(told, timeout=60, what="the corrupt checkpoint told")
    assert_invalid_checkpoint_told(
        run_status(cluster, run_name),
        events,
        layer=S3_LAYER,
        step=victim.step,
        file=VICTIM,
        reason=CHANGED_ON_LAYER,
        found=FoundBy.RESTORE,
        attempt=2,
    )
    eventually(
        lambda: (
            invalid_checkpoints(operator_metrics(cluster), RUNS_NAMESPACE, S3_LAYER) == counted + 1
        ),
        timeout=30,
        what="the invalid checkpoint counted in the operator's metrics",
    )
    eventually(
        lambda: ((heartbeat(state) or {}).get("step") or 0) > victim.step,
        timeout=120,
        what="training past the corrupt checkpoint's step",
    )
    # Kept, never deleted: the corrupt checkpoint is still on S3.
    assert victim in s3_checkpoints(real_s3, bucket, run_name)
    print(f"corrupt s3 step {victim.step}: skipped, restored step {before}; {events[0]['message']}")


# ----- detection latency ------------------------------------------------------------------


@dataclass
class RealNodeRun:
    """A run on a real node, and the levers a user or an operator of the cluster has on it."""

    trainguard: Trainguard
    name: str
    pod: str
    state: Path
    namespace: str = RUNS_NAMESPACE

    def status(self) -> dict[str, Any]:
        """The run's status."""
        return run_status(self.trainguard.cluster, self.name)

    def heartbeat(self) -> dict[str, Any] | None:
        """The trainer's heartbeat in the pod's state volume."""
        return heartbeat(self.state)

    def kill_trainer(self, pid: int) -> None:
        """SIGKILL from inside the trainer container (its own user), as a crash would."""
        exec_python(
            self.trainguard.cluster, self.pod, Container.TRAINER, f"import os; os.kill({pid}, 9)"
        )

    def lease_annotations(self) -> dict[str, str]:
        """The run's Lease's annotations."""
        lease = kubectl_json(
            self.trainguard.cluster, "get", "lease", lease_name(self.name), "-n", self.namespace
        )
        annotations: dict[str, str] = lease["metadata"].get("annotations", {})
        return annotations

    def metrics(self) -> str:
        """The in-cluster operator's `/metrics`."""
        return operator_metrics(self.trainguard.cluster)

    def pause_operator(self) -> None:
        """Freeze the operator's container (every process of it), as SIGSTOP does."""
        node, task = _operator_task(self.trainguard)
        node.ctr("task", "pause", task)

    def resume_operator(self) -> None:
        """Thaw the operator's container."""
        node, task = _operator_task(self.trainguard)
        node.ctr("task", "resume", task)


def test_a_real_death_is_timed_from_the_agents_verdict_to_the_status_write(
    trainguard: Trainguard, shards_claim: str, run_name: str
) -> None:
    spec = {
        "monitor": {"startupGraceSeconds": 5},
        # Two deaths restarted in place, never a pattern: only the timing is at stake.
        "recovery": {
            "sameStepWindow": 0,
            "onRepeatedFailure": "Continue",
            "backoff": {"initialSeconds": 1, "maxSeconds": 2},
        },
    }
    run = real_run(trainguard, run_name, shards_claim, EVERY_STEPS, spec)
    pod, _node, state = training(trainguard, run, EVERY_STEPS)
    timed = RealNodeRun(trainguard, run_name, pod["metadata"]["name"], state)
    assert_deaths_timed_from_the_verdict(timed)


# ----- data staged from S3 ----------------------------------------------------------------


def test_a_run_stages_its_shards_from_s3_with_its_own_secret_and_trains(
    trainguard: Trainguard,
    shards_claim: str,
    run_name: str,
    real_s3: SeaweedFS,
    tmp_path: Path,
) -> None:
    cluster = trainguard.cluster
    bucket = s3_bucket(real_s3, cluster)
    uri = f"s3://{bucket}/datasets"
    shards = make_shards(tmp_path / "shards", shards=STAGED_SHARDS, tokens=20_000, seed=5)
    objects = upload_shards(real_s3.client(), uri, shards)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SHARDS_SECRET},
        "stringData": real_s3.secret_data(),
    }
    run = real_run(
        trainguard, run_name, shards_claim, EVERY_STEPS, {"monitor": {"startupGraceSeconds": 5}}
    )
    # The source is the bucket instead of the claim, with its own Secret.
    run["spec"]["data"]["source"] = {"uri": uri, "credentialsSecret": {"name": SHARDS_SECRET}}
    apply_in_runs(cluster, secret, run)

    def trained() -> dict[str, Any] | None:
        current = kubectl_json(cluster, "get", "trainingrun", run_name, "-n", RUNS_NAMESPACE)
        status = current.get("status") or {}
        return current if (status.get("step") or 0) >= TRAINED_STEPS else None

    current = eventually(
        trained,
        timeout=180,
        what="the run to train on the staged shards",
        detail=lambda: json.dumps(run_status(cluster, run_name))[:2000],
    )
    assert_staged(current, objects)
    (pod,) = run_pods(cluster, run_name)
    assert_data_secrets_in_stage_data_alone(pod)


# ----- examples/full.yaml -----------------------------------------------------------------


@pytest.fixture
def pod_reachable_ip(trainguard: Trainguard) -> str:
    """The host's address on the pod network, where the servers pods reach listen."""
    return trainguard.cluster.real_nodes.pod_reachable_host_ip()


@pytest.fixture
def hub(pod_reachable_ip: str) -> Iterator[HubServer]:
    """The Hub stand-in, served from a thread of this process where pods reach it."""
    with serving(HF_TOKEN, host=pod_reachable_ip) as server:
        yield server


@pytest.fixture
def backup_host(pod_reachable_ip: str, tmp_path: Path) -> Iterator[tuple[Sshd, Path]]:
    """The sshd where pods reach it, with `/srv` a directory of the test's."""
    if not SSHD.exists():
        pytest.fail(f"no sshd at {SSHD}: {INSTALL_HINT}")
    srv = tmp_path / "srv"
    srv.mkdir()
    (tmp_path / "sshd").mkdir()
    server = start_sshd(tmp_path / "sshd", mounts={"/srv": srv}, host=pod_reachable_ip)
    try:
        yield server, srv
    finally:
        server.stop()


@pytest.fixture
def backup_volume(trainguard: Trainguard) -> Iterator[Path]:
    """The example's `file://` layer's claim on a hostPath volume; its directory.

    The directory is the agent's user's, with the pod's group, as a network share's export
    would be (the kubelet does not chown a hostPath).
    """
    cluster = trainguard.cluster
    claim = backup_claim()
    directory = claim_dir(cluster.root, RUNS_NAMESPACE, claim)
    directory.mkdir(parents=True, exist_ok=True)
    os.chown(directory, AGENT_UID, POD_FS_GROUP)
    directory.chmod(0o2775)
    create_claim(cluster, RUNS_NAMESPACE, claim)
    try:
        yield directory
    finally:
        volume = shared_claim(cluster.root, RUNS_NAMESPACE, claim)[0]["metadata"]["name"]
        cluster.kubectl("delete", "pvc", claim, "-n", RUNS_NAMESPACE, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", volume, "--wait=false", check=False)


@pytest.fixture
def gpu_nodes(trainguard: Trainguard) -> Iterator[list[str]]:
    """The real nodes, tainted as GPU node pools are; untainted afterwards.

    NoSchedule leaves the operator where it runs; the example tolerates the taint.
    """
    cluster = trainguard.cluster
    nodes = [node.name for node in cluster.real_nodes.nodes()]
    for node in nodes:
        cluster.kubectl("taint", "node", node, GPU_TAINT, "--overwrite")
    try:
        yield nodes
    finally:
        for node in nodes:
            cluster.kubectl("taint", "node", node, f"{GPU_TAINT}-", check=False)


@pytest.fixture
def full_example_cleanup(trainguard: Trainguard) -> Iterator[None]:
    """The example's run and Secrets removed afterwards, its pod gone while the servers are up.

    Deleting the run flushes its newest checkpoint to a remote layer first.
    """
    yield
    cluster = trainguard.cluster
    name = example()["metadata"]["name"]
    cluster.kubectl(
        "delete", "trainingrun", name, "-n", RUNS_NAMESPACE, "--wait=false", check=False
    )
    eventually(lambda: not run_pods(cluster, name), timeout=GONE_TIMEOUT_S, what="its pod gone")
    secrets = [example()["spec"]["data"]["source"]["credentialsSecret"]["name"]]
    secrets += [
        layer["credentialsSecret"]["name"]
        for layer in remote_layers()
        if "credentialsSecret" in layer
    ]
    cluster.kubectl("delete", "secret", *secrets, "-n", RUNS_NAMESPACE, check=False)


def test_the_full_example_stages_its_data_and_ships_to_every_layer(
    trainguard: Trainguard,
    gpu_nodes: list[str],
    real_s3: SeaweedFS,
    hub: HubServer,
    backup_host: tuple[Sshd, Path],
    backup_volume: Path,
    full_example_cleanup: None,
    tmp_path: Path,
) -> None:
    sshd, srv = backup_host
    cluster = trainguard.cluster
    site = ExampleSite(
        cluster=cluster,
        namespace=RUNS_NAMESPACE,
        values=site_values(
            trainguard.trainer_image.ref,
            {
                ("placement", "nodeSelector", realnode.NODE_KIND_LABEL): realnode.NODE_KIND_REAL,
                ("trainer", "resources", "cpu"): REAL_TRAINER_CPU,
                ("trainer", "resources", "memory"): REAL_TRAINER_MEMORY,
            },
        ),
        nodes=gpu_nodes,
        env_files=[node.env_file for node in cluster.real_nodes.nodes()],
        seaweedfs=real_s3,
        hub=hub,
        sshd=sshd,
        srv=srv,
        backup_dir=backup_volume,
    )
    ships_everywhere(site, tmp_path)
