"""Recovery on real nodes: the chart's operator in-cluster, the project's images, real kubelets.

The operator runs from the image built here, installed by `helm install` of the chart as it
is, on a real node, in a namespace that enforces Pod Security `restricted`; the runs' namespace
enforces it too. Each run is the reference trainer in the trainer image built here, its data
staged from a PVC, on the real nodes. The containers run as the users their images declare
(agent and init steps 65532, trainer 10001). The test reads the trainer's files where the
kubelet keeps the pod's state volume, and acts on the trainer only as a user could: through
`kubectl exec` into the trainer container.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from realnodes.conftest import (
    OPERATOR_NODE,
    REAL_NODE_SELECTOR,
    RELEASE_NAMESPACE,
    RUNS_NAMESPACE,
    Trainguard,
    apply_in_runs,
    kubectl_json,
)
from trainguard.api.constants import (
    ANNOTATION_EVIDENCE,
    ANNOTATION_VERDICT,
    LABEL_ATTEMPT,
    LABEL_NODE_HEALTH,
    LABEL_RUN,
    SECRET_KEY_S3_ACCESS_KEY_ID,
    SECRET_KEY_S3_ENDPOINT_URL,
    SECRET_KEY_S3_SECRET_ACCESS_KEY,
    TAINT_UNHEALTHY,
    Reason,
)
from trainguard.ckpt import MANIFEST_FILENAME, parse_step_dirname
from trainguard.contract import env
from trainguard.contract.files import HEARTBEAT_FILENAME, RESTORE_FILENAME, read_json
from trainguard.layers.lineage import CheckpointRef, Origin, parse_key
from trainguard.operator.build.constants import CREDENTIALS_DIR
from trainguard.operator.build.pod import POD_FS_GROUP
from trainguard_dev.cluster import realnode
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.pods import real_state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.runs import make_shards, real_node_run
from trainguard_dev.testing.servers import S3_ACCESS_KEY, S3_SECRET_KEY, SeaweedFS

# Only the test itself is timed: the session's real nodes, images and chart come from the
# first test's fixtures (minutes on a fresh cache), whose every step is bounded on its own.
pytestmark = [pytest.mark.realnodes, pytest.mark.timeout(420, func_only=True)]

EVERY_STEPS = 20
SHARDS_CLAIM = "shards"
SHARDS_PV = "realnode-shards"
SECRET = "s3-credentials"
# Under the ghost threshold: on a live trainer no verdict; left by a death, memory not released.
GHOST_MIB = 1024
# Dead reaches the status within this many seconds of the kill (measured: a few).
DEAD_BOUND_S = 15.0


@pytest.fixture(scope="module")
def shards_claim(trainguard: Trainguard, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PVC bound to a hostPath volume holding synthetic token shards: the runs' data source."""
    root = tmp_path_factory.mktemp("realnode-data")
    shards = make_shards(root / "shards")
    for path in (root, shards, *shards.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)  # read by the stage-data step's user
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": SHARDS_PV},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": str(shards), "type": "Directory"},
            "claimRef": {"namespace": RUNS_NAMESPACE, "name": SHARDS_CLAIM},
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": SHARDS_CLAIM, "namespace": RUNS_NAMESPACE},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": SHARDS_PV,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    cluster = trainguard.cluster
    cluster.kubectl("delete", "pv", SHARDS_PV, "--ignore-not-found", "--wait=false")
    apply_in_runs(cluster, volume, claim)
    return SHARDS_CLAIM


def _run(trainguard: Trainguard, name: str, claim: str, spec: dict[str, Any]) -> dict[str, Any]:
    return real_node_run(
        name,
        trainguard.trainer_image.ref,
        claim,
        EVERY_STEPS,
        REAL_NODE_SELECTOR,
        spec,
        namespace=RUNS_NAMESPACE,
    )


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    run = kubectl_json(cluster, "get", "trainingrun", name, "-n", RUNS_NAMESPACE)
    return run.get("status") or {}


def _pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    listed = kubectl_json(cluster, "get", "pods", "-n", RUNS_NAMESPACE, "-l", f"{LABEL_RUN}={name}")
    return list(listed["items"])


def _bound(cluster: Cluster, name: str, attempt: int = 1) -> dict[str, Any] | None:
    for pod in _pods(cluster, name):
        labels = pod["metadata"].get("labels") or {}
        if labels.get(LABEL_ATTEMPT) == str(attempt) and pod["spec"].get("nodeName"):
            return pod
    return None


def _events(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    listed = kubectl_json(
        cluster, "get", "events", "-n", RUNS_NAMESPACE,
        "--field-selector", f"involvedObject.kind=TrainingRun,involvedObject.name={name}",
    )  # fmt: skip
    return list(listed["items"])


def _state(trainguard: Trainguard, pod: dict[str, Any]) -> Path:
    node = trainguard.cluster.real_nodes.node(pod["spec"]["nodeName"])
    return real_state_dir(node.kubelet_root, pod)


def _beat(state: Path) -> dict[str, Any] | None:
    return read_json(state / HEARTBEAT_FILENAME)


def _exec(cluster: Cluster, pod: str, container: str, script: str) -> str:
    """Run Python in one of the pod's containers, as that container's user."""
    return cluster.kubectl(
        "exec", "-n", RUNS_NAMESPACE, pod, "-c", container, "--", "python", "-c", script
    ).stdout


def _training(trainguard: Trainguard, name: str, claim: str, spec: dict[str, Any]) -> Any:
    """Apply the run; wait for its pod on a real node, two checkpoints and a Healthy verdict."""
    cluster = trainguard.cluster
    apply_in_runs(cluster, _run(trainguard, name, claim, spec))
    pod = eventually(
        lambda: _bound(cluster, name),
        timeout=60,
        what="the run's pod bound to a real node",
        detail=lambda: json.dumps(_status(cluster, name))[:2000],
    )
    node = cluster.real_nodes.node(pod["spec"]["nodeName"])  # raises unless a real node
    state = _state(trainguard, pod)

    def checkpointed() -> dict[str, Any] | None:
        beat = _beat(state)
        return beat if beat and (beat.get("last_checkpoint_step") or 0) >= 2 * EVERY_STEPS else None

    eventually(
        checkpointed,
        timeout=240,
        what="training with two checkpoints",
        detail=lambda: cluster.kubectl(
            "get", "events", "-n", RUNS_NAMESPACE, "--sort-by=.lastTimestamp", check=False
        ).stdout[-3000:],
    )
    eventually(lambda: _status(cluster, name).get("verdict") == "Healthy", what="Healthy")
    return pod, node, state


def test_operator_from_the_chart_is_ready_on_a_real_node_under_restricted(
    trainguard: Trainguard,
) -> None:
    cluster = trainguard.cluster
    pods = kubectl_json(cluster, "get", "pods", "-n", RELEASE_NAMESPACE)["items"]
    (operator,) = pods
    assert operator["spec"]["nodeName"] in {n.name for n in cluster.real_nodes.nodes()}
    ready = {c["type"]: c["status"] for c in operator["status"]["conditions"]}
    assert ready["Ready"] == "True", operator["status"]
    (container,) = operator["spec"]["containers"]
    assert container["image"] == trainguard.operator_image.ref
    assert operator["spec"]["serviceAccountName"].startswith("trainguard")
    # Pod Security admission enforces `restricted` there: a privileged pod is refused.
    privileged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged", "namespace": RUNS_NAMESPACE},
        "spec": {
            "containers": [{
                "name": "main", "image": trainguard.real.image, "imagePullPolicy": "Never",
                "command": ["sleep", "1"], "securityContext": {"privileged": True},
            }],
        },
    }  # fmt: skip
    refused = cluster.kubectl("create", "-f", "-", input=json.dumps(privileged), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr


def test_silent_death_is_dead_restarted_in_place_and_resumed_from_l1(
    trainguard: Trainguard, shards_claim: str, run_name: str
) -> None:
    cluster = trainguard.cluster
    spec = {"monitor": {"startupGraceSeconds": 5}}
    pod, _node, state = _training(trainguard, run_name, shards_claim, spec)
    before = _beat(state)
    assert before is not None
    killed_at = time.monotonic()
    # SIGKILL from inside the trainer container (its own user), as an OOM kill or crash would.
    _exec(cluster, pod["metadata"]["name"], "trainer", f"import os; os.kill({before['pid']}, 9)")

    status = eventually(
        lambda: (s := _status(cluster, run_name)).get("verdict") == "Dead" and s,
        timeout=30,
        what="Dead in the run's status",
    )
    detect_s = time.monotonic() - killed_at
    # By absence: the agent's next look (intervalSeconds), its Lease, the operator's cycle.
    assert detect_s <= DEAD_BOUND_S, detect_s
    assert status["lastFailure"]["cause"] == "Dead"

    def resumed() -> dict[str, Any] | None:
        beat = _beat(state)
        moved = beat and beat["pid"] != before["pid"] and (beat.get("step") or 0) > before["step"]
        return beat if moved else None

    after = eventually(resumed, timeout=120, what="training again after the restart")
    assert [p["metadata"]["name"] for p in _pods(cluster, run_name)] == [pod["metadata"]["name"]]
    restore = read_json(state / "supervisor.json") or {}
    assert restore["restarts"] >= 1
    assert before["step"] - before["last_checkpoint_step"] <= EVERY_STEPS
    assert after["step"] > before["step"]
    assert _status(cluster, run_name)["restarts"] >= 1
    print(f"silent death on a real node: Dead in the status after {detect_s:.1f} s")


def test_hang_is_dumped_then_killed_across_users_and_restarted_in_place(
    trainguard: Trainguard, shards_claim: str, run_name: str
) -> None:
    cluster = trainguard.cluster
    hang_after = 6
    spec = {
        "monitor": {
            "startupGraceSeconds": 5,
            "hangAfterSeconds": hang_after,
            "slowAfterSeconds": 3,
            "intervalSeconds": 1,
        }
    }
    pod, _node, state = _training(trainguard, run_name, shards_claim, spec)
    before = _beat(state)
    assert before is not None
    pid = before["pid"]
    # The trainer stops (SIGSTOP): alive, holding its memory, no step advances.
    _exec(cluster, pod["metadata"]["name"], "trainer", f"import os; os.kill({pid}, 19)")

    def restarted() -> dict[str, Any] | None:
        beat = _beat(state)
        return (
            beat
            if beat and beat["pid"] != pid and (beat.get("step") or 0) > before["step"]
            else None
        )

    eventually(restarted, timeout=120, what="a new trainer after the hang")
    supervisor = read_json(state / "supervisor.json") or {}
    assert supervisor["last_kill"]["pid"] == pid and supervisor["last_kill"]["dumped"]
    ended = next(h for h in supervisor["history"] if h["pid"] == pid)
    assert ended["signal"] == "SIGKILL", ended
    events = _events(cluster, run_name)
    reasons = {e["reason"] for e in events}
    assert {"VerdictHung", "HungTrainerStacks"} <= reasons, reasons
    assert "HungTrainerNotKilled" not in reasons
    stacks = next(e["message"] for e in events if e["reason"] == "HungTrainerStacks")
    # The main thread's frames, in the training loop (faulthandler's dump, shortened).
    assert 'File "' in stacks and "trainguard_harness/train" in stacks, stacks
    status = _status(cluster, run_name)
    assert status["lastFailure"]["cause"] == "Hung"
    assert [p["metadata"]["name"] for p in _pods(cluster, run_name)] == [pod["metadata"]["name"]]


def test_each_container_runs_as_its_image_user_and_reads_only_what_it_must(
    trainguard: Trainguard, shards_claim: str, run_name: str, real_s3: SeaweedFS
) -> None:
    cluster = trainguard.cluster
    bucket = f"tg-{uuid.uuid4().hex[:12]}"
    real_s3.client().create_bucket(Bucket=bucket)
    apply_in_runs(cluster, _s3_secret(real_s3))
    layer = {
        "name": "s3",
        "uri": f"s3://{bucket}/{run_name}",
        "credentialsSecret": {"name": SECRET},
    }
    spec = {"monitor": {"startupGraceSeconds": 5}, "checkpoints": {"remote": [layer]}}
    pod, _node, _state_dir = _training(trainguard, run_name, shards_claim, spec)
    # The agent read its credentials (as 65532, through the pod's group): it shipped to S3.
    eventually(
        lambda: any(
            c["layer"] == "s3" and c.get("verified")
            for c in _status(cluster, run_name).get("checkpoints", [])
        ),
        timeout=120,
        what="a checkpoint verified on the S3 layer",
    )
    probe = (
        "import os, pathlib, json\n"
        "def can(p):\n"
        "    try:\n"
        "        return len(pathlib.Path(p).read_bytes())\n"
        "    except (PermissionError, FileNotFoundError) as e:\n"
        "        return type(e).__name__\n"
        f"l1 = pathlib.Path(os.environ['{env.L1_DIR}'])\n"
        "ckpt = sorted(p for p in l1.iterdir() if p.name.startswith('step-'))[-1]\n"
        "print(json.dumps({'uid': os.getuid(), 'groups': sorted(os.getgroups()),\n"
        f"  'secret': can('{CREDENTIALS_DIR}/s3/{SECRET_KEY_S3_SECRET_ACCESS_KEY}'),\n"
        f"  'manifest': can(ckpt / '{MANIFEST_FILENAME}')}}))\n"
    )
    name = pod["metadata"]["name"]
    agent = json.loads(_exec(cluster, name, "agent", probe))
    trainer = json.loads(_exec(cluster, name, "trainer", probe))
    assert agent["uid"] == 65532 and trainer["uid"] == 10001, (agent, trainer)
    assert POD_FS_GROUP in trainer["groups"]  # the pod's fsGroup: the shared volumes
    assert agent["secret"] == len(S3_SECRET_KEY)  # its credentials, through the group
    assert trainer["secret"] == "FileNotFoundError"  # never mounted into the trainer
    assert isinstance(agent["manifest"], int) and isinstance(trainer["manifest"], int)


# Run in the trainer's container as its user, as the user's training code could: look for
# Kubernetes credentials everywhere that container can read (its own mounts and environment,
# every visible process's environment and root, the pod shares one process namespace), then
# write a GhostMemory verdict into the run's heartbeat Lease with each one found, and
# anonymously. Prints what it found and the apiserver's answers.
FORGE = """
import json, os, pathlib, ssl, urllib.error, urllib.request
token_file = '/var/run/secrets/kubernetes.io/serviceaccount/token'
places = [token_file]
for pid in filter(str.isdigit, os.listdir('/proc')):
    places += [f'/proc/{pid}/root' + token_file, f'/proc/{pid}/environ']
tokens, refused = [], {}
for place in places:
    try:
        data = pathlib.Path(place).read_bytes()
    except OSError as err:
        refused[type(err).__name__] = refused.get(type(err).__name__, 0) + 1
        continue
    if place.endswith('token'):
        tokens.append(data.decode().strip())
    elif b'KUBECONFIG=' in data:
        tokens.append('kubeconfig in ' + place)
lease = os.environ['TRAINGUARD_LEASE_NAME']
url = ('https://' + os.environ['KUBERNETES_SERVICE_HOST'] + ':'
       + os.environ['KUBERNETES_SERVICE_PORT'] + '/apis/coordination.k8s.io/v1/namespaces/'
       + os.environ['TRAINGUARD_NAMESPACE'] + '/leases/' + lease)
body = json.dumps({'metadata': {'annotations': {'VERDICT_KEY': 'GhostMemory',
    'EVIDENCE_KEY': 'forged by the trainer'}}}).encode()
answers = []
for token in [None, *tokens]:
    headers = {'Content-Type': 'application/merge-patch+json'}
    if token:
        headers['Authorization'] = 'Bearer ' + token
    request = urllib.request.Request(url, data=body, method='PATCH', headers=headers)
    try:
        urllib.request.urlopen(request, context=ssl._create_unverified_context(), timeout=5)
        answers.append(200)
    except urllib.error.HTTPError as err:
        answers.append(err.code)
print(json.dumps({'tokens': len(tokens), 'answers': answers, 'refused': refused}))
""".replace("VERDICT_KEY", ANNOTATION_VERDICT).replace("EVIDENCE_KEY", ANNOTATION_EVIDENCE)


def test_a_trainer_forging_a_verdict_finds_no_credentials_and_changes_nothing(
    trainguard: Trainguard, shards_claim: str, run_name: str
) -> None:
    cluster = trainguard.cluster
    spec = {"monitor": {"startupGraceSeconds": 5, "intervalSeconds": 2}}
    pod, node, _state_dir = _training(trainguard, run_name, shards_claim, spec)
    report = json.loads(_exec(cluster, pod["metadata"]["name"], "trainer", FORGE))
    assert report["tokens"] == 0, report  # nothing in its mounts, env, or others' /proc
    # The agent's /proc entries and root are refused (another user, and non-dumpable).
    assert report["refused"].get("PermissionError", 0) >= 2, report
    assert report["answers"] and all(code in (401, 403) for code in report["answers"]), report
    # A few agent intervals later: the run's own agent still reports, nothing excluded or tainted.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = _status(cluster, run_name)
        assert status.get("verdict") == "Healthy", status
        assert not status.get("excludedNodes"), status
        assert _taint(cluster, node.name) is None
        time.sleep(1)
    assert [p["metadata"]["name"] for p in _pods(cluster, run_name)] == [pod["metadata"]["name"]]
    print(f"forged verdict from the trainer: {report}")


def _s3_secret(server: SeaweedFS) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": RUNS_NAMESPACE},
        "stringData": {
            SECRET_KEY_S3_ACCESS_KEY_ID: S3_ACCESS_KEY,
            SECRET_KEY_S3_SECRET_ACCESS_KEY: S3_SECRET_KEY,
            SECRET_KEY_S3_ENDPOINT_URL: server.endpoint,
        },
    }


# ----- the run leaves its node: ghost VRAM, node loss; and suspend ------------------------


def _s3_run_spec(bucket: str, run_name: str, **layer: Any) -> dict[str, Any]:
    return {
        "checkpoints": {
            "flushTimeoutSeconds": 10,
            "remote": [
                {
                    "name": "s3",
                    "uri": f"s3://{bucket}/{run_name}",
                    "credentialsSecret": {"name": SECRET},
                    **layer,
                }
            ],
        },
        "monitor": {"startupGraceSeconds": 5, "ghostMemory": {"releaseTimeoutSeconds": 3}},
        "recovery": {"backoff": {"initialSeconds": 1, "maxSeconds": 10}},
    }


def _bucket(server: SeaweedFS, cluster: Cluster) -> str:
    bucket = f"tg-{uuid.uuid4().hex[:12]}"
    server.client().create_bucket(Bucket=bucket)
    apply_in_runs(cluster, _s3_secret(server))
    return bucket


def _shipped(cluster: Cluster, run_name: str) -> int | None:
    layers = {c["layer"]: c for c in _status(cluster, run_name).get("checkpoints", [])}
    s3 = layers.get("s3", {})
    return s3.get("step") if s3.get("verified") and s3.get("step") else None


def _s3_steps(server: SeaweedFS, bucket: str, run_name: str) -> set[int]:
    """Steps with a manifest in the bucket (complete checkpoints)."""
    listed = server.client().list_objects_v2(Bucket=bucket, Prefix=f"{run_name}/")
    steps = set()
    for item in listed.get("Contents", []):
        parts = item["Key"].split("/")
        if parts[-1] == MANIFEST_FILENAME:
            step = next((parse_step_dirname(p) for p in parts if parse_step_dirname(p)), None)
            if step is not None:
                steps.add(step)
    return steps


def _taint(cluster: Cluster, node: str) -> str | None:
    spec = kubectl_json(cluster, "get", "node", node)["spec"]
    ours = [t for t in spec.get("taints") or [] if t["key"] == TAINT_UNHEALTHY]
    return ours[0]["value"] if ours else None


def _untaint(cluster: Cluster, node: str) -> None:
    cluster.kubectl("taint", "node", node, f"{TAINT_UNHEALTHY}-", check=False)
    cluster.kubectl("label", "node", node, f"{LABEL_NODE_HEALTH}-", check=False)


def _moved_and_restored(
    trainguard: Trainguard, run_name: str, node_a: str, shipped: int
) -> tuple[str, dict[str, Any]]:
    """Attempt 2 on another real node, restored from S3 at or past `shipped`, training on."""
    cluster = trainguard.cluster
    second = eventually(
        lambda: _bound(cluster, run_name, 2), timeout=120, what="attempt 2 bound to a node"
    )
    node_b = second["spec"]["nodeName"]
    assert node_b != node_a
    cluster.real_nodes.node(node_b)  # a real node
    state_b = _state(trainguard, second)
    restored = eventually(
        lambda: read_json(state_b / RESTORE_FILENAME), timeout=120, what="attempt 2 restored"
    )
    assert restored["from_layer"] == "s3", restored
    assert restored["step"] >= shipped, (restored, shipped)
    eventually(
        lambda: ((_beat(state_b) or {}).get("step") or 0) > restored["step"],
        timeout=180,
        what="training on the new node past the restored step",
    )
    return node_b, restored


def test_ghost_vram_taints_the_node_and_the_run_moves_restoring_from_s3(
    trainguard: Trainguard, shards_claim: str, run_name: str, real_s3: SeaweedFS
) -> None:
    cluster = trainguard.cluster
    bucket = _bucket(real_s3, cluster)
    pod, node, state = _training(trainguard, run_name, shards_claim, _s3_run_spec(bucket, run_name))
    node_a = node.name
    try:
        shipped = eventually(
            lambda: _shipped(cluster, run_name), timeout=180, what="a checkpoint verified on S3"
        )
        before = _beat(state)
        assert before is not None
        # The node's (simulated) GPU keeps memory no process accounts for, and the trainer dies.
        node.gpusim_state.write_text(json.dumps({"ghost_mib": GHOST_MIB}))
        _exec(
            cluster, pod["metadata"]["name"], "trainer", f"import os; os.kill({before['pid']}, 9)"
        )
        cause = eventually(lambda: _taint(cluster, node_a), timeout=90, what=f"{node_a} tainted")
        assert cause == Reason.GPU_MEMORY_NOT_RELEASED.value, cause
        status = _status(cluster, run_name)
        assert {e["node"]: e["reason"] for e in status["excludedNodes"]} == {node_a: cause}
        assert status["lastFailure"]["cause"] == cause
        node_b, restored = _moved_and_restored(trainguard, run_name, node_a, shipped)
        placed = {p["spec"].get("nodeName") for p in _pods(cluster, run_name)}
        assert node_a not in placed - {pod["spec"]["nodeName"]}
        # Tainted on the operator's own evidence: its check pod on A found the memory too.
        described = cluster.kubectl("describe", "node", node_a).stdout
        assert "confirmed by the node check" in described, described[-3000:]
        # Remediation: the GPU clean again (as a reboot leaves it), the next check passes.
        node.gpusim_state.write_text("{}")
        eventually(
            lambda: _taint(cluster, node_a) is None,
            timeout=120,
            what=f"{node_a} untainted after its node check passed",
        )
        assert "NodeUntainted" in cluster.kubectl("describe", "node", node_a).stdout
        print(f"ghost VRAM on {node_a}: moved to {node_b}, restored step {restored['step']}")
    finally:
        node.gpusim_state.write_text("{}")
        _untaint(cluster, node_a)


def _training_off_the_operators_node(
    trainguard: Trainguard, name: str, claim: str, spec: dict[str, Any]
) -> tuple[str, Path]:
    """`_training` on the node that is not the operator's (cordoned meanwhile): its name, state."""
    cluster = trainguard.cluster
    other = realnode.node_name(1)
    assert other != OPERATOR_NODE
    cluster.kubectl("cordon", OPERATOR_NODE)
    try:
        _pod, node, state = _training(trainguard, name, claim, spec)
    finally:
        cluster.kubectl("uncordon", OPERATOR_NODE)
    assert node.name == other
    return other, state


def test_node_loss_moves_the_run_and_restores_from_s3(
    trainguard: Trainguard, shards_claim: str, run_name: str, real_s3: SeaweedFS
) -> None:
    cluster = trainguard.cluster
    bucket = _bucket(real_s3, cluster)
    lost, _state_a = _training_off_the_operators_node(
        trainguard, run_name, shards_claim, _s3_run_spec(bucket, run_name)
    )
    try:
        shipped = eventually(
            lambda: _shipped(cluster, run_name), timeout=180, what="a checkpoint verified on S3"
        )
        lost_at = time.monotonic()
        cluster.real_nodes.stop_node(lost)  # kubelet, kube-proxy, runtime and containers
        cause = eventually(lambda: _taint(cluster, lost), timeout=180, what=f"{lost} tainted")
        # The run's Lease expired and the node went NotReady: the node is excluded.
        assert cause == Reason.LEASE_EXPIRED.value, cause
        node_b, restored = _moved_and_restored(trainguard, run_name, lost, shipped)
        print(
            f"node loss: {lost} tainted after {time.monotonic() - lost_at:.0f} s; "
            f"run moved to {node_b}, restored step {restored['step']}"
        )
    finally:
        trainguard.real.up()  # the lost node back, for what runs next
        _untaint(cluster, lost)


def _s3_checkpoints(server: SeaweedFS, bucket: str, run_name: str) -> set[CheckpointRef]:
    """Complete checkpoints in the bucket, with the attempt that shipped each."""
    prefix = f"{run_name}/"
    found = set()
    for page in (
        server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    ):
        for item in page.get("Contents", []):
            parsed = parse_key(item["Key"][len(prefix) :])
            if parsed is not None and parsed[1] == MANIFEST_FILENAME:
                found.add(parsed[0])
    return found


def test_a_partitioned_attempt_is_fenced_and_its_later_uploads_are_ignored(
    trainguard: Trainguard, shards_claim: str, run_name: str, real_s3: SeaweedFS
) -> None:
    """Partition: the node NotReady, its trainer and agent running on and shipping to S3."""
    cluster = trainguard.cluster
    bucket = _bucket(real_s3, cluster)
    cut, state_a = _training_off_the_operators_node(
        trainguard, run_name, shards_claim, _s3_run_spec(bucket, run_name)
    )
    uid = kubectl_json(cluster, "get", "trainingrun", run_name, "-n", RUNS_NAMESPACE)["metadata"][
        "uid"
    ]
    first = Origin(uid, 1)
    try:
        eventually(lambda: _shipped(cluster, run_name), timeout=180, what="a checkpoint on S3")
        cluster.real_nodes.partition(cut)
        fence = eventually(
            lambda: next(iter(_status(cluster, run_name).get("fences") or []), None),
            timeout=180,
            what="attempt 1 fenced",
            detail=lambda: json.dumps(_status(cluster, run_name))[:2000],
        )
        assert fence["attempt"] == 1 and fence["step"] > 0, fence
        fenced_at = fence["step"]
        # The zombie trains on and ships past its fence, under its own attempt's keys.
        eventually(
            lambda: any(r.origin == first and r.step > fenced_at for r in
                        _s3_checkpoints(real_s3, bucket, run_name)),
            timeout=120,
            what="attempt 1 shipping past its fence while partitioned",
        )  # fmt: skip
        assert ((_beat(state_a) or {}).get("step") or 0) > fenced_at  # it still trains
        node_b, restored = _moved_and_restored(trainguard, run_name, cut, fenced_at)
        # The new attempt resumed from the fence, the newest step of the current lineage.
        assert restored["step"] == fenced_at, (restored, fence)
        assert restored["origin"] == str(first), restored
        ignored = [line for line in restored["fenced"] if str(first) in line]
        assert ignored and all("shipped after attempt 1 was superseded" in i for i in ignored)
        reasons = {e["reason"]: e for e in _events(cluster, run_name)}
        assert "AttemptFenced" in reasons, sorted(reasons)
        warning = eventually(
            lambda: {e["reason"]: e for e in _events(cluster, run_name)}.get(
                "FencedCheckpointsIgnored"
            ),
            timeout=60,
            what="the ignored uploads reported as an Event",
        )
        assert warning["type"] == "Warning" and str(first) in warning["message"], warning
        # Attempt 2 ships and prunes (keep 2) in its lineage: the zombie's uploads stay.
        eventually(
            lambda: len([r for r in _s3_checkpoints(real_s3, bucket, run_name)
                         if r.origin == Origin(uid, 2)]) >= 2,
            timeout=180,
            what="attempt 2 shipping",
        )  # fmt: skip
        zombie = {r.step for r in _s3_checkpoints(real_s3, bucket, run_name) if r.origin == first}
        assert fenced_at in zombie and max(zombie) > fenced_at, (sorted(zombie), fenced_at)
        print(
            f"partition of {cut}: attempt 1 fenced at step {fenced_at}, zombie shipped up to "
            f"{max(zombie)}; attempt 2 on {node_b} restored step {restored['step']}, "
            f"{len(restored['fenced'])} fenced uploads ignored"
        )
    finally:
        cluster.real_nodes.heal(cut)
        _untaint(cluster, cut)


def test_suspend_ships_the_newest_l1_checkpoint_before_the_pod_is_gone(
    trainguard: Trainguard, shards_claim: str, run_name: str, real_s3: SeaweedFS
) -> None:
    cluster = trainguard.cluster
    bucket = _bucket(real_s3, cluster)
    # The layer ships rarely, so the newest L1 checkpoint reaches S3 only by the flush on stop.
    spec = _s3_run_spec(bucket, run_name, everySteps=100_000)
    _pod, _node, state = _training(trainguard, run_name, shards_claim, spec)
    first = eventually(
        lambda: _shipped(cluster, run_name), timeout=180, what="the first checkpoint on S3"
    )
    eventually(
        lambda: (_beat(state) or {}).get("last_checkpoint_step", 0) > first,
        timeout=120,
        what="a newer checkpoint in L1 only",
    )
    cluster.kubectl(
        "patch", "trainingrun", run_name, "-n", RUNS_NAMESPACE, "--type=merge",
        "-p", json.dumps({"spec": {"suspend": True}}),
    )  # fmt: skip
    newest = 0

    def gone() -> bool:
        nonlocal newest
        beat = _beat(state)
        if beat:
            newest = max(newest, beat.get("last_checkpoint_step") or 0)
        return not _pods(cluster, run_name)

    eventually(gone, timeout=120, what="the pod gone after suspend")
    assert newest > first
    on_s3 = _s3_steps(real_s3, bucket, run_name)
    assert max(on_s3) >= newest, (sorted(on_s3), newest)
    eventually(
        lambda: _status(cluster, run_name).get("phase") == "Suspended", what="Suspended phase"
    )
