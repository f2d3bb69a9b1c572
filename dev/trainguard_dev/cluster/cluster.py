"""Start, inspect and stop one local control plane, every process tracked by its PID.

A cluster lives in ``<home>/clusters/<name>/``: its PKI, kubeconfig, chosen ports, one log
and one PID file per component. Components start in dependency order (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok); each is waited for with a deadline, and a
component that dies or never becomes ready raises `ClusterError` carrying its log tail.
Ports are chosen free at start-up, so two clusters on one machine never collide.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard_dev.cluster import nodes as node_manifests
from trainguard_dev.cluster.pki import Pki
from trainguard_dev.cluster.realnode import SERVICE_CIDR, RealNodeError, RealNodes

# Order matters: each component needs the ones before it. procnode (the runtime of the
# process-backed nodes) runs only when the cluster has such nodes.
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "procnode",
)
OPTIONAL_COMPONENTS = ("procnode",)
PORT_NAMES = ("etcd-client", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok")
# Short grace periods make node-loss scenarios observable in seconds, not minutes.
NODE_MONITOR_GRACE = "20s"
NODE_MONITOR_PERIOD = "2s"
NODE_LEASE_SECONDS = "20"
KWOK_NODE_SELECTOR = "kwok.x-k8s.io/node=fake"
# Pod addresses kwok hands out where its configuration file is used (room for a large gang).
KWOK_POD_CIDR = "10.0.0.0/16"
KWOK_STAGE_FILES = (
    "node-initialize.yaml",
    "node-heartbeat-with-lease.yaml",
    "pod-ready.yaml",
    "pod-complete.yaml",
    "pod-delete.yaml",
)
LOG_TAIL_LINES = 40
STOP_GRACE_SECONDS = 10.0


class ClusterError(RuntimeError):
    """A component failed to start or become ready; the message carries its log tail."""


def default_home() -> Path:
    """Where clusters and binaries live: $TRAINGUARD_HOME, else the source tree's .cache."""
    configured = os.environ.get("TRAINGUARD_HOME")
    if configured:
        return Path(configured)
    repo = _source_tree()
    if repo is not None:
        return repo / ".cache"
    return Path.home() / ".cache" / "trainguard"


def _source_tree() -> Path | None:
    """The repository root when trainguard runs from its source tree (editable install)."""
    candidate = Path(__file__).resolve().parents[3]
    if (candidate / "hack" / "build-control-plane.sh").exists():
        return candidate
    return None


def ensure_binaries(home: Path) -> Path:
    """Return the directory of the control-plane binaries, building them when missing."""
    configured = os.environ.get("TRAINGUARD_BIN_DIR")
    bin_dir = Path(configured) if configured else home / "bin"
    needed = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
    if all((bin_dir / name).exists() for name in (*needed, "kubectl")) and _stage_dir(home):
        return bin_dir
    repo = _source_tree()
    if configured or repo is None:
        raise ClusterError(
            f"control-plane binaries missing in {bin_dir}; build them with "
            "hack/build-control-plane.sh from the trainguard source tree"
        )
    print("building the control plane (once; later runs reuse the cache) ...", file=sys.stderr)
    env = {**os.environ, "TRAINGUARD_CACHE": str(home)}
    result = subprocess.run(
        ["bash", str(repo / "hack" / "build-control-plane.sh")], env=env, check=False
    )
    if result.returncode != 0:
        raise ClusterError("hack/build-control-plane.sh failed (see its output above)")
    return bin_dir


def _stage_dir(home: Path) -> Path | None:
    for candidate in sorted(home.glob("kwok-stages-*")):
        if (candidate / ".complete").exists():
            return candidate
    return None


def _free_ports(count: int) -> list[int]:
    # Hold every socket open until all are chosen so one call never returns a port twice.
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process still answers kill(0); treat it as gone.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


@dataclass(frozen=True)
class ComponentStatus:
    """One component's PID and whether it is alive."""

    name: str
    pid: int | None
    alive: bool


class Cluster:
    """One named local control plane."""

    def __init__(
        self,
        name: str = "default",
        home: Path | None = None,
        node_lease_seconds: int = 0,
        kwok_parallelism: int = 0,
    ) -> None:
        """A cluster named `name` under `home` (default: `default_home`).

        `node_lease_seconds`: the kwok nodes' Lease duration, and the controller manager's
        grace before it marks a node NotReady (default `NODE_LEASE_SECONDS` and
        `NODE_MONITOR_GRACE`: a lost node shows in seconds). A benchmark simulating a thousand
        kubelets on two cores raises both, so that the simulated nodes' late renewals under its
        own load do not read as lost nodes; it applies when this object starts the cluster.

        `kwok_parallelism`: how many pods, and how many nodes, kwok moves through their
        stages at once (default kwok's own, 4). kwok plays the kubelets of every node, which
        on real nodes work in parallel; a benchmark of a thousand-node gang raises it so that
        the figures measure the operator rather than the simulator's queue.
        """
        if not name or not name.replace("-", "").isalnum():
            raise ValueError(f"cluster name must be letters, digits and '-', got {name!r}")
        self.name = name
        self.node_lease = str(node_lease_seconds) if node_lease_seconds else NODE_LEASE_SECONDS
        self.node_grace = f"{node_lease_seconds}s" if node_lease_seconds else NODE_MONITOR_GRACE
        self.kwok_parallelism = kwok_parallelism
        self.home = home or default_home()
        self.root = self.home / "clusters" / name
        self.pki = Pki(self.root / "pki")
        self.kubeconfig = self.root / "kubeconfig"
        self.log_dir = self.root / "logs"
        self.pid_dir = self.root / "pids"
        self._bin_dir: Path | None = None
        self.real_nodes = RealNodes(self)

    # ----- paths and helpers -------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        """Directory of the control-plane binaries (built on first use)."""
        if self._bin_dir is None:
            self._bin_dir = ensure_binaries(self.home)
        return self._bin_dir

    def log_path(self, component: str) -> Path:
        """The log file of one component."""
        return self.log_dir / f"{component}.log"

    def _pid_path(self, component: str) -> Path:
        return self.pid_dir / f"{component}.pid"

    def _etcd_data(self) -> Path:
        # etcd on tmpfs: fast, and the cluster's state is meant to be disposable.
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK):
            digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:10]
            return shm / f"trainguard-{digest}-{self.name}"
        return self.root / "etcd-data"

    def ports(self) -> dict[str, int]:
        """The ports chosen when the cluster started."""
        data: dict[str, int] = json.loads((self.root / "ports.json").read_text())
        return data

    @property
    def server(self) -> str:
        """The apiserver's URL."""
        return f"https://127.0.0.1:{self.ports()['apiserver']}"

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the cluster's kubectl against it; raise with stderr when `check` and it fails."""
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def wait_established(self, crd: str, timeout: float = 60.0) -> None:
        """Wait until CustomResourceDefinition `crd` is Established; raise ClusterError if not.

        Polled rather than `kubectl wait --for=condition=Established`, which fails at once
        ("conditions accessor error") when it reads a CRD created moments ago, before the
        apiserver has written any condition.
        """
        deadline = time.monotonic() + timeout
        path = '{.status.conditions[?(@.type=="Established")].status}'
        while True:
            got = self.kubectl("get", "crd", crd, "-o", f"jsonpath={path}", check=False)
            if got.returncode == 0 and got.stdout.strip() == "True":
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"CRD {crd} not Established after {timeout:.0f} s: {got.stderr}")
            time.sleep(0.2)

    def log_tail(self, component: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of a component's log."""
        path = self.log_path(component)
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # ----- status ------------------------------------------------------------------------

    def status(self) -> list[ComponentStatus]:
        """PID and liveness of every component that this cluster runs."""
        result = []
        for component in COMPONENTS:
            pid = self._read_pid(component)
            if pid is None and component in OPTIONAL_COMPONENTS:
                continue
            result.append(ComponentStatus(component, pid, pid is not None and _pid_alive(pid)))
        return result

    def _read_pid(self, component: str) -> int | None:
        path = self._pid_path(component)
        try:
            return int(path.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def real_node_status(self) -> list[ComponentStatus]:
        """PID and liveness of each real node's containerd, kubelet and kube-proxy."""
        result = []
        for node in self.real_nodes.nodes():
            for part in ("containerd", "kubelet", "kube-proxy"):
                component = f"{node.name}.{part}"
                pid = self._read_pid(component)
                result.append(ComponentStatus(component, pid, pid is not None and _pid_alive(pid)))
        return result

    def pod_reachable_host_ip(self) -> str:
        """A host address that pods on every real node reach (servers for pods bind it)."""
        return self.real_nodes.pod_reachable_host_ip()

    def is_up(self) -> bool:
        """Every component alive and the apiserver ready."""
        if not all(s.alive for s in self.status()):
            return False
        try:
            return self._apiserver_ready()
        except (OSError, KeyError, ValueError):
            return False

    # ----- up ----------------------------------------------------------------------------

    def up(
        self,
        nodes: int = 3,
        gpus_per_node: int = 8,
        timeout: float = 120.0,
        process_nodes: int = 0,
        real_nodes: int = 0,
    ) -> float:
        """Bring the cluster up (idempotent); return seconds to ready.

        `nodes` kwok GPU nodes (`gpu-node-<i>`), `process_nodes` process-backed GPU nodes
        (`proc-node-<i>`, whose pods run as local processes) and `real_nodes` real nodes
        (`real-node-<i>`: kubelet, containerd, runc, kube-proxy; see `realnode`).
        """
        started = time.monotonic()
        deadline = started + timeout
        bin_dir = self.bin_dir
        if not self.is_up():
            self.down()
            if real_nodes > 0:
                self.root.mkdir(parents=True, exist_ok=True)
                self._real_mode_marker.touch()
            self._start_all(bin_dir, deadline)
        elif real_nodes > 0 and not self._real_mode_marker.exists():
            self._real_mode_marker.touch()
            self._restart_apiserver(bin_dir, deadline)
        manifests = [
            node_manifests.gpu_node(node_manifests.node_name(i), gpus=gpus_per_node)
            for i in range(nodes)
        ]
        proc_names = [node_manifests.process_node_name(i) for i in range(process_nodes)]
        manifests += [
            node_manifests.gpu_node(name, gpus=gpus_per_node, process_backed=True)
            for name in proc_names
        ]
        self._ensure_procnode(proc_names, deadline)
        self._ensure_nodes(manifests, deadline)
        try:
            self.real_nodes.ensure(real_nodes, gpus_per_node, deadline)
        except RealNodeError as err:
            raise ClusterError(str(err)) from err
        return time.monotonic() - started

    @property
    def _real_mode_marker(self) -> Path:
        # Present when the apiserver runs with what real nodes need (see _apiserver_args).
        return self.root / "apiserver-for-real-nodes"

    def _restart_apiserver(self, bin_dir: Path, deadline: float) -> None:
        pid = self._read_pid("kube-apiserver")
        if pid is not None:
            _terminate(pid)
        ports = self.ports()
        self._spawn(
            "kube-apiserver", [str(bin_dir / "kube-apiserver"), *self._apiserver_args(ports)]
        )
        self._wait("kube-apiserver", deadline, self._apiserver_ready)

    def _ensure_procnode(self, names: list[str], deadline: float) -> None:
        record = self.root / "procnode-nodes"
        served = record.read_text().split(",") if record.exists() else []
        pid = self._read_pid("procnode")
        running = pid is not None and _pid_alive(pid)
        if running and set(names) <= set(served):
            return
        if running and pid is not None:
            _terminate(pid)
        if not names:
            return
        record.write_text(",".join(names))
        argv = [
            sys.executable, "-m", "trainguard_dev.cluster.procnode",
            f"--cluster-root={self.root}", f"--server={self.server}", f"--nodes={','.join(names)}",
        ]  # fmt: skip
        self._spawn("procnode", argv)
        self._wait("procnode", deadline, lambda: True)

    def _start_all(self, bin_dir: Path, deadline: float) -> None:
        for d in (self.root, self.log_dir, self.pid_dir):
            d.mkdir(parents=True, exist_ok=True)
        ports = dict(zip(PORT_NAMES, _free_ports(len(PORT_NAMES)), strict=True))
        (self.root / "ports.json").write_text(json.dumps(ports, indent=2))
        if not self.pki.exists():
            self.pki.generate()
        self._write_kubeconfig(ports["apiserver"])
        etcd_data = self._etcd_data()
        shutil.rmtree(etcd_data, ignore_errors=True)

        self._spawn("etcd", [str(bin_dir / "etcd"), *self._etcd_args(ports, etcd_data)])
        self._wait("etcd", deadline, lambda: self._etcd_ready(ports["etcd-client"]))
        self._spawn(
            "kube-apiserver", [str(bin_dir / "kube-apiserver"), *self._apiserver_args(ports)]
        )
        self._wait("kube-apiserver", deadline, self._apiserver_ready)
        self._spawn(
            "kube-controller-manager",
            [str(bin_dir / "kube-controller-manager"), *self._controller_manager_args(ports)],
        )
        self._spawn(
            "kube-scheduler", [str(bin_dir / "kube-scheduler"), *self._scheduler_args(ports)]
        )
        stage_dir = _stage_dir(self.home)
        assert stage_dir is not None  # ensure_binaries() checked it
        self._spawn("kwok", [str(bin_dir / "kwok"), *self._kwok_args(ports, stage_dir)])
        self._wait(
            "kube-controller-manager",
            deadline,
            lambda: _https_ok(ports["controller-manager"], "/healthz"),
        )
        self._wait("kube-scheduler", deadline, lambda: _https_ok(ports["scheduler"], "/healthz"))
        self._wait("kwok", deadline, lambda: _http_ok(ports["kwok"], "/healthz"))
        # The controller-manager creates each namespace's default ServiceAccount; pods
        # can't be created before it exists.
        self._wait("kube-controller-manager", deadline, self._default_service_account_ready)

    def _etcd_args(self, ports: dict[str, int], data: Path) -> list[str]:
        client = f"http://127.0.0.1:{ports['etcd-client']}"
        peer = f"http://127.0.0.1:{ports['etcd-peer']}"
        return [
            f"--name={self.name}",
            f"--data-dir={data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.name}={peer}",
            # Disposable test data: durability buys nothing here and costs seconds.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _apiserver_args(self, ports: dict[str, int]) -> list[str]:
        pki = self.pki
        return [
            f"--etcd-servers=http://127.0.0.1:{ports['etcd-client']}",
            f"--bind-address={'0.0.0.0' if self._real_mode_marker.exists() else '127.0.0.1'}",
            # Needed where the machine has no default route to derive an address from.
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports['apiserver']}",
            f"--tls-cert-file={pki.cert}",
            f"--tls-private-key-file={pki.key}",
            f"--client-ca-file={pki.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            f"--cert-dir={self.root / 'apiserver-certs'}",
            "--profiling=false",
            *self._real_node_apiserver_args(),
        ]

    def _real_node_apiserver_args(self) -> list[str]:
        """What real nodes need of the apiserver (only once a cluster has real nodes).

        Pods reach it through the `kubernetes` Service at a bridge gateway address, so it
        listens on every address of this machine, not only loopback (clients still
        need a certificate from the cluster CA or a token). It calls kubelets (logs, exec)
        at their InternalIP, with the admin certificate, and verifies their serving
        certificates, which the cluster CA signs.
        """
        if not self._real_mode_marker.exists():
            return []
        pki = self.pki
        return [
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki.cert}",
            f"--kubelet-client-key={pki.key}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
        ]

    def _component_kubeconfig_args(self) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
        ]

    def _controller_manager_args(self, ports: dict[str, int]) -> list[str]:
        pki = self.pki
        return [
            *self._component_kubeconfig_args(),
            f"--secure-port={ports['controller-manager']}",
            f"--cert-dir={self.root / 'controller-manager-certs'}",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
            "--controllers=*",
            f"--node-monitor-grace-period={self.node_grace}",
            f"--node-monitor-period={NODE_MONITOR_PERIOD}",
        ]

    def _scheduler_args(self, ports: dict[str, int]) -> list[str]:
        return [
            *self._component_kubeconfig_args(),
            f"--secure-port={ports['scheduler']}",
            f"--cert-dir={self.root / 'scheduler-certs'}",
        ]

    def _kwok_args(self, ports: dict[str, int], stage_dir: Path) -> list[str]:
        args = [
            f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_SELECTOR}",
            f"--node-lease-duration-seconds={self.node_lease}",
            f"--server-address=127.0.0.1:{ports['kwok']}",
            "--node-ip=127.0.0.1",
        ]
        args += [f"--config={stage_dir / f}" for f in KWOK_STAGE_FILES]
        if self.kwok_parallelism:
            config = self.root / "kwok-configuration.yaml"
            parallel = self.kwok_parallelism
            config.write_text(
                "apiVersion: config.kwok.x-k8s.io/v1alpha1\n"
                "kind: KwokConfiguration\n"
                "options:\n"
                f"  podPlayStageParallelism: {parallel}\n"
                f"  nodePlayStageParallelism: {parallel}\n"
                # A configuration file leaves what it does not say at zero, not at kwok's
                # defaults, and kwok refuses a zero here.
                "  nodeLeaseParallelism: 4\n"
                "  podsOnNodeSyncParallelism: 1\n"
                # An empty pod range makes kwok give every pod its node's address, 127.0.0.1,
                # which the EndpointSlice and Endpoints controllers refuse for a Service ("may
                # not be in the loopback range") and retry: a gang's Service never listed its
                # members, and the retries loaded the control plane being measured.
                f"  cidr: {KWOK_POD_CIDR}\n"
            )
            args.append(f"--config={config}")
        return args

    def _write_kubeconfig(self, port: int) -> None:
        pki = self.pki
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": self.name,
                    "cluster": {
                        "server": f"https://127.0.0.1:{port}",
                        "certificate-authority": str(pki.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {"client-certificate": str(pki.cert), "client-key": str(pki.key)},
                }
            ],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": "admin"}}],
            "current-context": self.name,
        }
        # JSON is valid YAML, and every Kubernetes client reads it.
        self.kubeconfig.write_text(json.dumps(config, indent=2))

    def _spawn(self, component: str, argv: Sequence[str]) -> None:
        log = self.log_path(component).open("ab")
        log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        # A new session detaches the component from this command: `up` returns and the
        # cluster keeps running until `down`.
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.root,
        )
        log.close()
        self._pid_path(component).write_text(f"{proc.pid}\n")

    def _wait(self, component: str, deadline: float, ready: Callable[[], bool]) -> None:
        while True:
            pid = self._read_pid(component)
            if pid is None or not _pid_alive(pid):
                raise ClusterError(
                    f"{component} exited during start-up; last lines of "
                    f"{self.log_path(component)}:\n{self.log_tail(component)}"
                )
            try:
                if ready():
                    return
            except (OSError, ValueError, ssl.SSLError):
                pass
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{component} not ready in time; last lines of "
                    f"{self.log_path(component)}:\n{self.log_tail(component)}"
                )
            time.sleep(0.2)

    # ----- readiness probes --------------------------------------------------------------

    def _etcd_ready(self, port: int) -> bool:
        return _http_ok(port, "/health")

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.cert), str(self.pki.key))
        return context

    def _apiserver_ready(self) -> bool:
        url = f"{self.server}/readyz"
        try:
            with urllib.request.urlopen(url, context=self._ssl_context(), timeout=2) as resp:
                return bool(resp.status == 200)
        except urllib.error.URLError:
            return False

    def _default_service_account_ready(self) -> bool:
        return self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0

    # ----- nodes -------------------------------------------------------------------------

    def _ensure_nodes(self, manifests: list[dict[str, Any]], deadline: float) -> None:
        existing = self._node_names()
        missing = [m for m in manifests if m["metadata"]["name"] not in existing]
        if missing:
            docs = {"apiVersion": "v1", "kind": "List", "items": missing}
            self.kubectl("create", "-f", "-", input=json.dumps(docs))
        kwok_nodes = {m["metadata"]["name"] for m in manifests if m["metadata"]["annotations"]}
        proc_nodes = {m["metadata"]["name"] for m in manifests} - kwok_nodes
        self._wait("kwok", deadline, lambda: kwok_nodes <= self._ready_nodes())
        if proc_nodes:
            self._wait("procnode", deadline, lambda: proc_nodes <= self._ready_nodes())

    def _nodes_json(self) -> list[dict[str, Any]]:
        result = self.kubectl("get", "nodes", "-o", "json", check=False)
        if result.returncode != 0:
            return []
        items: list[dict[str, Any]] = json.loads(result.stdout).get("items", [])
        return items

    def _node_names(self) -> set[str]:
        return {n["metadata"]["name"] for n in self._nodes_json()}

    def _ready_nodes(self) -> set[str]:
        ready = set()
        for node in self._nodes_json():
            for cond in node.get("status", {}).get("conditions", []):
                if cond.get("type") == "Ready" and cond.get("status") == "True":
                    ready.add(node["metadata"]["name"])
        return ready

    # ----- down --------------------------------------------------------------------------

    def down(self, purge: bool = False) -> list[str]:
        """Stop every component by its recorded PID (newest first); return those stopped."""
        stopped = [s.name for s in self.real_node_status() if s.alive]
        self.real_nodes.down()
        self._real_mode_marker.unlink(missing_ok=True)
        for component in reversed(COMPONENTS):
            pid = self._read_pid(component)
            if pid is not None and _pid_alive(pid):
                _terminate(pid)
                stopped.append(component)
            self._pid_path(component).unlink(missing_ok=True)
        shutil.rmtree(self._etcd_data(), ignore_errors=True)
        if purge:
            shutil.rmtree(self.root, ignore_errors=True)
        return stopped


def _terminate(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _http_ok(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


def _https_ok(port: int, path: str) -> bool:
    # The controller-manager and scheduler serve self-signed certificates; only their
    # health matters here, and /healthz is readable without credentials.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}{path}", context=context, timeout=2
        ) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False
