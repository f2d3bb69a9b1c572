"""The nodes `trainguard demo` runs its story on, behind one interface the story uses.

`ProcessNodes` (the default): two process-backed GPU nodes, whose pods run as local
processes, and the operator as a local process with exactly the chart's RBAC. The trainer's
files and output are in the pod's directory on the process node; its PID is a host PID.

`RealNodes` (``--real-nodes``): two real nodes (kubelet, containerd, runc, kube-proxy; the
GPUs simulated), the images built here imported into each, and trainguard installed in-cluster
from its Helm chart, as a user has it. The trainer's state volume is where the kubelet keeps
it, its output in the kubelet's pod logs; its PID is in the pod's PID namespace, so it is
killed from inside its own container, as its own user (``kubectl exec``).

Both give a run made from ``examples/demo.yaml`` and the claim of its remote layer, a
hostPath volume every node reaches (it stands for network storage).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from trainguard.contract.env import PREFLIGHT_MIN_READ_MBPS, PREFLIGHT_MIN_WRITE_MBPS
from trainguard.operator.build.pod import POD_FS_GROUP
from trainguard_dev import images
from trainguard_dev.cluster import realnode
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.nodes import process_node_name
from trainguard_dev.cluster.procnode import ENV_FILENAME, claim_dir
from trainguard_dev.demo import env as demo_env
from trainguard_dev.demo.watch import PodFiles
from trainguard_dev.testing import chart
from trainguard_dev.testing.pods import pod_directory, real_state_dir, state_dir
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import SHARDS_SIZE, example_run, make_shards

Obj = dict[str, Any]
Say = Callable[[str], None]  # the display's narration

NODE_COUNT = 2
KWOK_NODES = 1
# Process-node control files the demo may have left behind on a reused cluster.
CONTROL_FILES = ("gpu-sim.json", "down", ENV_FILENAME)
GPU_SIM_FILE = "gpu-sim.json"
# The process nodes' disk is this machine's, shared with whatever else runs on it: the
# preflight's bandwidth floors (50 MB/s, for a GPU node's local NVMe) are lowered for them,
# as a node class's own setting, so a busy laptop does not read as a sick node.
NODE_ENV = {PREFLIGHT_MIN_WRITE_MBPS: "5", PREFLIGHT_MIN_READ_MBPS: "5"}

# In-cluster trainguard on real nodes: its own release name, so that it never takes over a
# release of the same cluster's tests, which watch other namespaces.
RELEASE = "trainguard-demo"
REAL_NODE_SELECTOR = {realnode.NODE_KIND_LABEL: realnode.NODE_KIND_REAL}
OPERATOR_NODE = realnode.node_name(0)
SHARDS_CLAIM = "demo-shards"
# The agent and the init steps run as the operator image's user; a hostPath directory is
# not chowned by the kubelet (as a network share's export would be), so the demo does it.
AGENT_UID = 65532
# The trainer reports at least once a second; older than this, it is not training.
FRESH_HEARTBEAT_S = 5.0
EXEC_TIMEOUT = 30.0


class Nodes(Protocol):
    """What the demo's story needs from the nodes it runs on."""

    cluster: Cluster
    description: str  # what the nodes and the operator are, for the summary

    def up(self, say: Say) -> None:
        """Bring the cluster up with these nodes (and what they need); narrate."""

    def names(self) -> list[str]:
        """The nodes a run of the demo may land on."""

    def namespace(self, name: str) -> None:
        """Create the namespace of the demo's run."""

    def start_operator(self, namespace: str, workdir: Path, say: Say) -> None:
        """Run the operator, watching `namespace`; narrate."""

    def operator_problem(self) -> str | None:
        """Why the operator cannot act any more, or None."""

    def operator_log(self) -> str | None:
        """Where the operator's log is (None before the operator is started)."""

    def stop_operator(self) -> None:
        """Stop the operator where the demo ends (idempotent)."""

    def run(self, name: str, namespace: str, workdir: Path) -> Obj:
        """The demo's run (examples/demo.yaml), its data staged where its pods read it."""

    def backup_claim(self, namespace: str) -> None:
        """Create the remote layer's claim, bound to a volume every node reaches."""

    def pod_files(self, pod: Obj) -> PodFiles:
        """Where a pod bound to one of these nodes keeps its state volume and output."""

    def kill_trainer(self, pod: str, namespace: str, pid: int) -> None:
        """SIGKILL the trainer (`pid`, as its heartbeat says) of a pod."""

    def trainer_alive(self, beat: Obj) -> bool:
        """Whether the trainer that wrote this heartbeat is alive."""

    def inject_ghost(self, node: str, mib: int) -> None:
        """Make the node's simulated GPU keep `mib` MiB that no process holds."""

    def reset(self, node: str) -> None:
        """A healthy node again: no ghost memory, no fault left by an earlier demo."""


def real_node_run(name: str, trainer_image: str) -> Obj:
    """examples/demo.yaml on the real nodes: the trainer image built here, data from a PVC.

    The data source and the node selector are replaced, not merged: a run names one source,
    and the real nodes carry no process-backed label.
    """
    run = example_run("demo", name)
    spec = run["spec"]
    spec["trainer"]["image"] = trainer_image
    spec["data"] = {"source": {"pvc": {"claimName": SHARDS_CLAIM}}, "size": SHARDS_SIZE}
    spec["placement"]["nodeSelector"] = dict(REAL_NODE_SELECTOR)
    return run


class ProcessNodes:
    """Process-backed nodes and the operator as a local process with the chart's RBAC."""

    description = (
        "process-backed nodes (pods run as local processes; simulated GPUs); the operator a "
        "local process with the chart's RBAC"
    )

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.operator: OperatorProcess | None = None

    def up(self, say: Say) -> None:
        """The control plane with one kwok and two process-backed GPU nodes."""
        seconds = self.cluster.up(nodes=KWOK_NODES, process_nodes=NODE_COUNT)
        say(
            f"local control plane {self.cluster.name!r} ready in {seconds:.1f} s: "
            f"{NODE_COUNT} process-backed GPU nodes (simulated GPUs, real processes)"
        )

    def names(self) -> list[str]:
        """proc-node-0 and proc-node-1."""
        return [process_node_name(i) for i in range(NODE_COUNT)]

    def namespace(self, name: str) -> None:
        """A plain namespace."""
        demo_env.ensure_namespace(self.cluster, name)

    def start_operator(self, namespace: str, workdir: Path, say: Say) -> None:
        """The operator as a local process, with only the chart's ServiceAccount's token."""
        account, kubeconfig = demo_env.operator_identity(
            self.cluster, demo_env.source_tree(), namespace, workdir
        )
        self.operator = demo_env.operator_process(kubeconfig, namespace, workdir / "operator.log")
        self.operator.start()
        say(
            f"operator started as a local process with only the chart's RBAC (ServiceAccount "
            f"{demo_env.OPERATOR_NAMESPACE}/{account}); log: {self.operator.log_path}"
        )

    def operator_problem(self) -> str | None:
        """The operator process exited."""
        if self.operator is not None and not self.operator.alive():
            return f"the operator exited; see {self.operator.log_path}"
        return None

    def operator_log(self) -> str | None:
        """The operator process's log file."""
        return str(self.operator.log_path) if self.operator else None

    def stop_operator(self) -> None:
        """Stop the operator process."""
        if self.operator is not None:
            self.operator.stop()

    def run(self, name: str, namespace: str, workdir: Path) -> Obj:
        """Synthetic shards in the demo's directory, staged from a file:// source."""
        return demo_env.demo_run(name, make_shards(workdir / "shards"))

    def backup_claim(self, namespace: str) -> None:
        """Every process node serves the claim's volume from the same directory."""
        demo_env.create_claim(self.cluster, namespace, demo_env.backup_claim())

    def pod_files(self, pod: Obj) -> PodFiles:
        """The process node's pod directory: volumes and ``<container>.log``."""
        directory = pod_directory(self.cluster.root, pod)
        return PodFiles(state_dir(self.cluster.root, pod), directory, "trainer.log")

    def kill_trainer(self, pod: str, namespace: str, pid: int) -> None:
        """The trainer is a local process: signal it."""
        os.kill(pid, signal.SIGKILL)

    def trainer_alive(self, beat: Obj) -> bool:
        """The heartbeat's PID is a live local process."""
        if beat.get("pid") is None:
            return False
        try:
            os.kill(int(beat["pid"]), 0)
        except ProcessLookupError:
            return False
        return True

    def inject_ghost(self, node: str, mib: int) -> None:
        """The process node's GPU simulator reads its control file."""
        (self._control(node) / GPU_SIM_FILE).write_text(json.dumps({"ghost_mib": mib}))

    def reset(self, node: str) -> None:
        """No control file of an earlier demo; the nodes' lowered preflight floors."""
        control = self._control(node)
        for name in CONTROL_FILES:
            (control / name).unlink(missing_ok=True)
        control.mkdir(parents=True, exist_ok=True)
        (control / ENV_FILENAME).write_text(json.dumps(NODE_ENV))

    def _control(self, node: str) -> Path:
        return self.cluster.root / "procnodes" / node


class RealNodes:
    """Real nodes, the images built here, and trainguard in-cluster from its chart."""

    description = (
        "real nodes (kubelet, containerd, runc, kube-proxy; simulated GPUs); the operator "
        "in-cluster, installed from the Helm chart"
    )

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.built: dict[str, images.Image] = {}
        self.installed = False
        self.workdir = cluster.root / "demo"

    def up(self, say: Say) -> None:
        """The control plane with two real nodes; the project's images in each."""
        seconds = self.cluster.up(nodes=0, process_nodes=0, real_nodes=NODE_COUNT)
        say(
            f"local control plane {self.cluster.name!r} ready in {seconds:.1f} s: "
            f"{NODE_COUNT} real nodes ({', '.join(self.names())}: kubelet, containerd, runc, "
            "kube-proxy; simulated GPUs)"
        )
        say("building the images (cached by content; the first build takes minutes)")
        started = time.monotonic()
        self.built = built = images.build_images()
        for image in built.values():
            for node in self.cluster.real_nodes.nodes():
                if not node.ctr("images", "ls", "-q", f"name=={image.ref}").strip():
                    realnode.import_image(node, image.tar, image.ref)
        say(
            f"images {', '.join(i.ref for i in built.values())} in every real node "
            f"({time.monotonic() - started:.0f} s)"
        )

    def names(self) -> list[str]:
        """real-node-0 and real-node-1."""
        return [realnode.node_name(i) for i in range(NODE_COUNT)]

    def namespace(self, name: str) -> None:
        """A namespace that enforces Pod Security `restricted`."""
        chart.restricted_namespace(self.cluster, name)

    def start_operator(self, namespace: str, workdir: Path, say: Say) -> None:
        """`helm upgrade --install` of the chart, the operator pod Ready on real-node-0."""
        self.workdir = workdir
        operator = self.built[images.OPERATOR.name]
        chart.restricted_namespace(self.cluster, demo_env.OPERATOR_NAMESPACE)
        self.installed = True
        chart.install_chart(
            self.cluster,
            operator.ref,
            release=RELEASE,
            namespace=demo_env.OPERATOR_NAMESPACE,
            watch_namespaces=[namespace],
            node_selector={**REAL_NODE_SELECTOR, chart.HOSTNAME_LABEL: OPERATOR_NODE},
            resync_seconds=demo_env.RESYNC_SECONDS,
        )
        say(
            f"operator running in-cluster on {OPERATOR_NODE}, installed from the Helm chart "
            f"(release {demo_env.OPERATOR_NAMESPACE}/{RELEASE}, image {operator.ref}, Pod "
            f"Security restricted); log: kubectl logs -n {demo_env.OPERATOR_NAMESPACE} "
            f"deploy/{RELEASE}"
        )

    def operator_problem(self) -> str | None:
        """None: the kubelet restarts an operator that exits, and the demo waits for it."""
        return None

    def operator_log(self) -> str | None:
        """The operator pod's log, saved beside the demo's files."""
        if not self.installed:
            return None
        logs = self.cluster.kubectl(
            "logs", "-n", demo_env.OPERATOR_NAMESPACE, f"deploy/{RELEASE}", "--tail=-1",
            check=False,
        )  # fmt: skip
        path = self.workdir / "operator.log"
        path.write_text(logs.stdout + logs.stderr)
        return str(path)

    def stop_operator(self) -> None:
        """Nothing: the operator stays in the cluster, as installed, watching the run."""

    def run(self, name: str, namespace: str, workdir: Path) -> Obj:
        """examples/demo.yaml with the trainer image built here, staged from a PVC."""
        shards = make_shards(claim_dir(self.cluster.root, namespace, SHARDS_CLAIM))
        for path in (shards, *shards.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)  # read by the stage-data step's user
        demo_env.create_claim(self.cluster, namespace, SHARDS_CLAIM)
        return real_node_run(name, self.built[images.TRAINER.name].ref)

    def backup_claim(self, namespace: str) -> None:
        """The volume's directory writable by the agent's user and the pod's group."""
        directory = demo_env.backup_dir(self.cluster, namespace)
        directory.mkdir(parents=True, exist_ok=True)
        os.chown(directory, AGENT_UID, POD_FS_GROUP)
        directory.chmod(0o2775)
        demo_env.create_claim(self.cluster, namespace, demo_env.backup_claim())

    def pod_files(self, pod: Obj) -> PodFiles:
        """The kubelet's emptyDir of the state volume; its pod logs directory."""
        node = self.cluster.real_nodes.node(str(pod["spec"]["nodeName"]))
        meta = pod["metadata"]
        logs = node.root / "pod-logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        return PodFiles(real_state_dir(node.kubelet_root, pod), logs, "trainer/*.log")

    def kill_trainer(self, pod: str, namespace: str, pid: int) -> None:
        """SIGKILL from inside the trainer container, as its own user (as an OOM kill would)."""
        self.cluster.kubectl(
            "exec", "-n", namespace, pod, "-c", "trainer", "--",
            "python", "-c", f"import os; os.kill({pid}, 9)", timeout=EXEC_TIMEOUT,
        )  # fmt: skip

    def trainer_alive(self, beat: Obj) -> bool:
        """The training loop reported within the last seconds (same clock: same host)."""
        reported = beat.get("time")
        return isinstance(reported, int | float) and time.time() - reported < FRESH_HEARTBEAT_S

    def inject_ghost(self, node: str, mib: int) -> None:
        """The node's GPU simulator state, which its containers' GPU probe reads."""
        self.cluster.real_nodes.node(node).gpusim_state.write_text(json.dumps({"ghost_mib": mib}))

    def reset(self, node: str) -> None:
        """No ghost memory."""
        self.cluster.real_nodes.node(node).gpusim_state.write_text("{}")
