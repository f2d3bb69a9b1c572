"""Real nodes of the local cluster: a kubelet, its own containerd and runc, and a kube-proxy each.

Node ``real-node-<i>`` lives in ``<cluster>/realnodes/real-node-<i>/``:
- ``containerd/``: its own root, state, sockets and config (cgroupfs, ``restrict_oom_score_adj``
  because root here lacks CAP_SYS_RESOURCE, the locally built pause image as the sandbox image,
  runc reached through the GPU simulator's shim, CNI from ``cni/net.d``);
- ``cni/net.d``: a bridge network on the node's own bridge (``tg<cluster hash>n<i>``) and pod
  subnet (``10.<octet>.<i>.0/24``, the octet chosen free on this host); the bridge's gateway
  ``10.<octet>.<i>.1`` is the node's IP (kubelet server, InternalIP) and a host address every pod
  reaches;
- ``kubelet/``: its root dir, config and kubeconfig with credentials ``system:node:<name>``
  (group ``system:nodes``, signed by the cluster CA); its serving certificate is signed by the
  same CA for the node IP, so the apiserver verifies kubelets (``--kubelet-certificate-authority``);
- ``gpusim/``: the node's GPU simulator state (``gpu-sim.json``), bind-mounted into GPU containers
  (see `trainguard_dev.cluster.gpusim_runtime`); write ``ghost_mib`` there to inject ghost memory;
- ``env.json``: the node's environment, set in every container of its pods when present (what a
  cloud gives pods: instance credentials and endpoints; see `gpusim_runtime`);
- ``kube-proxy/``: its config (iptables mode, so pods reach Services such as ``kubernetes``).

The cluster's DNS (CoreDNS, config in ``realnodes/dns/``) runs once for all real nodes on
real-node-0's gateway; every kubelet names it as the cluster DNS (see `CLUSTER_DOMAIN`).

Each node's cgroups live under its own ``cgroupRoot`` (``/trainguard-<hash>-<name>``) in every
hierarchy. The host changes that `down` reverts are recorded in ``realnodes/host.json`` before they
are made (prior ``ip_forward`` and other sysctls, directories created outside the cluster root,
iptables chains that existed), so `down` is safe after a crash and when run twice. Only one
cluster on a host runs real nodes at a time: kube-proxies own host-wide iptables chains.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard_dev.cluster import gpusim_runtime
from trainguard_dev.cluster import nodes as node_manifests

if TYPE_CHECKING:
    from trainguard_dev.cluster.cluster import Cluster

NODE_PREFIX = "real-node-"
SERVICE_CIDR = "10.96.0.0/16"  # the control plane's --service-cluster-ip-range
NODE_KIND_LABEL = "trainguard.dev/node-kind"
NODE_KIND_REAL = "real"
# The cluster's DNS: CoreDNS (hack/build-node.sh), one per cluster, on the host address every
# pod reaches (`pod_reachable_host_ip`), serving Services and the pods of headless Services
# (`<hostname>.<subdomain>.<namespace>.svc.cluster.local`) from the apiserver. Every real
# node's kubelet names it as the cluster DNS, so pods with the default `ClusterFirst` policy
# resolve the stable names a gang's members find each other by.
CLUSTER_DOMAIN = "cluster.local"
DNS_PORT = 53
DNS_COMPONENT = "realnodes.dns"
DNS_TTL_SECONDS = 5
# Where every registry points on a real node: nothing listens there (see the containerd config).
CLOSED_REGISTRY = "http://127.0.0.1:9"
NAMESPACE = "k8s.io"  # the containerd namespace of the CRI plugin
PAUSE_REF_BASE = "localhost/trainguard/pause"
BUSYBOX_REF_BASE = "localhost/trainguard/busybox"
CGROUP_FS = Path("/sys/fs/cgroup")
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
)
# Paths a kubelet, containerd or the CNI plugins create outside their configured roots.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/run/containerd",
    "/var/run/netns",
    "/run/netns",
    "/etc/cni",
    "/opt/cni",
    "/var/log/pods",
    "/var/log/containers",
)
IPTABLES = ("iptables-nft", "iptables-legacy")
IPTABLES_TABLES = ("filter", "nat", "mangle")
HOST_LOCK = Path("/run/trainguard-realnodes.owner")
SUBNET_OCTETS = range(200, 250)
BUSYBOX_APPLETS = (
    "sh", "cat", "echo", "env", "ls", "sleep", "nc", "wget", "test", "grep", "printf", "id",
    "hostname", "ps", "kill", "true", "false", "head", "tail", "mkdir", "rm", "touch", "wc",
    "nslookup",
)  # fmt: skip
PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static volatile sig_atomic_t done;
static void stop(int sig) { (void)sig; done = 1; }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction a = {0}, r = {0};
  a.sa_handler = stop; sigaction(SIGINT, &a, 0); sigaction(SIGTERM, &a, 0);
  r.sa_handler = reap; r.sa_flags = SA_NOCLDSTOP | SA_RESTART; sigaction(SIGCHLD, &r, 0);
  while (!done) pause();
  return 0;
}
"""
READY_POLL_SECONDS = 0.3
# An image import may take this long, plus its archive's size at the rate below.
IMPORT_TIMEOUT_S = 120.0
IMPORT_MIN_BYTES_PER_S = 10 * 2**20
STOP_GRACE_SECONDS = 10.0


class RealNodeError(RuntimeError):
    """A real node could not be started, or the host is not in a state to run one."""


def node_name(index: int) -> str:
    """The name of the index-th real node."""
    return f"{NODE_PREFIX}{index}"


def cache_dir() -> Path:
    """Where built images are cached: $TRAINGUARD_CACHE, else the cluster home."""
    from trainguard_dev.cluster.cluster import default_home

    return Path(os.environ.get("TRAINGUARD_CACHE") or default_home())


def _run(*argv: str | Path, check: bool = True, timeout: float = 120.0) -> str:
    result = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise RealNodeError(
            f"{' '.join(map(str, argv))} failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result.stdout


# ----- images ------------------------------------------------------------------------------


def _oci_archive(out: Path, tag: str, stage: Path, config: list[str]) -> Path:
    """Package the directory `stage` as a one-layer OCI image archive at `out` (umoci)."""
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        layout = Path(tmp) / "layout"
        _run("umoci", "init", "--layout", layout)
        _run("umoci", "new", "--image", f"{layout}:{tag}")
        _run("umoci", "insert", "--image", f"{layout}:{tag}", stage, "/")
        _run("umoci", "config", "--image", f"{layout}:{tag}", *config)
        _run("umoci", "gc", "--layout", layout)
        partial = out.with_suffix(".partial")
        _run("tar", "-C", layout, "-cf", partial, ".")
        partial.replace(out)
    return out


def pause_image() -> tuple[Path, str]:
    """The pause image (a static binary that waits for signals and reaps), built once.

    Returns the OCI archive and its reference; both are keyed by the content of the source.
    """
    digest = hashlib.sha256(PAUSE_C.encode()).hexdigest()[:12]
    images = cache_dir() / "images"
    out = images / f"pause-{digest}.tar"
    ref = f"{PAUSE_REF_BASE}:{digest}"
    if out.exists():
        return out, ref
    images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=images) as tmp:
        source, stage = Path(tmp) / "pause.c", Path(tmp) / "rootfs"
        stage.mkdir()
        source.write_text(PAUSE_C)
        _run("gcc", "-static", "-Os", "-s", "-o", stage / "pause", source)
        _oci_archive(
            out, digest, stage, ["--config.entrypoint", "/pause", "--config.user", "65535:65535"]
        )
    return out, ref


def busybox_image() -> tuple[Path, str]:
    """A tiny shell image (Debian's static busybox), built once per package version.

    For tests that need a shell, ``nc`` and ``wget`` in a pod. Returns (archive, reference).
    """
    version = _run("apt-cache", "policy", "busybox-static").split("Candidate:")[1].split()[0]
    digest = hashlib.sha256(f"{version}:{BUSYBOX_APPLETS}".encode()).hexdigest()[:12]
    images = cache_dir() / "images"
    out = images / f"busybox-{digest}.tar"
    ref = f"{BUSYBOX_REF_BASE}:{digest}"
    if out.exists():
        return out, ref
    images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=images) as tmp:
        subprocess.run(
            ["apt-get", "download", "-q", "busybox-static"], cwd=tmp, capture_output=True,
            check=True, timeout=120,
        )  # fmt: skip
        deb = next(Path(tmp).glob("busybox-static_*.deb"))
        unpacked, stage = Path(tmp) / "deb", Path(tmp) / "rootfs"
        _run("dpkg-deb", "-x", deb, unpacked)
        (stage / "bin").mkdir(parents=True)
        (stage / "tmp").mkdir(mode=0o1777)
        shutil.copy2(unpacked / "bin" / "busybox", stage / "bin" / "busybox")
        for applet in BUSYBOX_APPLETS:
            (stage / "bin" / applet).symlink_to("busybox")
        _oci_archive(out, digest, stage, ["--config.cmd", "sh", "--config.env", "PATH=/bin"])
    return out, ref


# ----- nodes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RealNode:
    """Paths, addresses and ports of one real node."""

    name: str
    index: int
    root: Path
    ip: str
    subnet: str
    bridge: str
    cgroup_root: str
    ports: dict[str, int]
    bin_dir: Path

    @property
    def socket(self) -> Path:
        """The socket of the node's containerd."""
        return self.root / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's `--root-dir`: pods' volumes are under `pods/<uid>/volumes/`."""
        return self.root / "kubelet" / "root"

    @property
    def gpusim_dir(self) -> Path:
        """The host directory that GPU containers on this node see as the simulator's state."""
        return self.root / "gpusim"

    @property
    def gpusim_state(self) -> Path:
        """The node's simulated GPU state file (JSON read by the simulated GPU probe)."""
        return self.gpusim_dir / gpusim_runtime.STATE_FILENAME

    @property
    def env_file(self) -> Path:
        """The node's environment, given to every container of its pods (tests write it)."""
        return self.root / gpusim_runtime.ENV_FILENAME

    def ctr(self, *args: str, timeout: float = 120.0) -> str:
        """Run ``ctr`` against this node's containerd in the CRI namespace."""
        return _run(
            self.bin_dir / "ctr", "--address", self.socket, "--namespace", NAMESPACE, *args,
            timeout=timeout,
        )  # fmt: skip


def import_image(node: RealNode, tar_path: Path, ref: str) -> None:
    """Import an OCI archive into the node's containerd as `ref`, unpacked, for its kubelet.

    An archive's bare tags get `ref`'s repository (left alone, ctr would name them
    ``import-<date>:<tag>``, which the CRI cannot resolve); `ref` is then tagged onto the
    first. An archive without names keeps its index as `ref`. Imported images are pinned so
    that the kubelet's image garbage collection never removes them.
    """
    name, _, tag = ref.rpartition(":")
    repository = name if name and "/" not in tag else ref
    tags = [n for n in _archive_names(tar_path) if "/" not in n and ":" not in n]
    pin = ("--label", "io.cri-containerd.pinned=pinned")
    # The trainer image is gigabytes: unpacking it on a busy machine takes minutes.
    timeout = IMPORT_TIMEOUT_S + tar_path.stat().st_size / IMPORT_MIN_BYTES_PER_S
    if not tags:
        node.ctr("images", "import", *pin, "--index-name", ref, str(tar_path), timeout=timeout)
        return
    node.ctr("images", "import", *pin, "--base-name", repository, str(tar_path), timeout=timeout)
    if f"{repository}:{tags[0]}" != ref:
        node.ctr("images", "tag", "--force", f"{repository}:{tags[0]}", ref)
        node.ctr("images", "label", ref, "io.cri-containerd.pinned=pinned")


def _archive_names(tar_path: Path) -> list[str]:
    """The ``org.opencontainers.image.ref.name`` of each manifest in an OCI archive's index."""
    with tarfile.open(tar_path) as archive:
        member = next(m for m in archive.getmembers() if m.name.lstrip("./") == "index.json")
        stream = archive.extractfile(member)
        index = json.loads(stream.read()) if stream else {}
    annotations = (m.get("annotations", {}) for m in index.get("manifests", []))
    return [
        a["org.opencontainers.image.ref.name"]
        for a in annotations
        if a.get("org.opencontainers.image.ref.name")
    ]


def import_image_everywhere(cluster: Cluster, tar_path: Path, ref: str) -> None:
    """Import one OCI archive into every real node of `cluster`."""
    for node in RealNodes(cluster).nodes():
        import_image(node, tar_path, ref)


class RealNodes:
    """The real nodes of one cluster: start, stop, and revert the host on `down`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.root = cluster.root / "realnodes"
        self.hash = hashlib.sha256(str(cluster.root).encode()).hexdigest()[:5]

    # ----- layout ----------------------------------------------------------------------

    @property
    def host_file(self) -> Path:
        """What `up` changed on the host, recorded before it changed it."""
        return self.root / "host.json"

    def _host(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.host_file.read_text())
        return data

    def nodes(self) -> list[RealNode]:
        """The real nodes started so far (by index)."""
        if not self.host_file.exists():
            return []
        return [self.node(name) for name in self._host().get("nodes", [])]

    def node(self, name: str) -> RealNode:
        """One real node by name."""
        index = int(name.removeprefix(NODE_PREFIX))
        octet = self._host()["octet"]
        root = self.root / name
        ports_file = root / "ports.json"
        ports = json.loads(ports_file.read_text()) if ports_file.exists() else {}
        return RealNode(
            name=name,
            index=index,
            root=root,
            ip=f"10.{octet}.{index}.1",
            subnet=f"10.{octet}.{index}.0/24",
            bridge=f"tg{self.hash}n{index}",
            cgroup_root=f"/trainguard-{self.hash}-{name}",
            ports=ports,
            bin_dir=self.cluster.bin_dir,
        )

    def pod_reachable_host_ip(self) -> str:
        """A host address that every pod on every real node reaches (real-node-0's gateway)."""
        return self.node(node_name(0)).ip

    def cluster_cidr(self) -> str:
        """The range holding every real node's pod subnet."""
        return f"10.{self._host()['octet']}.0.0/16"

    # ----- host record -----------------------------------------------------------------

    def _record_host(self) -> None:
        """Record the host's state before the first change (kept across later `up`s)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.host_file.exists():
            return
        record = {
            "octet": _free_octet(self.hash),
            "nodes": [],
            "sysctls": {k: _sysctl(k) for k in SYSCTLS if _sysctl(k) is not None},
            "created_paths": [p for p in HOST_PATHS if not Path(p).exists()],
            "iptables_chains": _iptables_chains(),
            "netns": _netns_names(),
        }
        tmp = self.host_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(self.host_file)

    def _claim_host(self) -> None:
        """Own the host's real nodes; revert another cluster's if none of its processes runs.

        A run killed before its `down` (a CI job cut off, a machine's session ended) leaves
        its record, bridges, mounts and iptables chains behind with nothing running: that
        cluster's `down` reverts them, so the next cluster starts on a clean host. Another
        cluster whose real nodes still run is refused: kube-proxies share iptables.
        """
        owner = HOST_LOCK.read_text().strip() if HOST_LOCK.exists() else ""
        if owner and owner != str(self.cluster.root) and (Path(owner) / "realnodes").exists():
            other = _cluster_at(Path(owner)).real_nodes
            if other.anything_running():
                raise RealNodeError(
                    f"real nodes of another cluster run on this host ({owner}); "
                    "run `trainguard dev cluster down` for it first (kube-proxies share iptables)"
                )
            print(
                f"real nodes of a stopped cluster left state on this host ({owner}): reverting it",
                file=sys.stderr,
            )
            other.down()
        HOST_LOCK.write_text(f"{self.cluster.root}\n")

    def anything_running(self) -> bool:
        """Whether any process of these real nodes (or their DNS server) is alive."""
        from trainguard_dev.cluster.cluster import _pid_alive

        if not self.host_file.exists():
            return False
        components = [DNS_COMPONENT] + [
            self._component(self.node(name), part)
            for name in self._host().get("nodes", [])
            for part in ("containerd", "kubelet", "kube-proxy")
        ]
        pids = (self.cluster._read_pid(component) for component in components)
        return any(pid is not None and _pid_alive(pid) for pid in pids)

    # ----- up --------------------------------------------------------------------------

    def ensure(self, count: int, gpus: int, deadline: float) -> list[str]:
        """Start real nodes 0..count-1 that are not running; return every node's name."""
        if count <= 0:
            return []
        if os.geteuid() != 0:
            raise RealNodeError("real nodes need root (cgroups, mounts, bridges, iptables)")
        self._claim_host()
        self._record_host()
        host = self._host()
        names = [node_name(i) for i in range(count)]
        host["nodes"] = sorted(set(host["nodes"]) | set(names), key=lambda n: int(n.split("-")[-1]))
        self.host_file.write_text(json.dumps(host, indent=2))
        pause_tar, pause_ref = pause_image()
        self._grant_node_roles()
        for name in names:
            node = self.node(name)
            if not self._running(node):
                self._start(node, pause_tar, pause_ref)
        # On real-node-0's bridge, which its start made: before any pod needs a name.
        self._ensure_dns()
        self._ensure_kubernetes_endpoints()
        self._wait_ready(names, deadline)
        for name in names:
            self._ensure_gpus(name, gpus, deadline)
        return names

    def _ensure_dns(self) -> None:
        """Start the cluster's DNS server unless it runs (see `CLUSTER_DOMAIN`)."""
        from trainguard_dev.cluster.cluster import _pid_alive

        pid = self.cluster._read_pid(DNS_COMPONENT)
        if pid is not None and _pid_alive(pid):
            return
        address = self.pod_reachable_host_ip()
        directory = self.root / "dns"
        directory.mkdir(parents=True, exist_ok=True)
        corefile = directory / "Corefile"
        # Names outside the cluster's domain get no answer from here (REFUSED): this machine
        # reaches nothing beyond itself, and a pod must fail such a lookup at once.
        corefile.write_text(
            f"""{CLUSTER_DOMAIN}:{DNS_PORT} {{
    bind {address}
    errors
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {self.cluster.kubeconfig}
        ttl {DNS_TTL_SECONDS}
    }}
}}
"""
        )
        self.cluster._spawn(
            DNS_COMPONENT, [str(self.cluster.bin_dir / "coredns"), "-conf", str(corefile)]
        )
        deadline = time.monotonic() + 30
        self.cluster._wait(DNS_COMPONENT, deadline, lambda: _answers_dns(address))

    def _stop_dns(self) -> None:
        from trainguard_dev.cluster.cluster import _terminate

        pid = self.cluster._read_pid(DNS_COMPONENT)
        if pid is not None:
            _terminate(pid)
        self.cluster._pid_path(DNS_COMPONENT).unlink(missing_ok=True)

    def _running(self, node: RealNode) -> bool:
        return all(self._alive(node, c) for c in ("containerd", "kubelet", "kube-proxy"))

    def _component(self, node: RealNode, part: str) -> str:
        return f"{node.name}.{part}"

    def _alive(self, node: RealNode, part: str) -> bool:
        from trainguard_dev.cluster.cluster import _pid_alive

        pid = self.cluster._read_pid(self._component(node, part))
        return pid is not None and _pid_alive(pid)

    def _start(self, node: RealNode, pause_tar: Path, pause_ref: str) -> None:
        from trainguard_dev.cluster.cluster import _free_ports

        self.stop_node(node.name)  # whatever half of it still runs
        for sub in ("containerd", "kubelet", "cni/net.d", "kube-proxy", "runtime", "pod-logs"):
            (node.root / sub).mkdir(parents=True, exist_ok=True)
        node.gpusim_dir.mkdir(exist_ok=True)
        if not node.gpusim_state.exists():
            node.gpusim_state.write_text(json.dumps({"ghost_mib": 0}))
        names = ("kubelet", "kubelet-healthz", "proxy-healthz", "proxy-metrics")
        ports = dict(zip(names, _free_ports(len(names)), strict=True))
        (node.root / "ports.json").write_text(json.dumps(ports))
        node = self.node(node.name)
        self._network(node)
        self._cgroups(node)
        cert, key = self.cluster.pki.issue(
            node.root / "pki" / "node",
            f"/O=system:nodes/CN=system:node:{node.name}",
            (f"IP:{node.ip}", f"DNS:{node.name}"),
        )
        kubeconfig = self._write_kubeconfig(node, cert, key)
        self._write_runtime_shim(node, cert, key)
        self._write_containerd_config(node, pause_ref)
        self.cluster._spawn(
            self._component(node, "containerd"),
            [
                str(node.bin_dir / "containerd"),
                "--config",
                str(node.root / "containerd" / "config.toml"),
            ],
        )
        deadline = time.monotonic() + 30
        self.cluster._wait(self._component(node, "containerd"), deadline, node.socket.exists)
        import_image(node, pause_tar, pause_ref)
        self._write_kubelet_config(node, cert, key)
        labels = {
            k: v
            for k, v in node_manifests.gpu_node(node.name)["metadata"]["labels"].items()
            if not k.startswith("kubernetes.io/") and k not in ("type", "nvidia.com/gpu.count")
        }
        labels[NODE_KIND_LABEL] = NODE_KIND_REAL
        self.cluster._spawn(
            self._component(node, "kubelet"),
            [
                str(node.bin_dir / "kubelet"),
                f"--config={node.root / 'kubelet' / 'config.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={node.kubelet_root}",
                f"--cert-dir={node.root / 'kubelet' / 'certs'}",
                f"--hostname-override={node.name}",
                f"--node-ip={node.ip}",
                f"--node-labels={','.join(f'{k}={v}' for k, v in sorted(labels.items()))}",
                "--v=1",
            ],
        )
        self._write_proxy_config(node, kubeconfig)
        self.cluster._spawn(
            self._component(node, "kube-proxy"),
            [
                str(node.bin_dir / "kube-proxy"),
                f"--config={node.root / 'kube-proxy' / 'config.yaml'}",
            ],
        )

    def _network(self, node: RealNode) -> None:
        """The node's bridge with its gateway address (the node IP), and its CNI config."""
        if _run("ip", "-o", "link", "show", "dev", node.bridge, check=False).strip() == "":
            _run("ip", "link", "add", "name", node.bridge, "type", "bridge")
        _run("ip", "addr", "replace", f"{node.ip}/24", "dev", node.bridge)
        _run("ip", "link", "set", node.bridge, "up")
        _sysctl_write("net/ipv4/ip_forward", "1")  # the bridge plugin would set it anyway
        net = ipaddress.ip_network(node.subnet)
        conf = {
            "cniVersion": "0.4.0",
            "name": f"trainguard-{self.hash}-{node.index}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": node.bridge,
                    "isGateway": True,
                    # Pods talk only to host addresses and each other: no masquerading rules.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{
                            "subnet": node.subnet,
                            "gateway": node.ip,
                            "rangeStart": str(net[10]),
                            "rangeEnd": str(net[250]),
                        }]],
                        # No default route: pods reach Services, other pods and this
                        # host's bridge addresses, and nothing beyond this machine.
                        "routes": [{"dst": SERVICE_CIDR}, {"dst": self.cluster_cidr()}],
                        "dataDir": str(node.root / "cni" / "ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }  # fmt: skip
        (node.root / "cni" / "net.d" / "10-bridge.conflist").write_text(json.dumps(conf, indent=2))

    def _cgroups(self, node: RealNode) -> None:
        """Create the node's cgroupRoot in every hierarchy (cpuset: cpus and mems copied)."""
        for hierarchy in _hierarchies():
            path = hierarchy / node.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (path / f).write_text((hierarchy / f).read_text())

    def _write_kubeconfig(self, node: RealNode, cert: Path, key: Path) -> Path:
        path = node.root / "kubelet" / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": self.cluster.server,
                "certificate-authority": str(self.cluster.pki.ca_cert),
            }}],
            "users": [{"name": node.name, "user": {
                "client-certificate": str(cert), "client-key": str(key),
            }}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": node.name}}],
            "current-context": "local",
        }  # fmt: skip
        path.write_text(json.dumps(config, indent=2))
        return path

    def _write_runtime_shim(self, node: RealNode, cert: Path, key: Path) -> None:
        config = {
            "runc": str(node.bin_dir / "runc"),
            "server": self.cluster.server,
            "ca": str(self.cluster.pki.ca_cert),
            "cert": str(cert),
            "key": str(key),
            "state_dir": str(node.gpusim_dir),
            "env_file": str(node.env_file),
        }
        conf_path = node.root / "runtime" / "gpusim.json"
        conf_path.write_text(json.dumps(config, indent=2))
        shim = node.root / "runtime" / "runc"
        # Only a `create` pays for Python; every other call execs runc at once.
        shim.write_text(
            "#!/bin/sh\n"
            "# runc for this node, through the GPU simulator on `create` (test only).\n"
            'for a in "$@"; do\n'
            '  if [ "$a" = create ]; then\n'
            f"    exec {sys.executable} -m trainguard_dev.cluster.gpusim_runtime {conf_path} "
            '"$@"\n'
            "  fi\n"
            "done\n"
            f'exec {node.bin_dir / "runc"} "$@"\n'
        )
        shim.chmod(0o755)

    def _write_containerd_config(self, node: RealNode, pause_ref: str) -> None:
        c = node.root / "containerd"
        cri = "io.containerd.cri.v1.runtime"
        (c / "tmp").mkdir(exist_ok=True)
        # A pull of an image that is not in the node fails at once (ErrImagePull), and no
        # name lookup or connection leaves the machine.
        default_registry = c / "certs.d" / "_default"
        default_registry.mkdir(parents=True, exist_ok=True)
        (default_registry / "hosts.toml").write_text(
            f'server = "{CLOSED_REGISTRY}"\n\n[host."{CLOSED_REGISTRY}"]\n'
            '  capabilities = ["pull", "resolve"]\n'
        )
        (c / "config.toml").write_text(f"""version = 3
root = "{c / "root"}"
state = "{c / "state"}"
temp = "{c / "tmp"}"
# NRI would listen under /var/run/nri; the opt plugin would create /opt/containerd.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"]

[grpc]
  address = "{node.socket}"

[ttrpc]
  address = "{node.socket}.ttrpc"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause_ref}"
  # Images come from local archives only: every registry is a closed loopback port.
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{c / "certs.d"}"

[plugins."{cri}"]
  enable_selinux = false
  # Root in this VM lacks CAP_SYS_RESOURCE: a negative oom_score_adj fails every sandbox.
  restrict_oom_score_adj = true
  [plugins."{cri}".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{node.root / "cni" / "net.d"}"
    max_conf_num = 1
  [plugins."{cri}".containerd]
    default_runtime_name = "runc"
    [plugins."{cri}".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."{cri}".containerd.runtimes.runc.options]
        BinaryName = "{node.root / "runtime" / "runc"}"
        Root = "{c / "state" / "runc"}"
        SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
""")

    def _write_kubelet_config(self, node: RealNode, cert: Path, key: Path) -> None:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": node.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{node.socket}",
            "podLogsDir": str(node.root / "pod-logs"),
            "address": node.ip,
            "port": node.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": node.ports["kubelet-healthz"],
            "tlsCertFile": str(cert),
            "tlsPrivateKeyFile": str(key),
            # Only holders of a certificate from the cluster CA (the apiserver) may call it.
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.cluster.pki.ca_cert)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "registerNode": True,
            "failSwapOn": False,
            "nodeLeaseDurationSeconds": 20,
            "nodeStatusUpdateFrequency": "5s",
            # Images are imported, never pulled: garbage collection must not drop them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "rotateCertificates": False,
            "serializeImagePulls": False,
            "shutdownGracePeriod": "0s",
            "clusterDNS": [self.pod_reachable_host_ip()],
            "clusterDomain": CLUSTER_DOMAIN,
        }
        (node.root / "kubelet" / "config.yaml").write_text(json.dumps(config, indent=2))

    def _write_proxy_config(self, node: RealNode, kubeconfig: Path) -> None:
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables",
            "hostnameOverride": node.name,
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": f"127.0.0.1:{node.ports['proxy-healthz']}",
            "metricsBindAddress": f"127.0.0.1:{node.ports['proxy-metrics']}",
            "clusterCIDR": self.cluster_cidr(),
            "nodePortAddresses": [f"{node.ip}/32"],
            # Leave the host's conntrack settings and route_localnet alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
        }
        (node.root / "kube-proxy" / "config.yaml").write_text(json.dumps(config, indent=2))

    def _grant_node_roles(self) -> None:
        """RBAC for node credentials: the control plane has no Node authorizer."""
        bindings = [
            ("trainguard:nodes", "system:node"),
            ("trainguard:nodes-proxier", "system:node-proxier"),
        ]
        items = [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Group",
                        "name": "system:nodes",
                    }
                ],
            }
            for name, role in bindings
        ]
        self.cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"kind": "List", "apiVersion": "v1", "items": items}),
        )

    def _ensure_kubernetes_endpoints(self) -> None:
        """Point the ``kubernetes`` Service at the apiserver's pod-reachable address.

        The apiserver runs with ``--endpoint-reconciler-type=none`` (it binds no address
        pods could reach without real nodes), so this EndpointSlice is written here.
        """
        port = self.cluster.ports()["apiserver"]
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kubernetes",
                "namespace": "default",
                "labels": {
                    "kubernetes.io/service-name": "kubernetes",
                    "endpointslice.kubernetes.io/managed-by": "realnodes.trainguard.dev",
                },
            },
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": [self.pod_reachable_host_ip()], "conditions": {"ready": True}}
            ],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        }
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(slice_))

    def _wait_ready(self, names: list[str], deadline: float) -> None:
        pending = set(names)
        while pending:
            for name in sorted(pending):
                node = self.node(name)
                for part in ("containerd", "kubelet", "kube-proxy"):
                    if not self._alive(node, part):
                        component = self._component(node, part)
                        raise RealNodeError(
                            f"{component} exited during start-up; last lines of "
                            f"{self.cluster.log_path(component)}:\n"
                            f"{self.cluster.log_tail(component)}"
                        )
            pending -= self.cluster._ready_nodes()
            if not pending:
                return
            if time.monotonic() > deadline:
                tails = "\n".join(
                    f"--- {n}.kubelet\n{self.cluster.log_tail(f'{n}.kubelet')}" for n in pending
                )
                raise RealNodeError(f"real nodes not Ready in time: {sorted(pending)}\n{tails}")
            time.sleep(READY_POLL_SECONDS)

    def _ensure_gpus(self, name: str, gpus: int, deadline: float) -> None:
        """Give the node GPU capacity in its status, as kwok does, until it sticks."""
        patch = json.dumps(
            {"status": {"capacity": {"nvidia.com/gpu": str(gpus)},
                        "allocatable": {"nvidia.com/gpu": str(gpus)}}}
        )  # fmt: skip
        while True:
            self.cluster.kubectl(
                "patch", "node", name, "--subresource=status", "--type=merge", "-p", patch
            )
            got = self.cluster.kubectl(
                "get", "node", name, "-o", "jsonpath={.status.allocatable.nvidia\\.com/gpu}"
            ).stdout.strip()
            if got == str(gpus) or time.monotonic() > deadline:
                return
            time.sleep(READY_POLL_SECONDS)

    # ----- stop and down ---------------------------------------------------------------

    def stop_node(self, name: str) -> None:
        """Stop one node's kubelet, kube-proxy, containers and containerd (a node-loss test).

        The node's files, bridge and cgroup root stay; `ensure` starts it again.
        """
        from trainguard_dev.cluster.cluster import _terminate

        self.heal(name)  # a partitioned node: its rule goes, its frozen processes can stop
        node = self.node(name)
        for part in ("kube-proxy", "kubelet"):
            pid = self.cluster._read_pid(self._component(node, part))
            if pid is not None:
                _terminate(pid)
            self.cluster._pid_path(self._component(node, part)).unlink(missing_ok=True)
        self._kill_containers(node)
        pid = self.cluster._read_pid(self._component(node, "containerd"))
        if pid is not None:
            _terminate(pid)
        self.cluster._pid_path(self._component(node, "containerd")).unlink(missing_ok=True)

    def partition(self, name: str) -> None:
        """Cut one node off the API while its containers run on (a partition test).

        Its kubelet and kube-proxy are frozen (SIGSTOP), so the node's Lease is no longer
        renewed and it goes NotReady; its pods' connections to the apiserver's port are
        refused (a rule in the host's INPUT chain, where pod traffic to the apiserver
        arrives), while every other address (an S3 server) stays reachable. `heal` undoes it.
        """
        node = self.node(name)
        for part in ("kubelet", "kube-proxy"):
            pid = self.cluster._read_pid(self._component(node, part))
            if pid is not None:
                os.kill(pid, signal.SIGSTOP)
        _run("iptables", "-w", "-I", "INPUT", "1", *self._partition_rule(node))

    def heal(self, name: str) -> None:
        """End `partition`: the rule removed, the kubelet and kube-proxy running again."""
        node = self.node(name)
        with contextlib.suppress(OSError):  # no ports recorded: the cluster never started
            delete = ["iptables", "-w", "-D", "INPUT", *self._partition_rule(node)]
            while subprocess.run(delete, capture_output=True, check=False).returncode == 0:
                pass  # until no copy of the rule is left
        for part in ("kubelet", "kube-proxy"):
            pid = self.cluster._read_pid(self._component(node, part))
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def _partition_rule(self, node: RealNode) -> list[str]:
        port = self.cluster.ports()["apiserver"]
        return [
            "-s", node.subnet, "-p", "tcp", "--dport", str(port),
            "-m", "comment", "--comment", f"trainguard partition of {node.name}",
            "-j", "REJECT", "--reject-with", "tcp-reset",
        ]  # fmt: skip

    def _kill_containers(self, node: RealNode) -> None:
        """SIGKILL every shim of this node's containerd and every process in its cgroups."""
        for _ in range(3):
            pids = _shims_of(node.socket) | _cgroup_pids(node.cgroup_root)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.3)

    def down(self) -> None:
        """Stop every real node and revert what `up` changed on the host (safe to repeat)."""
        if not self.host_file.exists():
            return
        host = self._host()
        names = host.get("nodes", [])
        for name in names:
            self.stop_node(name)
        self._stop_dns()
        for name in names:
            node = self.node(name)
            proxy = node.root / "kube-proxy" / "config.yaml"
            if proxy.exists():
                _run(node.bin_dir / "kube-proxy", f"--config={proxy}", "--cleanup", check=False)
        dirs = [self.root, *(Path(p) for p in host.get("created_paths", []))]
        _unmount_under(dirs)
        _unmount_netns(set(host.get("netns", [])))
        for name in names:
            node = self.node(name)
            for link in _links_of(node.bridge):
                _run("ip", "link", "del", link, check=False)
            _run("ip", "link", "del", node.bridge, check=False)
            _remove_cgroups(node.cgroup_root)
        _remove_new_chains(host.get("iptables_chains", {}))
        for key, value in host.get("sysctls", {}).items():
            if _sysctl(key) != value:
                _sysctl_write(key, value)
        for path in host.get("created_paths", []):
            shutil.rmtree(path, ignore_errors=True)
        _unmount_under([self.root])
        shutil.rmtree(self.root, ignore_errors=True)
        if HOST_LOCK.exists() and HOST_LOCK.read_text().strip() == str(self.cluster.root):
            HOST_LOCK.unlink()


# ----- host helpers ----------------------------------------------------------------------


def _cluster_at(root: Path) -> Cluster:
    """The cluster whose files are under `root` (`<home>/clusters/<name>`)."""
    from trainguard_dev.cluster.cluster import Cluster

    return Cluster(root.name, home=root.parent.parent)


def _answers_dns(address: str) -> bool:
    """Whether a DNS server on `address` answers a query for the cluster's apiserver Service."""
    query = _dns_query(f"kubernetes.default.svc.{CLUSTER_DOMAIN}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.5)
        try:
            sock.sendto(query, (address, DNS_PORT))
            answer, _ = sock.recvfrom(512)
        except OSError:
            return False
    # The answer's flags: a response (QR) with no error (RCODE 0) and at least one record.
    return len(answer) >= 12 and bool(answer[2] & 0x80) and answer[3] & 0x0F == 0 and answer[7] > 0


def _dns_query(name: str) -> bytes:
    """A DNS query (RFC 1035) for the A record of `name`, recursion desired."""
    header = struct.pack(">HHHHHH", 0x7467, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(part)]) + part.encode() for part in name.split("."))
    return header + labels + b"\0" + struct.pack(">HH", 1, 1)


def _sysctl(key: str) -> str | None:
    try:
        return (Path("/proc/sys") / key).read_text().strip()
    except OSError:
        return None


def _sysctl_write(key: str, value: str) -> None:
    (Path("/proc/sys") / key).write_text(f"{value}\n")


def _free_octet(seed: str) -> int:
    """A second octet o such that nothing on this host routes or holds 10.o.0.0/16."""
    used = _run("ip", "-4", "-o", "route", "show", "table", "all") + _run("ip", "-4", "-o", "addr")
    start = int(seed, 16) % len(SUBNET_OCTETS)
    for k in range(len(SUBNET_OCTETS)):
        octet = SUBNET_OCTETS[(start + k) % len(SUBNET_OCTETS)]
        if f" 10.{octet}." not in used:
            return octet
    raise RealNodeError("no free 10.x.0.0/16 range for pod subnets on this host")


def _hierarchies() -> list[Path]:
    """Every cgroup hierarchy mounted under /sys/fs/cgroup (v1 controllers and unified)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mountpoint, fstype = fields[4], line.split(" - ")[1].split()[0]
        if fstype in ("cgroup", "cgroup2") and mountpoint.startswith(f"{CGROUP_FS}/"):
            found.append(Path(mountpoint))
    return sorted(set(found))


def _cgroup_pids(cgroup_root: str) -> set[int]:
    pids: set[int] = set()
    for hierarchy in _hierarchies():
        base = hierarchy / cgroup_root.lstrip("/")
        if not base.exists():
            continue
        for procs in base.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in procs.read_text().split()}
    return pids


def _remove_cgroups(cgroup_root: str) -> None:
    for hierarchy in _hierarchies():
        base = hierarchy / cgroup_root.lstrip("/")
        if not base.exists():
            continue
        dirs = sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for d in [*dirs, base]:
            for _ in range(20):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # a just-killed process still leaving its cgroup


def _shims_of(socket: Path) -> set[int]:
    """PIDs of the containerd shims started by the containerd listening on `socket`."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"containerd-shim-runc-v2" in argv[0] and str(socket).encode() in argv:
            pids.add(int(entry.name))
    return pids


def _mounts() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount, in mount order."""
    result = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        result.append((fields[4].replace("\\040", " "), line.split(" - ")[1].split()[0]))
    return result


def _unmount_under(dirs: Iterable[Path]) -> None:
    """Unmount every mount at or below `dirs`, deepest and newest first."""
    prefixes = [str(d) for d in dirs]
    for _ in range(5):
        targets = [
            m for m, _ in _mounts()
            if any(m == p or m.startswith(p + "/") for p in prefixes)
        ]  # fmt: skip
        if not targets:
            return
        for target in reversed(targets):
            subprocess.run(["umount", target], capture_output=True, check=False)
        for target in reversed(targets):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def _netns_names() -> list[str]:
    return sorted(m for m, t in _mounts() if t == "nsfs")


def _unmount_netns(before: set[str]) -> None:
    """Unmount the network namespaces that the CNI plugins pinned since `up` (``cni-*``)."""
    for mountpoint, fstype in reversed(_mounts()):
        if fstype == "nsfs" and mountpoint not in before and "/cni-" in mountpoint:
            subprocess.run(["umount", mountpoint], capture_output=True, check=False)
            with contextlib.suppress(OSError):
                Path(mountpoint).unlink()


def _links_of(bridge: str) -> list[str]:
    out = _run("ip", "-o", "link", "show", "master", bridge, check=False)
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _iptables_chains() -> dict[str, list[str]]:
    """Per backend and table, the chains that exist (``iptables-nft:nat`` -> names)."""
    chains: dict[str, list[str]] = {}
    for tool in IPTABLES:
        if shutil.which(tool) is None:
            continue
        for table in IPTABLES_TABLES:
            out = _run(tool, "-t", table, "-S", check=False)
            chains[f"{tool}:{table}"] = sorted(
                line.split()[1] for line in out.splitlines() if line.startswith(("-N ", "-P "))
            )
    return chains


def _remove_new_chains(before: dict[str, list[str]]) -> None:
    """Remove the rules jumping to chains created since `up`, then those chains."""
    now = _iptables_chains()
    for key, names in now.items():
        tool, table = key.split(":")
        new = set(names) - set(before.get(key, []))
        if not new:
            continue
        for line in _run(tool, "-t", table, "-S", check=False).splitlines():
            parts = shlex.split(line)
            jumps_to_new = "-j" in parts and parts[parts.index("-j") + 1] in new
            if parts[:1] == ["-A"] and jumps_to_new and parts[1] not in new:
                _run(tool, "-t", table, "-D", *parts[1:], check=False)
        for chain in new:
            _run(tool, "-t", table, "-F", chain, check=False)
        for chain in new:
            _run(tool, "-t", table, "-X", chain, check=False)
