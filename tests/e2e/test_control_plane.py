"""The local control plane is a real one: scheduling, garbage collection, RBAC, versions."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from trainguard_dev.cluster import nodes as node_manifests
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.polling import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

KUBE_VERSION = "v1.36.3"


def _get(cluster: Cluster, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)
    return data


def _gpu_pod(name: str, gpus: int = 1, storage: str | None = None, **spec: Any) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)}
    requests: dict[str, str] = {}
    if storage:
        requests["ephemeral-storage"] = storage
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "example.invalid/trainer:1",
                    "resources": {"limits": limits, "requests": requests},
                }
            ],
            # kwok nodes carry this taint-free; tolerate kwok's own taint should it add one.
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            **spec,
        },
    }


def _create(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> None:
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(manifest))


@pytest.fixture
def private_nodes(cluster: Cluster) -> Iterator[tuple[str, list[str]]]:
    """Three GPU nodes of this test's own (a unique label), deleted afterwards."""
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    names = [f"{pool}-{i}" for i in range(3)]
    for name in names:
        node = node_manifests.gpu_node(name, gpus=4)
        node["metadata"]["labels"]["trainguard.dev/test-pool"] = pool
        cluster.kubectl("create", "-f", "-", input=json.dumps(node))
    yield pool, names
    cluster.kubectl("delete", "node", *names, "--wait=false", check=False)


def test_gpu_pod_is_scheduled_and_runs(cluster: Cluster, namespace: str) -> None:
    _create(cluster, namespace, _gpu_pod("gpu-pod"))

    def running() -> dict[str, Any] | None:
        pod = _get(cluster, "-n", namespace, "pod", "gpu-pod")
        return pod if pod["status"].get("phase") == "Running" else None

    pod = eventually(running, what="pod Running")
    node = _get(cluster, "node", pod["spec"]["nodeName"])
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert int(node["status"]["allocatable"]["nvidia.com/gpu"]) >= 1


def test_scheduler_honours_taints(
    cluster: Cluster, namespace: str, private_nodes: tuple[str, list[str]]
) -> None:
    pool, names = private_nodes
    eventually(
        lambda: (
            set(names)
            <= {
                n["metadata"]["name"]
                for n in _get(cluster, "nodes", "-l", f"trainguard.dev/test-pool={pool}")["items"]
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n["status"].get("conditions", [])
                )
            }
        ),
        what="private nodes Ready",
    )
    untainted = names[1]
    for name in names:
        if name != untainted:
            cluster.kubectl("taint", "node", name, "trainguard.dev/unhealthy=Test:NoSchedule")
    selector = {"nodeSelector": {"trainguard.dev/test-pool": pool}}
    for i in range(3):
        _create(cluster, namespace, _gpu_pod(f"tainted-{i}", **selector))
    for i in range(3):
        pod = eventually(
            lambda i=i: _get(cluster, "-n", namespace, "pod", f"tainted-{i}")["spec"].get(
                "nodeName"
            ),
            what=f"pod tainted-{i} bound",
        )
        assert pod == untainted


def test_unschedulable_storage_reason_is_readable(cluster: Cluster, namespace: str) -> None:
    _create(cluster, namespace, _gpu_pod("too-big", storage="100Ti"))

    def unschedulable() -> dict[str, Any] | None:
        pod = _get(cluster, "-n", namespace, "pod", "too-big")
        for cond in pod["status"].get("conditions", []):
            if cond["type"] == "PodScheduled" and cond["status"] == "False":
                return dict(cond)
        return None

    cond = eventually(unschedulable, what="PodScheduled=False")
    assert cond["reason"] == "Unschedulable"
    assert "Insufficient ephemeral-storage" in cond["message"]
    time.sleep(2)
    pod = _get(cluster, "-n", namespace, "pod", "too-big")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def test_garbage_collector_removes_owned_children(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("-n", namespace, "create", "configmap", "owner", "--from-literal=a=b")
    owner_uid = _get(cluster, "-n", namespace, "configmap", "owner")["metadata"]["uid"]
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}
            ],
        },
        "data": {"x": "y"},
    }
    _create(cluster, namespace, child)
    cluster.kubectl("-n", namespace, "delete", "configmap", "owner")

    def child_gone() -> bool:
        result = cluster.kubectl("-n", namespace, "get", "configmap", "child", check=False)
        return result.returncode != 0 and "NotFound" in result.stderr

    eventually(child_gone, what="child garbage-collected")


def test_rbac_denies_outside_the_role(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("-n", namespace, "create", "serviceaccount", "narrow")
    cluster.kubectl(
        "-n", namespace, "create", "role", "read-configmaps", "--verb=get,list",
        "--resource=configmaps",
    )  # fmt: skip
    cluster.kubectl(
        "-n", namespace, "create", "rolebinding", "narrow", "--role=read-configmaps",
        f"--serviceaccount={namespace}:narrow",
    )  # fmt: skip
    token = cluster.kubectl("-n", namespace, "create", "token", "narrow").stdout.strip()
    context = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))

    def status_of(method: str, path: str) -> int:
        """HTTP status of one request made with the service account's token only."""
        body = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}'
        request = urllib.request.Request(
            cluster.server + path, method=method, data=body if method == "POST" else None
        )
        request.add_header("Authorization", f"Bearer {token}")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as err:
            return int(err.code)

    ns = f"/api/v1/namespaces/{namespace}"
    eventually(lambda: status_of("GET", f"{ns}/configmaps") == 200, what="binding effective")
    denied = {
        "read secrets": ("GET", f"{ns}/secrets"),
        "list pods": ("GET", f"{ns}/pods"),
        "create a configmap": ("POST", f"{ns}/configmaps"),
        "read configmaps in kube-system": ("GET", "/api/v1/namespaces/kube-system/configmaps"),
        "list nodes": ("GET", "/api/v1/nodes"),
    }
    for action, (method, path) in denied.items():
        assert status_of(method, path) == 403, action


def test_server_reports_its_built_version(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == KUBE_VERSION
    assert version["clientVersion"]["gitVersion"] == KUBE_VERSION


@pytest.mark.parametrize(
    ("program", "args", "expected"),
    [
        ("etcd", ["--version"], "etcd Version: 3.6.16"),
        ("kube-apiserver", ["--version"], f"Kubernetes {KUBE_VERSION}"),
        ("kube-controller-manager", ["--version"], f"Kubernetes {KUBE_VERSION}"),
        ("kube-scheduler", ["--version"], f"Kubernetes {KUBE_VERSION}"),
        ("kubectl", ["version", "--client"], f"Client Version: {KUBE_VERSION}"),
        ("kwok", ["--version"], "kwok version v0.8.0"),
        ("helm", ["version"], 'Version:"v4.3.2"'),
    ],
)
def test_built_programs_report_their_versions(
    cluster: Cluster, program: str, args: list[str], expected: str
) -> None:
    result = subprocess.run(
        [str(cluster.bin_dir / program), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert expected in result.stdout + result.stderr
