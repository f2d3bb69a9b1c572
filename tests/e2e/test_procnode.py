"""Process-backed nodes run pods' containers as real local processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from trainguard.agent.signals import proc_state
from trainguard.contract import env
from trainguard.contract.files import SUPERVISOR_FILENAME
from trainguard_dev.cluster.cluster import Cluster, _pid_alive
from trainguard_dev.cluster.nodes import PROCESS_NODE_LABEL, process_node_name
from trainguard_dev.cluster.procnode import DOWN_FILENAME, ENV_FILENAME
from trainguard_dev.testing.polling import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def _pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("-n", namespace, "get", "pod", name, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def _sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def _manifest(name: str, node: str) -> dict[str, Any]:
    mount = [{"name": "work", "mountPath": "/work"}]
    # Processes share this machine's file system: the runtime rewrites mount paths at the
    # start of env values and arguments, so scripts reach the volume through $WORK.
    work_env = [{"name": "WORK", "value": "/work"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {PROCESS_NODE_LABEL: "true", "kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "volumes": [{"name": "work", "emptyDir": {}}],
            "initContainers": [
                {
                    "name": "prepare",
                    "image": "x",
                    "command": _sh('echo prepared > "$WORK/ready"'),
                    "env": work_env,
                    "volumeMounts": mount,
                },
                {
                    "name": "sidecar",
                    "image": "x",
                    "restartPolicy": "Always",
                    "command": _sh('echo $$ > "$WORK/sidecar.pid"; exec sleep 300'),
                    "env": work_env,
                    "volumeMounts": mount,
                },
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": _sh(
                        'cat "$WORK/ready" > "$WORK/seen"; echo "$NODE $POD" > "$WORK/env"; '
                        'echo $$ > "$WORK/main.pid"; exec sleep 300'
                    ),
                    "env": [
                        *work_env,
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                    "volumeMounts": mount,
                }
            ],
        },
    }


def _work_dir(cluster: Cluster, node: str, namespace: str, name: str) -> Path:
    pods = cluster.root / "procnodes" / node / "pods"
    found = eventually(
        lambda: next(iter(pods.glob(f"{namespace}_{name}_*")), None), what="pod directory"
    )
    return Path(found) / "volumes" / "work"


def test_pod_runs_as_processes_and_deletion_kills_them(cluster: Cluster, namespace: str) -> None:
    node = process_node_name(0)
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(_manifest("p", node)))
    eventually(
        lambda: _pod(cluster, namespace, "p").get("status", {}).get("phase") == "Running",
        what="pod Running",
    )
    work = _work_dir(cluster, node, namespace, "p")
    eventually(lambda: (work / "env").exists(), what="main container output")
    assert (work / "seen").read_text().strip() == "prepared"  # init ran before main
    assert (work / "env").read_text().split() == [node, "p"]
    pod = _pod(cluster, namespace, "p")
    statuses = {s["name"]: s for s in pod["status"]["initContainerStatuses"]}
    assert statuses["prepare"]["state"]["terminated"]["exitCode"] == 0
    assert "running" in statuses["sidecar"]["state"]
    assert "running" in pod["status"]["containerStatuses"][0]["state"]
    pids = [int((work / f).read_text()) for f in ("main.pid", "sidecar.pid")]
    assert all(_pid_alive(pid) for pid in pids)

    cluster.kubectl("-n", namespace, "delete", "pod", "p", "--wait=true", timeout=60)
    eventually(lambda: not any(_pid_alive(pid) for pid in pids), timeout=10, what="processes gone")


def test_container_exit_code_is_reported(cluster: Cluster, namespace: str) -> None:
    manifest = _manifest("fails", process_node_name(1))
    manifest["spec"]["initContainers"] = []
    manifest["spec"]["volumes"] = []
    manifest["spec"]["containers"][0].pop("volumeMounts")
    manifest["spec"]["containers"][0]["command"] = _sh("exit 3")
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(manifest))
    pod = eventually(
        lambda: (
            (p := _pod(cluster, namespace, "fails")).get("status", {}).get("phase") == "Failed"
            and p
        ),
        what="pod Failed",
    )
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 3


def _one_shot(name: str, node: str, script: str, **container: Any) -> dict[str, Any]:
    manifest = _manifest(name, node)
    manifest["spec"]["initContainers"] = []
    manifest["spec"]["volumes"] = []
    main = manifest["spec"]["containers"][0]
    main.pop("volumeMounts")
    main["command"] = _sh(script)
    main["env"] = [{"name": "FAULT", "value": "pod"}, {"name": "KEPT", "value": "pod"}]
    main.update(container)
    return manifest


def _terminated(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        status = _pod(cluster, namespace, name).get("status", {})
        if status.get("phase") not in ("Succeeded", "Failed"):
            return None
        terminated: dict[str, Any] = status["containerStatuses"][0]["state"]["terminated"]
        return terminated

    found: dict[str, Any] = eventually(done, what=f"pod {name} finished")
    return found


@pytest.fixture
def env_override(cluster: Cluster) -> Any:
    """Write a node's env.json for one test; removed afterwards."""
    written: list[Path] = []

    def write(node: str, text: str) -> None:
        path = cluster.root / "procnodes" / node / ENV_FILENAME
        path.write_text(text)
        written.append(path)

    yield write
    for path in written:
        path.unlink(missing_ok=True)


def test_a_node_env_override_reaches_every_container_on_that_node_only(
    cluster: Cluster, namespace: str, env_override: Any
) -> None:
    sick, other = process_node_name(0), process_node_name(1)
    env_override(sick, json.dumps({"FAULT": "node"}))
    script = 'echo "$FAULT $KEPT" > "$TRAINGUARD_TERMINATION_LOG"'
    for name, node in (("on-sick", sick), ("on-other", other)):
        cluster.kubectl(
            "-n", namespace, "create", "-f", "-", input=json.dumps(_one_shot(name, node, script))
        )
    # The node's value wins over the pod's; the pod's other values stay; other nodes unchanged.
    assert _terminated(cluster, namespace, "on-sick")["message"].strip() == "node pod"
    assert _terminated(cluster, namespace, "on-other")["message"].strip() == "pod pod"


def test_an_invalid_env_override_fails_the_container_with_the_reason(
    cluster: Cluster, namespace: str, env_override: Any
) -> None:
    node = process_node_name(0)
    env_override(node, '["not", "an", "object"]')
    manifest = _one_shot("broken", node, "exit 0")
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(manifest))
    terminated = _terminated(cluster, namespace, "broken")
    assert (terminated["exitCode"], terminated["reason"]) == (128, "StartError")
    assert "must be a JSON object of strings" in terminated["message"]


def test_termination_messages_as_a_kubelet_reports_them(cluster: Cluster, namespace: str) -> None:
    node = process_node_name(1)
    cases = {
        # The file's content, cut at 4 KiB as a kubelet keeps it.
        "file": ('head -c 5000 /dev/zero | tr "\\0" x > "$TRAINGUARD_TERMINATION_LOG"', {}),
        # No file content: the log's tail, on failure, when the policy asks for it.
        "fallback": (
            "echo first; echo last words; exit 4",
            {"terminationMessagePolicy": "FallbackToLogsOnError"},
        ),
        "no-fallback": ("echo not a message; exit 4", {}),
    }
    for name, (script, extra) in cases.items():
        manifest = _one_shot(name, node, script, **extra)
        cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(manifest))
    assert _terminated(cluster, namespace, "file")["message"] == "x" * 4096
    fallback = _terminated(cluster, namespace, "fallback")
    assert fallback["exitCode"] == 4 and fallback["message"].endswith("first\nlast words")
    assert "message" not in _terminated(cluster, namespace, "no-fallback")


def test_a_secret_volume_holds_its_keys_with_the_volumes_mode(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl(
        "-n", namespace, "create", "secret", "generic", "keys", "--from-literal=token=s3cr3t"
    )
    # Mount paths are rewritten at the start of env values: the script reaches it via $KEYS.
    log = "$TRAINGUARD_TERMINATION_LOG"
    script = f'stat -c %a "$KEYS/token" > "{log}"; cat "$KEYS/token" >> "{log}"'
    manifest = _one_shot("secret-reader", process_node_name(0), script)
    manifest["spec"]["volumes"] = [
        {"name": "keys", "secret": {"secretName": "keys", "defaultMode": 0o400}}
    ]
    main = manifest["spec"]["containers"][0]
    main["volumeMounts"] = [{"name": "keys", "mountPath": "/keys"}]
    main["env"] = [{"name": "KEYS", "value": "/keys"}]
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(manifest))
    terminated = _terminated(cluster, namespace, "secret-reader")
    assert terminated["message"].split() == ["400", "s3cr3t"]


def test_a_configmap_gives_its_keys_to_envfrom_and_env_entries_win(
    cluster: Cluster, namespace: str
) -> None:
    # As the kubelet does: every key of the ConfigMap, mount paths rewritten like any value,
    # and the container's own `env` over a key of the same name.
    cluster.kubectl(
        "-n", namespace, "create", "configmap", "shared",
        "--from-literal=KEYS=/keys/token", "--from-literal=KEPT=map", "--from-literal=ONLY=map",
    )  # fmt: skip
    cluster.kubectl(
        "-n", namespace, "create", "secret", "generic", "keys", "--from-literal=token=s3cr3t"
    )
    log = "$TRAINGUARD_TERMINATION_LOG"
    script = f'cat "$KEYS" > "{log}"; echo " $KEPT $ONLY" >> "{log}"'
    manifest = _one_shot("from-config", process_node_name(0), script)
    manifest["spec"]["volumes"] = [{"name": "keys", "secret": {"secretName": "keys"}}]
    main = manifest["spec"]["containers"][0]
    main["volumeMounts"] = [{"name": "keys", "mountPath": "/keys"}]
    main["envFrom"] = [{"configMapRef": {"name": "shared"}}]
    main["env"] = [{"name": "KEPT", "value": "pod"}]
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(manifest))
    terminated = _terminated(cluster, namespace, "from-config")
    assert terminated["message"].split() == ["s3cr3t", "pod", "map"]


def _live(pid: int) -> bool:
    """Whether process `pid` runs (a zombie has ended: only its exit status is left)."""
    return proc_state(pid) not in (None, "Z")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""  # gone


def _with_home(directory: Path) -> set[int]:
    """The live processes whose environment has HOME at `directory` (a pod's, here)."""
    marker = f"HOME={directory}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except OSError:
            continue  # gone meanwhile
    return {pid for pid in found if _live(pid)}


def test_a_node_that_goes_down_takes_every_process_of_its_pods(
    cluster: Cluster, namespace: str
) -> None:
    # The supervisor starts the trainer and its warm standby in sessions of their own: out of
    # the container's process group, not out of the pod. A vanished machine takes them all.
    node = process_node_name(1)
    manifest = _one_shot("supervised", node, "")
    main = manifest["spec"]["containers"][0]
    main["command"] = [
        "trainguard", "supervise", "--no-gpu", "--standby-delay", "0", "--",
        "python", "-m", "timeit", "-n", "1", "-r", "1", "__import__('time').sleep(300)",
    ]  # fmt: skip
    # Its state and L0 in the pod's volume (not the supervisor's own L0 under /dev/shm).
    main["env"] = [
        {"name": env.STATE_DIR, "value": "/work"},
        {"name": env.L0_DIR, "value": "/work/l0"},
    ]
    main["volumeMounts"] = [{"name": "work", "mountPath": "/work"}]
    manifest["spec"]["volumes"] = [{"name": "work", "emptyDir": {}}]
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(manifest))
    work = _work_dir(cluster, node, namespace, "supervised")
    pod_dir = work.parents[1]

    def supervised() -> tuple[int, int, set[int]] | None:
        if not (work / SUPERVISOR_FILENAME).exists():
            return None
        state = json.loads((work / SUPERVISOR_FILENAME).read_text())
        processes = _with_home(pod_dir)
        standbys = {p for p in processes if b"trainguard_harness.standby" in _cmdline(p)}
        child = state.get("child_pid")
        if child in processes and standbys:
            return int(state["pid"]), int(child), processes
        return None

    supervisor, child, processes = eventually(
        supervised, timeout=60, what="supervisor, trainer and standby running"
    )
    assert {supervisor, child} < processes  # and the standby, in a session of its own
    assert len({os.getsid(pid) for pid in processes}) >= 3, processes
    down = cluster.root / "procnodes" / node / DOWN_FILENAME
    down.touch()
    try:
        eventually(
            lambda: not any(_live(pid) for pid in processes),
            timeout=10,
            what="every process of the pod gone",
            detail=lambda: [pid for pid in processes if _live(pid)],
        )
        assert not _with_home(pod_dir)
    finally:
        # The pod goes with its node; back up, the node has nothing to start again.
        cluster.kubectl(
            "-n", namespace, "delete", "pod", "supervised", "--force", "--grace-period=0",
            check=False,
        )  # fmt: skip
        down.unlink(missing_ok=True)
        cluster.kubectl("wait", "--for=condition=Ready", f"node/{node}", "--timeout=60s",
                        timeout=90)  # fmt: skip
