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
    RELEASE_NAMESPACE,
    RUNS_NAMESPACE,
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
    s3_secret,
    shipped_step,
    training,
)
from trainguard.api.constants import (
    ANNOTATION_EVIDENCE,
    ANNOTATION_VERDICT,
    LABEL_NODE_HEALTH,
    SECRET_KEY_S3_SECRET_ACCESS_KEY,
    TAINT_UNHEALTHY,
    Reason,
)
from trainguard.api.spec import MIN_ADAPTIVE_HANG_SECONDS
from trainguard.ckpt import MANIFEST_FILENAME, parse_step_dirname
from trainguard.contract import env
from trainguard.contract.files import RESTORE_FILENAME, read_json
from trainguard.layers.lineage import Origin
from trainguard.operator.build.constants import CREDENTIALS_DIR
from trainguard.operator.build.pod import POD_FS_GROUP
from trainguard_dev.cluster import realnode
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.pods import heartbeat
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.servers import S3_SECRET_KEY, SeaweedFS

# Only the test itself is timed: the session's real nodes, images and chart come from the
# first test's fixtures (minutes on a fresh cache), whose every step is bounded on its own.
pytestmark = [pytest.mark.realnodes, pytest.mark.timeout(420, func_only=True)]

EVERY_STEPS = 20
# Under the ghost threshold: on a live trainer no verdict; left by a death, memory not released.
GHOST_MIB = 1024
# Dead reaches the status within this many seconds of the kill (measured: a few).
DEAD_BOUND_S = 15.0


def _training(trainguard: Trainguard, name: str, claim: str, spec: dict[str, Any]) -> Any:
    """Apply the run; wait for its pod on a real node, two checkpoints and a Healthy verdict."""
    return training(trainguard, real_run(trainguard, name, claim, EVERY_STEPS, spec), EVERY_STEPS)


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
    before = heartbeat(state)
    assert before is not None
    killed_at = time.monotonic()
    # SIGKILL from inside the trainer container (its own user), as an OOM kill or crash would.
    exec_python(
        cluster, pod["metadata"]["name"], "trainer", f"import os; os.kill({before['pid']}, 9)"
    )

    status = eventually(
        lambda: (s := run_status(cluster, run_name)).get("verdict") == "Dead" and s,
        timeout=30,
        what="Dead in the run's status",
    )
    detect_s = time.monotonic() - killed_at
    # By absence: the agent's next look (intervalSeconds), its Lease, the operator's cycle.
    assert detect_s <= DEAD_BOUND_S, detect_s
    assert status["lastFailure"]["cause"] == "Dead"

    def resumed() -> dict[str, Any] | None:
        beat = heartbeat(state)
        moved = beat and beat["pid"] != before["pid"] and (beat.get("step") or 0) > before["step"]
        return beat if moved else None

    after = eventually(resumed, timeout=120, what="training again after the restart")
    assert [p["metadata"]["name"] for p in run_pods(cluster, run_name)] == [pod["metadata"]["name"]]
    restore = read_json(state / "supervisor.json") or {}
    assert restore["restarts"] >= 1
    assert before["step"] - before["last_checkpoint_step"] <= EVERY_STEPS
    assert after["step"] > before["step"]
    assert run_status(cluster, run_name)["restarts"] >= 1
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
    before = heartbeat(state)
    assert before is not None
    pid = before["pid"]
    # The trainer stops (SIGSTOP): alive, holding its memory, no step advances.
    exec_python(cluster, pod["metadata"]["name"], "trainer", f"import os; os.kill({pid}, 19)")

    def restarted() -> dict[str, Any] | None:
        beat = heartbeat(state)
        return (
            beat
            if beat and beat["pid"] != pid and (beat.get("step") or 0) > before["step"]
            else None
        )

    def where() -> str:
        # What to read when the restart never comes: the supervisor's account (its kill, its
        # history, the standby), the newest heartbeat, the operator's status and the Events.
        return json.dumps(
            {
                "supervisor": read_json(state / "supervisor.json"),
                "heartbeat": heartbeat(state),
                "status": run_status(cluster, run_name),
                "pods": [
                    (p["metadata"]["name"], p["status"].get("phase"))
                    for p in run_pods(cluster, run_name)
                ],
                "events": [
                    (e["reason"], e["message"][:200]) for e in run_events(cluster, run_name)
                ],
            },
            default=str,
        )[:6000]

    # Bounded by the verdict (hangAfterSeconds), the stack dump, the restart's back-off and
    # the new trainer's start and restore; 180 s leaves room for a loaded machine.
    eventually(restarted, timeout=180, what="a new trainer after the hang", detail=where)
    supervisor = read_json(state / "supervisor.json") or {}
    assert supervisor["last_kill"]["pid"] == pid and supervisor["last_kill"]["dumped"]
    ended = next(h for h in supervisor["history"] if h["pid"] == pid)
    assert ended["signal"] == "SIGKILL", ended
    events = run_events(cluster, run_name)
    reasons = {e["reason"] for e in events}
    assert {"VerdictHung", "HungTrainerStacks"} <= reasons, reasons
    assert "HungTrainerNotKilled" not in reasons
    stacks = next(e["message"] for e in events if e["reason"] == "HungTrainerStacks")
    # The main thread's frames, in the training loop (faulthandler's dump, shortened).
    assert 'File "' in stacks and "trainguard_harness/train" in stacks, stacks
    status = run_status(cluster, run_name)
    assert status["lastFailure"]["cause"] == "Hung"
    assert [p["metadata"]["name"] for p in run_pods(cluster, run_name)] == [pod["metadata"]["name"]]


def test_a_hang_is_found_by_a_multiple_of_the_slowest_step_on_a_real_node(
    trainguard: Trainguard, shards_claim: str, run_name: str
) -> None:
    """`hangAfterStepTimes`: Hung within seconds where `hangAfterSeconds` alone waits 5 minutes.

    Healthy training with its saves and L0 snapshots is never Hung by the short bound.
    """
    cluster = trainguard.cluster
    spec = {
        "monitor": {
            "startupGraceSeconds": 5,
            "hangAfterSeconds": 300,
            "hangAfterStepTimes": 10,
            "intervalSeconds": 1,
        },
        "recovery": {"backoff": {"initialSeconds": 1, "maxSeconds": 1}},
    }
    pod, _node, state = _training(trainguard, run_name, shards_claim, spec)
    time.sleep(10)  # healthy steps, saves included, under the short bound
    status = run_status(cluster, run_name)
    assert status.get("restarts", 0) == 0 and "lastFailure" not in status, status
    before = heartbeat(state)
    assert before is not None and before.get("slowest_step_s") is not None, before
    pid = before["pid"]
    # Timed from before the exec: the freeze happens within it, and the exec's own return
    # (hundreds of milliseconds) must not count against the floor asserted below.
    frozen_at = time.monotonic()
    exec_python(cluster, pod["metadata"]["name"], "trainer", f"import os; os.kill({pid}, 19)")

    def hung() -> dict[str, Any] | None:
        current = run_status(cluster, run_name)
        return current if current.get("restarts", 0) >= 1 else None

    recorded = eventually(hung, timeout=90, what="the hang recorded by the adaptive bound")
    found_s = time.monotonic() - frozen_at
    failure = recorded["lastFailure"]
    assert failure["cause"] == "Hung" and "x the slowest recent step" in failure["message"], failure

    def restarted() -> dict[str, Any] | None:
        beat = heartbeat(state)
        return beat if beat and beat["pid"] != pid and beat.get("step") else None

    eventually(restarted, timeout=120, what="a new trainer after the hang")
    # The bound's floor, from the loop's last report (at most a step before the freeze, which
    # came after `frozen_at`); the look, the Lease and the operator's write add seconds.
    assert MIN_ADAPTIVE_HANG_SECONDS - before["slowest_step_s"] <= found_s < 60, found_s
    print(f"adaptive hang bound on a real node: Hung recorded {found_s:.1f} s after the freeze")


def test_each_container_runs_as_its_image_user_and_reads_only_what_it_must(
    trainguard: Trainguard, shards_claim: str, run_name: str, real_s3: SeaweedFS
) -> None:
    cluster = trainguard.cluster
    bucket = f"tg-{uuid.uuid4().hex[:12]}"
    real_s3.client().create_bucket(Bucket=bucket)
    apply_in_runs(cluster, s3_secret(real_s3))
    layer = {
        "name": "s3",
        "uri": f"s3://{bucket}/{run_name}",
        "credentialsSecret": {"name": S3_SECRET},
    }
    spec = {"monitor": {"startupGraceSeconds": 5}, "checkpoints": {"remote": [layer]}}
    pod, _node, _state_dir = _training(trainguard, run_name, shards_claim, spec)
    # The agent read its credentials (as 65532, through the pod's group): it shipped to S3.
    eventually(
        lambda: any(
            c["layer"] == "s3" and c.get("verified")
            for c in run_status(cluster, run_name).get("checkpoints", [])
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
    agent = json.loads(exec_python(cluster, name, "agent", probe))
    trainer = json.loads(exec_python(cluster, name, "trainer", probe))
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
    report = json.loads(exec_python(cluster, pod["metadata"]["name"], "trainer", FORGE))
    assert report["tokens"] == 0, report  # nothing in its mounts, env, or others' /proc
    # The agent's /proc entries and root are refused (another user, and non-dumpable).
    assert report["refused"].get("PermissionError", 0) >= 2, report
    assert report["answers"] and all(code in (401, 403) for code in report["answers"]), report
    # A few agent intervals later: the run's own agent still reports, nothing excluded or tainted.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = run_status(cluster, run_name)
        assert status.get("verdict") == "Healthy", status
        assert not status.get("excludedNodes"), status
        assert _taint(cluster, node.name) is None
        time.sleep(1)
    assert [p["metadata"]["name"] for p in run_pods(cluster, run_name)] == [pod["metadata"]["name"]]
    print(f"forged verdict from the trainer: {report}")


# ----- the run leaves its node: ghost VRAM, node loss; and suspend ------------------------


def _s3_run_spec(bucket: str, run_name: str, **layer: Any) -> dict[str, Any]:
    return {
        "checkpoints": {
            "flushTimeoutSeconds": 10,
            "remote": [
                {
                    "name": "s3",
                    "uri": f"s3://{bucket}/{run_name}",
                    "credentialsSecret": {"name": S3_SECRET},
                    **layer,
                }
            ],
        },
        "monitor": {"startupGraceSeconds": 5, "ghostMemory": {"releaseTimeoutSeconds": 3}},
        "recovery": {"backoff": {"initialSeconds": 1, "maxSeconds": 10}},
    }


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
        lambda: bound_pod(cluster, run_name, 2), timeout=120, what="attempt 2 bound to a node"
    )
    node_b = second["spec"]["nodeName"]
    assert node_b != node_a
    cluster.real_nodes.node(node_b)  # a real node
    state_b = pod_state(trainguard, second)
    restored = eventually(
        lambda: read_json(state_b / RESTORE_FILENAME), timeout=120, what="attempt 2 restored"
    )
    assert restored["from_layer"] == "s3", restored
    assert restored["step"] >= shipped, (restored, shipped)
    eventually(
        lambda: ((heartbeat(state_b) or {}).get("step") or 0) > restored["step"],
        timeout=180,
        what="training on the new node past the restored step",
    )
    return node_b, restored


def test_ghost_vram_taints_the_node_and_the_run_moves_restoring_from_s3(
    trainguard: Trainguard, shards_claim: str, run_name: str, real_s3: SeaweedFS
) -> None:
    cluster = trainguard.cluster
    bucket = s3_bucket(real_s3, cluster)
    pod, node, state = _training(trainguard, run_name, shards_claim, _s3_run_spec(bucket, run_name))
    node_a = node.name
    try:
        shipped = eventually(
            lambda: shipped_step(cluster, run_name), timeout=180, what="a checkpoint verified on S3"
        )
        before = heartbeat(state)
        assert before is not None
        # The node's (simulated) GPU keeps memory no process accounts for, and the trainer dies.
        node.gpusim_state.write_text(json.dumps({"ghost_mib": GHOST_MIB}))
        exec_python(
            cluster, pod["metadata"]["name"], "trainer", f"import os; os.kill({before['pid']}, 9)"
        )
        cause = eventually(lambda: _taint(cluster, node_a), timeout=90, what=f"{node_a} tainted")
        assert cause == Reason.GPU_MEMORY_NOT_RELEASED.value, cause
        status = run_status(cluster, run_name)
        assert {e["node"]: e["reason"] for e in status["excludedNodes"]} == {node_a: cause}
        assert status["lastFailure"]["cause"] == cause
        node_b, restored = _moved_and_restored(trainguard, run_name, node_a, shipped)
        placed = {p["spec"].get("nodeName") for p in run_pods(cluster, run_name)}
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
    bucket = s3_bucket(real_s3, cluster)
    lost, _state_a = _training_off_the_operators_node(
        trainguard, run_name, shards_claim, _s3_run_spec(bucket, run_name)
    )
    try:
        shipped = eventually(
            lambda: shipped_step(cluster, run_name), timeout=180, what="a checkpoint verified on S3"
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


def test_a_partitioned_attempt_is_fenced_and_its_later_uploads_are_ignored(
    trainguard: Trainguard, shards_claim: str, run_name: str, real_s3: SeaweedFS
) -> None:
    """Partition: the node NotReady, its trainer and agent running on and shipping to S3."""
    cluster = trainguard.cluster
    bucket = s3_bucket(real_s3, cluster)
    cut, state_a = _training_off_the_operators_node(
        trainguard, run_name, shards_claim, _s3_run_spec(bucket, run_name)
    )
    uid = kubectl_json(cluster, "get", "trainingrun", run_name, "-n", RUNS_NAMESPACE)["metadata"][
        "uid"
    ]
    first = Origin(uid, 1)
    try:
        shipped = eventually(
            lambda: shipped_step(cluster, run_name), timeout=180, what="a checkpoint on S3"
        )
        cluster.real_nodes.partition(cut)
        fence = eventually(
            lambda: next(iter(run_status(cluster, run_name).get("fences") or []), None),
            timeout=180,
            what="attempt 1 fenced",
            detail=lambda: json.dumps(run_status(cluster, run_name))[:2000],
        )
        assert fence["attempt"] == 1 and fence["step"] > 0, fence
        fenced_at = fence["step"]
        # The zombie trains on and ships past its fence, under its own attempt's keys.
        eventually(
            lambda: any(r.origin == first and r.step > fenced_at for r in
                        s3_checkpoints(real_s3, bucket, run_name)),
            timeout=120,
            what="attempt 1 shipping past its fence while partitioned",
        )  # fmt: skip
        assert ((heartbeat(state_a) or {}).get("step") or 0) > fenced_at  # it still trains
        node_b, restored = _moved_and_restored(trainguard, run_name, cut, shipped)
        # The new attempt resumed from the newest checkpoint of the lineage at or below the
        # fence: the fence is the newest step attempt 1 reported, which may be one of its L0
        # (pod memory) checkpoints, never shipped.
        assert shipped <= restored["step"] <= fenced_at, (restored, fence)
        assert restored["origin"] == str(first), restored
        ignored = [line for line in restored["fenced"] if str(first) in line]
        assert ignored and all("shipped after attempt 1 was superseded" in i for i in ignored)
        reasons = {e["reason"]: e for e in run_events(cluster, run_name)}
        assert "AttemptFenced" in reasons, sorted(reasons)
        warning = eventually(
            lambda: {e["reason"]: e for e in run_events(cluster, run_name)}.get(
                "FencedCheckpointsIgnored"
            ),
            timeout=60,
            what="the ignored uploads reported as an Event",
        )
        assert warning["type"] == "Warning" and str(first) in warning["message"], warning
        # Attempt 2 ships and prunes (keep 2) in its lineage: the zombie's uploads stay.
        eventually(
            lambda: len([r for r in s3_checkpoints(real_s3, bucket, run_name)
                         if r.origin == Origin(uid, 2)]) >= 2,
            timeout=180,
            what="attempt 2 shipping",
        )  # fmt: skip
        zombie = {r.step for r in s3_checkpoints(real_s3, bucket, run_name) if r.origin == first}
        assert restored["step"] in zombie and max(zombie) > fenced_at, (sorted(zombie), fenced_at)
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
    bucket = s3_bucket(real_s3, cluster)
    # The layer ships rarely, so the newest L1 checkpoint reaches S3 only by the flush on stop.
    spec = _s3_run_spec(bucket, run_name, everySteps=100_000)
    _pod, _node, state = _training(trainguard, run_name, shards_claim, spec)
    first = eventually(
        lambda: shipped_step(cluster, run_name), timeout=180, what="the first checkpoint on S3"
    )
    eventually(
        lambda: (heartbeat(state) or {}).get("last_checkpoint_step", 0) > first,
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
        beat = heartbeat(state)
        if beat:
            newest = max(newest, beat.get("last_checkpoint_step") or 0)
        return not run_pods(cluster, run_name)

    eventually(gone, timeout=120, what="the pod gone after suspend")
    assert newest > first
    on_s3 = _s3_steps(real_s3, bucket, run_name)
    assert max(on_s3) >= newest, (sorted(on_s3), newest)
    eventually(
        lambda: run_status(cluster, run_name).get("phase") == "Suspended", what="Suspended phase"
    )
