"""Real nodes for the `realnodes` tier: added to the session's control plane, not a second one.

Heavy scenarios share one cluster: `real_cluster` adds REAL_NODES real nodes (kubelet,
containerd, runc, kube-proxy) to the suite's `cluster` (its apiserver restarts once with what
real nodes need), imports the test shell image into each, and takes a snapshot of the host
before, so that a test can check that removing them leaves the host as it was. The real
nodes are removed at the end of the session.

`trainguard` installs the chart's operator on a real node for the scenarios; they run the
reference trainer in the trainer image (`real_run`, data staged from `shards_claim`), and read
and act on it through the helpers at the end of this module.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from session_cluster import TEST_NODES, TEST_PROCESS_NODES
from trainguard.api.constants import LABEL_ATTEMPT, LABEL_RUN, Verdict
from trainguard.ckpt import MANIFEST_FILENAME
from trainguard.layers.lineage import CheckpointRef, parse_key
from trainguard_dev import images
from trainguard_dev.cluster import realnode
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing import chart
from trainguard_dev.testing.pods import checkpointed, real_state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.runs import make_shards, real_node_run
from trainguard_dev.testing.servers import INSTALL_HINT, WEED, SeaweedFS

REAL_NODES = 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests that remove the real nodes after every other test of the session.

    Removing them takes the images and the chart's operator with them.
    """
    last = [item for item in items if item.get_closest_marker("removes_real_nodes")]
    items[:] = [item for item in items if item not in last] + last


@dataclass(frozen=True)
class HostSnapshot:
    """What real nodes may change on the host: processes, mounts, cgroups, links, rules."""

    processes: frozenset[str]
    mounts: frozenset[str]
    cgroups: frozenset[str]
    links: frozenset[str]
    iptables: frozenset[str]
    ip_forward: str
    paths: frozenset[str]


def _processes(root: Path) -> frozenset[str]:
    """Processes of real nodes: named by the cluster's files, or in a real node's cgroups.

    A zombie has ended: a container's process whose shim was killed waits there for the
    host's init to reap it, which it does in its own time.
    """
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cgroups = (entry / "cgroup").read_text()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "Z":
            continue
        if f"{root}/realnodes" in cmdline or "/trainguard-" in cgroups:
            found.add(f"{entry.name} {cmdline}")
    return frozenset(found)


def _iptables_rules() -> frozenset[str]:
    # Rules and user chains only: listing a table instantiates its empty built-in chains.
    rules = set()
    for tool in realnode.IPTABLES:
        for table in realnode.IPTABLES_TABLES:
            out = subprocess.run(
                [tool, "-t", table, "-S"], capture_output=True, text=True, check=False
            ).stdout
            for line in out.splitlines():
                if line.startswith(("-A", "-N")):
                    rules.add(f"{tool} {table} {shlex.join(shlex.split(line))}")
    return frozenset(rules)


def host_snapshot(root: Path) -> HostSnapshot:
    """The host's state as far as real nodes touch it."""
    # Mounts real nodes make: under the cluster, the kubelet's and CNI's host paths, netns.
    places = (str(root), *realnode.HOST_PATHS)
    mounts = frozenset(
        m for m, fstype in realnode._mounts() if fstype == "nsfs" or m.startswith(places)
    )
    cgroups = frozenset(str(p) for h in realnode._hierarchies() for p in h.glob("trainguard-*"))
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return HostSnapshot(
        processes=_processes(root),
        mounts=mounts,
        cgroups=cgroups,
        links=frozenset(line.split(":")[1].strip() for line in links.stdout.splitlines()),
        iptables=_iptables_rules(),
        ip_forward=Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
        paths=frozenset(p for p in realnode.HOST_PATHS if Path(p).exists()),
    )


@dataclass(frozen=True)
class RealCluster:
    """The session's cluster with real nodes, the shell image in them, the host before."""

    cluster: Cluster
    before: HostSnapshot
    image: str
    image_tar: Path

    def up(self) -> float:
        """(Re)start the real nodes (idempotent); return the seconds it took."""
        seconds = self.cluster.up(
            nodes=TEST_NODES, process_nodes=TEST_PROCESS_NODES, real_nodes=REAL_NODES
        )
        realnode.import_image_everywhere(self.cluster, self.image_tar, self.image)
        return seconds


@pytest.fixture(scope="session")
def real_cluster(cluster: Cluster) -> Iterator[RealCluster]:
    """The session's control plane with REAL_NODES real nodes (removed at the end)."""
    before = host_snapshot(cluster.root)
    image_tar, image = realnode.busybox_image()
    started = RealCluster(cluster, before, image, image_tar)
    try:
        started.up()
        yield started
    finally:
        cluster.real_nodes.down()


# ----- trainguard installed from its chart, running on the real nodes ----------------------

RELEASE = "trainguard"
RELEASE_NAMESPACE = "trainguard-system"
# The namespace of the real-node scenarios' runs: the operator watches it (and only it, so
# the process-node tests' own operators and this one never reconcile the same runs).
RUNS_NAMESPACE = "realnode-runs"
REAL_NODE_SELECTOR = {realnode.NODE_KIND_LABEL: realnode.NODE_KIND_REAL}
# The operator runs on the first real node; the node-loss scenario stops the other one.
OPERATOR_NODE = realnode.node_name(0)
RESYNC_SECONDS = 5
# Tainted nodes are checked again this soon (the chart's default is a minute).
NODE_RECHECK_SECONDS = 5


@dataclass(frozen=True)
class Trainguard:
    """The chart's operator running on a real node, and the images the runs use."""

    real: RealCluster
    operator_image: images.Image
    trainer_image: images.Image

    @property
    def cluster(self) -> Cluster:
        """The session's control plane."""
        return self.real.cluster


def install_chart(cluster: Cluster, operator: images.Image) -> None:
    """`helm upgrade --install` the chart as it is, with the image built here."""
    chart.install_chart(
        cluster,
        operator.ref,
        release=RELEASE,
        namespace=RELEASE_NAMESPACE,
        watch_namespaces=[RUNS_NAMESPACE],
        node_selector={**REAL_NODE_SELECTOR, chart.HOSTNAME_LABEL: OPERATOR_NODE},
        resync_seconds=RESYNC_SECONDS,
        node_recheck_seconds=NODE_RECHECK_SECONDS,
    )


@pytest.fixture(scope="session")
def trainguard(real_cluster: RealCluster) -> Iterator[Trainguard]:
    """The project's images in every real node and the chart's operator Ready on one of them.

    The release and the runs' namespaces enforce Pod Security `restricted`.
    """
    cluster = real_cluster.cluster
    built = images.build_images()
    operator, trainer = built[images.OPERATOR.name], built[images.TRAINER.name]
    for image in (operator, trainer):
        realnode.import_image_everywhere(cluster, image.tar, image.ref)
    for name in (RELEASE_NAMESPACE, RUNS_NAMESPACE):
        chart.restricted_namespace(cluster, name)
    install_chart(cluster, operator)
    try:
        yield Trainguard(real_cluster, operator, trainer)
    finally:
        cluster.kubectl("delete", "trainingruns", "--all", "-n", RUNS_NAMESPACE, check=False)
        chart.uninstall_chart(cluster, RELEASE, RELEASE_NAMESPACE)


def kubectl_json(cluster: Cluster, *args: str) -> Any:
    """`kubectl <args> -o json`, parsed."""
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def apply_in_runs(cluster: Cluster, *objects: dict[str, Any]) -> None:
    """`kubectl apply` the objects in the runs' namespace."""
    docs = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-n", RUNS_NAMESPACE, "-f", "-", input=json.dumps(docs))


@pytest.fixture
def run_name(request: pytest.FixtureRequest, trainguard: Trainguard) -> Iterator[str]:
    """A run name for one test (from the test's name); the run is deleted afterwards."""
    name = request.node.originalname.removeprefix("test_").replace("_", "-")[:40].strip("-")
    yield name
    trainguard.cluster.kubectl(
        "delete", "trainingrun", name, "-n", RUNS_NAMESPACE, "--wait=false", check=False
    )


@pytest.fixture(scope="session")
def real_s3(
    real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SeaweedFS]:
    """An S3 server (SeaweedFS) on the host's address on the pod network: pods reach it."""
    if not WEED.exists():
        pytest.fail(f"no SeaweedFS binary at {WEED}: {INSTALL_HINT}")
    server = SeaweedFS(
        tmp_path_factory.mktemp("real-s3"), ip=real_cluster.cluster.pod_reachable_host_ip()
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


# ----- the scenarios' runs: the reference trainer on the real nodes ------------------------

SHARDS_CLAIM = "shards"
SHARDS_PV = "realnode-shards"
# The Secret of the runs' s3:// layers on `real_s3`.
S3_SECRET = "s3-credentials"
S3_LAYER = "s3"
BOUND_TIMEOUT_S = 60
CHECKPOINTS_TIMEOUT_S = 240
EXEC_TIMEOUT_S = 60


@pytest.fixture(scope="session")
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


def real_run(
    trainguard: Trainguard, name: str, claim: str, every_steps: int, spec: dict[str, Any]
) -> dict[str, Any]:
    """The reference trainer in the trainer image built here, on the real nodes.

    In the runs' namespace, its data staged from `claim`; `spec` changes the rest.
    """
    return real_node_run(
        name,
        trainguard.trainer_image.ref,
        claim,
        every_steps,
        REAL_NODE_SELECTOR,
        spec,
        namespace=RUNS_NAMESPACE,
    )


def run_status(cluster: Cluster, name: str) -> dict[str, Any]:
    """The run's status (empty until the operator wrote one)."""
    run = kubectl_json(cluster, "get", "trainingrun", name, "-n", RUNS_NAMESPACE)
    return run.get("status") or {}


def run_pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    """The run's pods."""
    listed = kubectl_json(cluster, "get", "pods", "-n", RUNS_NAMESPACE, "-l", f"{LABEL_RUN}={name}")
    return list(listed["items"])


def bound_pod(cluster: Cluster, name: str, attempt: int = 1) -> dict[str, Any] | None:
    """The run's pod of `attempt` once it is bound to a node, else None."""
    for pod in run_pods(cluster, name):
        labels = pod["metadata"].get("labels") or {}
        if labels.get(LABEL_ATTEMPT) == str(attempt) and pod["spec"].get("nodeName"):
            return pod
    return None


def run_events(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    """The Events about the run."""
    listed = kubectl_json(
        cluster, "get", "events", "-n", RUNS_NAMESPACE,
        "--field-selector", f"involvedObject.kind=TrainingRun,involvedObject.name={name}",
    )  # fmt: skip
    return list(listed["items"])


def pod_state(trainguard: Trainguard, pod: dict[str, Any]) -> Path:
    """The pod's state volume where its real node's kubelet keeps it (heartbeat, reports)."""
    node = trainguard.cluster.real_nodes.node(pod["spec"]["nodeName"])
    return real_state_dir(node.kubelet_root, pod)


def exec_python(cluster: Cluster, pod: str, container: str, script: str) -> str:
    """Run Python in one of the pod's containers, as that container's user."""
    return cluster.kubectl(
        "exec", "-n", RUNS_NAMESPACE, pod, "-c", container, "--", "python", "-c", script,
        timeout=EXEC_TIMEOUT_S,
    ).stdout  # fmt: skip


def _recent_events(cluster: Cluster) -> str:
    return cluster.kubectl(
        "get", "events", "-n", RUNS_NAMESPACE, "--sort-by=.lastTimestamp", check=False
    ).stdout[-3000:]


def training(
    trainguard: Trainguard, run: dict[str, Any], every_steps: int, attempt: int = 1
) -> tuple[dict[str, Any], realnode.RealNode, Path]:
    """Apply the run; wait for its pod on a real node, two checkpoints and a Healthy verdict.

    Returns the pod, its node and its state volume.
    """
    cluster = trainguard.cluster
    name = run["metadata"]["name"]
    apply_in_runs(cluster, run)
    pod = eventually(
        lambda: bound_pod(cluster, name, attempt),
        timeout=BOUND_TIMEOUT_S,
        what="the run's pod bound to a real node",
        detail=lambda: json.dumps(run_status(cluster, name))[:2000],
    )
    node = cluster.real_nodes.node(pod["spec"]["nodeName"])  # raises unless a real node
    state = pod_state(trainguard, pod)
    eventually(
        lambda: checkpointed(state, 2 * every_steps),
        timeout=CHECKPOINTS_TIMEOUT_S,
        what="training with two checkpoints",
        detail=lambda: _recent_events(cluster),
    )
    eventually(lambda: run_status(cluster, name).get("verdict") == Verdict.HEALTHY, what="Healthy")
    return pod, node, state


def s3_secret(server: SeaweedFS) -> dict[str, Any]:
    """The Secret `S3_SECRET` of the runs' layers on `server`."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": S3_SECRET, "namespace": RUNS_NAMESPACE},
        "stringData": server.secret_data(),
    }


def s3_bucket(server: SeaweedFS, cluster: Cluster) -> str:
    """A fresh bucket on `server`, and the Secret `S3_SECRET` that reaches it; the bucket."""
    bucket = f"tg-{uuid.uuid4().hex[:12]}"
    server.client().create_bucket(Bucket=bucket)
    apply_in_runs(cluster, s3_secret(server))
    return bucket


def shipped_step(cluster: Cluster, name: str, layer: str = S3_LAYER) -> int | None:
    """The newest step the run's status says is verified on `layer`, else None."""
    layers = {c["layer"]: c for c in run_status(cluster, name).get("checkpoints", [])}
    entry = layers.get(layer, {})
    return entry.get("step") if entry.get("verified") and entry.get("step") else None


def s3_checkpoints(server: SeaweedFS, bucket: str, prefix: str) -> set[CheckpointRef]:
    """Complete checkpoints under `prefix` in the bucket, with the attempt that shipped each."""
    prefix = f"{prefix}/"
    found = set()
    for page in (
        server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    ):
        for item in page.get("Contents", []):
            parsed = parse_key(item["Key"][len(prefix) :])
            if parsed is not None and parsed[1] == MANIFEST_FILENAME:
                found.add(parsed[0])
    return found
