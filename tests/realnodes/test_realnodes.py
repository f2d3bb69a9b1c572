"""Real nodes: registered with node credentials, running pods, the GPU simulator, Services, down.

The last tests (ordered after every other test of the session by their `removes_real_nodes`
marker) remove the real nodes, check the host against the snapshot taken before they were
added, and add them again; then kill every process of them and let another cluster claim the
host, which reverts what the killed ones left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from realnodes.conftest import REAL_NODES, RealCluster, host_snapshot
from trainguard.contract.env import GPU_SIMULATION
from trainguard_dev.cluster import realnode
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.polling import eventually

pytestmark = [pytest.mark.realnodes, pytest.mark.timeout(180)]

NAMES = [realnode.node_name(i) for i in range(REAL_NODES)]


def _pod(image: str, name: str, node: str, script: str, gpus: int = 0) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "dnsPolicy": "Default",
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }


def _run_pods(real: RealCluster, namespace: str, pods: list[dict[str, Any]]) -> None:
    docs = {"apiVersion": "v1", "kind": "List", "items": pods}
    real.cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(docs))

    def running() -> bool:
        out = real.cluster.kubectl("-n", namespace, "get", "pods", "-o", "json").stdout
        phases = [p["status"].get("phase") for p in json.loads(out)["items"]]
        return phases == ["Running"] * len(pods)

    eventually(
        running,
        timeout=60,
        what="pods Running",
        detail=lambda: real.cluster.kubectl("-n", namespace, "get", "events", check=False).stdout,
    )


def _logs(real: RealCluster, namespace: str, pod: str, needle: str) -> str:
    def has() -> str | None:
        out = real.cluster.kubectl("-n", namespace, "logs", pod, check=False).stdout
        return out if needle in out else None

    return eventually(has, timeout=30, what=f"{needle!r} in the log of {pod}")


def test_nodes_are_ready_with_node_credentials_and_gpus(real_cluster: RealCluster) -> None:
    cluster = real_cluster.cluster
    for name in NAMES:
        node = json.loads(cluster.kubectl("get", "node", name, "-o", "json").stdout)
        labels = node["metadata"]["labels"]
        assert labels[realnode.NODE_KIND_LABEL] == "real"
        assert labels["nvidia.com/gpu.present"] == "true"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True"
        cert = cluster.real_nodes.node(name).root / "pki" / "node.crt"
        subject = subprocess.run(
            ["openssl", "x509", "-noout", "-subject", "-in", str(cert)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert f"CN = system:node:{name}" in subject and "O = system:nodes" in subject


def test_pods_run_on_each_node_with_logs_and_exec(
    real_cluster: RealCluster, namespace: str
) -> None:
    pods = [
        _pod(real_cluster.image, f"p{i}", name, f"echo hello from {name}; sleep 3600")
        for i, name in enumerate(NAMES)
    ]
    _run_pods(real_cluster, namespace, pods)
    for i, name in enumerate(NAMES):
        _logs(real_cluster, namespace, f"p{i}", f"hello from {name}")
        out = real_cluster.cluster.kubectl("-n", namespace, "exec", f"p{i}", "--", "hostname")
        assert out.stdout.strip() == f"p{i}"


def test_gpu_pods_get_the_simulator_and_others_do_not(
    real_cluster: RealCluster, namespace: str
) -> None:
    node = real_cluster.cluster.real_nodes.node(NAMES[0])
    node.gpusim_state.write_text(json.dumps({"ghost_mib": 4321}))  # as a ghost test would
    show = f'echo "sim=${GPU_SIMULATION}"; echo "devs=$NVIDIA_VISIBLE_DEVICES"; '
    show += f'cat "${GPU_SIMULATION}" 2>/dev/null; echo; ls /run; echo done; sleep 3600'
    pods = [
        _pod(real_cluster.image, "gpu", node.name, show, gpus=2),
        _pod(real_cluster.image, "plain", node.name, show),
    ]
    try:
        _run_pods(real_cluster, namespace, pods)
        gpu = _logs(real_cluster, namespace, "gpu", "done")
        assert "sim=/run/trainguard-gpusim/gpu-sim.json" in gpu
        assert "devs=GPU-simulated-0,GPU-simulated-1" in gpu
        assert '"ghost_mib": 4321' in gpu
        plain = _logs(real_cluster, namespace, "plain", "done")
        assert "sim=\n" in plain and "devs=\n" in plain
        assert "trainguard-gpusim" not in plain
    finally:
        node.gpusim_state.write_text(json.dumps({"ghost_mib": 0}))


def test_pods_reach_the_apiserver_through_the_kubernetes_service(
    real_cluster: RealCluster, namespace: str
) -> None:
    # A plain HTTP request to the TLS port: the apiserver's answer proves who is there.
    script = (
        'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 5 "$KUBERNETES_SERVICE_HOST" '
        '"$KUBERNETES_SERVICE_PORT"; echo "host=$KUBERNETES_SERVICE_HOST"; sleep 3600'
    )
    pods = [_pod(real_cluster.image, f"p{i}", n, script) for i, n in enumerate(NAMES)]
    _run_pods(real_cluster, namespace, pods)
    for i in range(len(NAMES)):
        out = _logs(real_cluster, namespace, f"p{i}", "host=")
        assert "Client sent an HTTP request to an HTTPS server" in out
        assert "host=10.96.0.1" in out


def test_pods_on_two_nodes_find_each_other_by_their_headless_service_names(
    real_cluster: RealCluster, namespace: str
) -> None:
    """The names a gang's members use: `<hostname>.<subdomain>`, from the cluster's DNS.

    Member 0 serves on a port; member 1, on the other node, reaches it by its stable name
    (the search path completes `<namespace>.svc.cluster.local`), and a name that no pod
    holds does not resolve.
    """
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "gang"},
        "spec": {
            "clusterIP": "None",
            "selector": {"gang": "g"},
            # Names exist from scheduling on, not from readiness: members find each other
            # while they start, as a rendezvous needs.
            "publishNotReadyAddresses": True,
        },
    }
    real_cluster.cluster.kubectl(
        "-n", namespace, "create", "-f", "-", input=json.dumps(service)
    )  # fmt: skip
    serve = 'while true; do echo "hello from member 0" | nc -l -p 8080; done'
    reach = (
        "until nc -w 2 member-0.gang 8080; do sleep 0.5; done; "
        f"nslookup member-0.gang.{namespace}.svc.{realnode.CLUSTER_DOMAIN}; "
        "nslookup member-9.gang || echo 'member-9: no such name'; echo done; sleep 3600"
    )
    pods = []
    for index, (node, script) in enumerate(zip(NAMES, (serve, reach), strict=True)):
        pod = _pod(real_cluster.image, f"member-{index}", node, script)
        pod["metadata"]["labels"] = {"gang": "g"}
        pod["spec"].update(hostname=f"member-{index}", subdomain="gang", dnsPolicy="ClusterFirst")
        pods.append(pod)
    _run_pods(real_cluster, namespace, pods)
    out = _logs(real_cluster, namespace, "member-1", "done")
    assert "hello from member 0" in out
    member0 = json.loads(
        real_cluster.cluster.kubectl("-n", namespace, "get", "pod", "member-0", "-o", "json").stdout
    )
    assert member0["status"]["podIP"] in out  # the name's address is member 0's
    assert "member-9: no such name" in out


@pytest.mark.removes_real_nodes
@pytest.mark.timeout(240)
def test_down_leaves_the_host_as_it_was_and_up_again(real_cluster: RealCluster) -> None:
    cluster = real_cluster.cluster
    cluster.real_nodes.down()
    cluster.real_nodes.down()  # twice is fine
    after = host_snapshot(cluster.root)
    before = real_cluster.before
    assert after.processes == before.processes
    assert after.mounts == before.mounts
    assert after.cgroups == before.cgroups
    assert after.links == before.links
    assert after.iptables == before.iptables
    assert after.ip_forward == before.ip_forward
    assert after.paths == before.paths
    started = time.monotonic()
    real_cluster.up()
    assert time.monotonic() - started < 60


def _kill_every_process_of_real_nodes(root: Path) -> None:
    """SIGKILL kubelets, containerds, kube-proxies, the DNS server, shims and containers."""

    def none_left() -> bool:
        left = host_snapshot(root).processes
        for line in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
        return not left

    eventually(none_left, timeout=30, what="every real-node process gone", interval=0.5)


@pytest.mark.removes_real_nodes
@pytest.mark.timeout(180)
def test_real_nodes_killed_before_their_down_are_reverted_by_the_next_cluster_to_claim_the_host(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    cluster = real_cluster.cluster
    _kill_every_process_of_real_nodes(cluster.root)
    left = host_snapshot(cluster.root)
    assert left.iptables != real_cluster.before.iptables  # what a killed run leaves behind
    assert left.links != real_cluster.before.links
    other = Cluster("next-run", home=tmp_path)
    try:
        other.real_nodes._claim_host()
        after = host_snapshot(cluster.root)
        before = real_cluster.before
        assert after.processes == before.processes
        assert after.mounts == before.mounts
        assert after.cgroups == before.cgroups
        assert after.links == before.links
        assert after.iptables == before.iptables
        assert after.ip_forward == before.ip_forward
        assert after.paths == before.paths
        assert realnode.HOST_LOCK.read_text().strip() == str(other.root)
    finally:
        if realnode.HOST_LOCK.exists() and realnode.HOST_LOCK.read_text().strip() == str(
            other.root
        ):
            realnode.HOST_LOCK.unlink()


def test_another_clusters_running_real_nodes_are_refused_not_reverted(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    other = Cluster("next-run", home=tmp_path)
    with pytest.raises(realnode.RealNodeError, match="real nodes of another cluster run"):
        other.real_nodes._claim_host()
    assert realnode.HOST_LOCK.read_text().strip() == str(real_cluster.cluster.root)
    assert all(status.alive for status in real_cluster.cluster.real_node_status())
