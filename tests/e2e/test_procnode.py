"""Process-backed nodes run pods' containers as real local processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from operator_proc import eventually

from trainguard.devcluster.cluster import Cluster, _pid_alive
from trainguard.devcluster.nodes import PROCESS_NODE_LABEL, process_node_name

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
