"""Process-backed nodes: a kubelet stand-in that runs pods' containers as local processes.

kwok simulates a kubelet by writing pod status; nothing runs. On a *process-backed* node
(label ``trainguard.dev/process-backed=true``) this runtime runs the containers for real as
processes on this machine, so the operator, agent, supervisor and trainer run end to end
without a container engine. It is test and demo infrastructure, never a production part.

What it does, per node it serves:
- heartbeats: the node's Ready condition and its Lease in ``kube-node-lease``;
- pods bound to the node: init containers in order (a native sidecar, an init container with
  ``restartPolicy: Always``, is started and kept running), then the containers; restarts per
  the pod's restart policy with a short back-off; pod status with container states, exit
  codes and restart counts; a deleted pod's processes get SIGTERM, then SIGKILL after the
  grace period (at most `MAX_GRACE_SECONDS`), and the pod object is then removed.
- a pod's processes are all of its processes, as a container's cgroup holds them: every
  container runs with the pod's UID in ``TRAINGUARD_PROCNODE_POD`` (`POD_MARKER_ENV`), which
  its descendants inherit, so the final SIGKILL (at once when the node goes down, after the
  grace period when the pod is deleted) reaches processes that left the container's process
  group too (the supervisor starts the trainer and its warm standby in sessions of their own),
  as a kubelet's kill of the pod's cgroups does.

How a container is mapped onto a process (the images are not used):
- the command runs with this Python environment's ``bin`` first on PATH (the trainguard
  image's programs are installed there) and with this runtime's PYTHONPATH, so the pods run
  the code the cluster was started with (a checkout named on PYTHONPATH, as the tests' own
  processes and the operator they start), not whatever checkout the environment installed;
- every volume is a directory: ``emptyDir`` under the pod's directory, a PVC bound to a
  ``local`` PV under the node's directory (it survives the pod, as on a real node), any other
  PV under a directory shared by all nodes (as network storage is: `network_volume_dir`;
  `shared_claim` makes such a claim, kept in `claim_dir`); secrets and config maps are
  written out as files;
- a mount path at the start of an env value, an argument or the working dir is rewritten to
  the volume's directory (processes share this machine's file system, not a mount namespace);
- the service-account credentials become a kubeconfig (``KUBECONFIG``) holding a token from
  the TokenRequest API for the pod's service account, so RBAC applies as in a cluster: in
  every container when the pod automounts its token, else only in the containers that mount
  a ``projected`` volume with a ``serviceAccountToken`` source (as a kubelet mounts the token
  into those containers alone). Processes of one user on one file system are not isolated
  from each other: where a pod's containers must not reach each other's credentials, only a
  real node shows it (tests/realnodes);
- termination messages: each container gets a file of its own, named to the process by
  ``TRAINGUARD_TERMINATION_LOG`` (there is no per-container ``/dev/termination-log`` or
  ``terminationMessagePath`` without a mount namespace); what the process leaves in it (at
  most 4 KiB, as a kubelet keeps) becomes ``state.terminated.message`` in the container's
  status. With ``terminationMessagePolicy: FallbackToLogsOnError`` a failed container with an
  empty file gets the tail of its log instead, as with a kubelet.

Controls for failure scenarios, as files in ``<cluster>/procnodes/<node>/``:
- ``down``: the node vanishes: its pods' processes, every one of them, are killed at once and
  heartbeats stop (the controller-manager then marks it NotReady);
- ``gpu-sim.json``: the state a simulated GPU probe reads on that node (see the agent); its
  path is given to every process as ``TRAINGUARD_GPU_SIMULATION``, and a container that
  requests GPUs gets ``NVIDIA_VISIBLE_DEVICES`` naming one simulated GPU per GPU requested (as
  a device plugin names its GPUs), so the probe simulates the pod's GPUs;
- ``env.json``: a JSON object of strings, merged into the environment of every container
  started on that node from then on, over the pod's own values (a node-level fault, e.g.
  ``{"TRAINGUARD_PREFLIGHT_INJECT": "corrupt-readback"}`` for a disk that corrupts data at
  rest, or ``{"TRAINGUARD_STAGING_INJECT": "slow-files:0.5"}`` for a slow source). A file
  that is not such an object is reported in the container's log and the container fails to
  start (reason ``StartError``), as a broken node would fail it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainguard.contract.env import GPU_SIMULATION, TERMINATION_LOG
from trainguard.gpu import VISIBLE_DEVICES_ENV
from trainguard_dev.cluster.gpusim_runtime import (
    ENV_FILENAME as ENV_FILENAME,  # a real node's environment file: the same name
)
from trainguard_dev.cluster.gpusim_runtime import container_gpus, visible_devices
from trainguard_dev.cluster.pki import Pki
from trainguard_dev.cluster.rest import ApiError, Rest

PROCESS_NODE_LABEL = "trainguard.dev/process-backed"
GPU_SIMULATION_ENV = GPU_SIMULATION
GPU_SIM_FILENAME = "gpu-sim.json"
DOWN_FILENAME = "down"
PYTHONPATH_ENV = "PYTHONPATH"
# In every container's environment: its pod's UID, inherited by whatever the container starts,
# which is how the pod's processes are found (there is no cgroup per pod here).
POD_MARKER_ENV = "TRAINGUARD_PROCNODE_POD"
PROC = Path("/proc")
# How long the processes of a killed pod may take to be gone (SIGKILL cannot be ignored).
GONE_WAIT_SECONDS = 5.0
TERMINATION_LOG_ENV = TERMINATION_LOG
TERMINATION_MESSAGE_LIMIT = 4096  # bytes a kubelet keeps of a termination message
FALLBACK_LOG_LINES = 80  # FallbackToLogsOnError: the log's last lines, as a kubelet takes
HEARTBEAT_SECONDS = 5.0
LEASE_SECONDS = 20
POLL_SECONDS = 0.3
MAX_GRACE_SECONDS = 5.0
DEFAULT_KEY_MODE = 0o644
MAX_BACKOFF_SECONDS = 8.0
NETWORK_VOLUMES_DIRNAME = "network-volumes"
SHARED_CLAIM_SIZE = "1Gi"
SA_TOKEN_SECONDS = 3600
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def network_volume_dir(cluster_root: Path, volume: str) -> Path:
    """The directory every process node serves the PV `volume` from (any PV but a local one)."""
    return cluster_root / NETWORK_VOLUMES_DIRNAME / volume


def claim_dir(cluster_root: Path, namespace: str, claim: str) -> Path:
    """The directory of the claim `namespace/claim` if `shared_claim` made it (or it is unbound)."""
    return network_volume_dir(cluster_root, f"{namespace}-{claim}")


def shared_claim(
    cluster_root: Path, namespace: str, claim: str, size: str = SHARED_CLAIM_SIZE
) -> list[dict[str, Any]]:
    """A PVC `claim` and the PV it is bound to, kept in `claim_dir` by every process node.

    Storage that outlives a node, as a network volume does. The PV comes with the claim
    because the scheduler places no pod whose claim is unbound (this cluster has no
    provisioner); it is a ``hostPath`` naming that directory, the volume's home on this
    machine.
    """
    capacity = {"storage": size}
    directory = claim_dir(cluster_root, namespace, claim)
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": directory.name},
        "spec": {
            "capacity": capacity,
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "claimRef": {"namespace": namespace, "name": claim},
            "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": directory.name,
            "resources": {"requests": capacity},
        },
    }
    return [volume, pvc]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Container:
    """One container of a pod and the process running it."""

    spec: dict[str, Any]
    init: bool
    sidecar: bool
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exit_code: int | None = None
    reason: str = ""
    started_at: str = ""
    finished_at: str = ""
    not_before: float = 0.0
    message: str = ""

    @property
    def name(self) -> str:
        """The container's name."""
        return str(self.spec["name"])

    def running(self) -> bool:
        """True while the process lives."""
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict[str, Any]:
        """Return the entry of this container in the pod's container statuses."""
        state: dict[str, Any]
        if self.running():
            state = {"running": {"startedAt": self.started_at}}
        elif self.exit_code is not None:
            state = {
                "terminated": {
                    "exitCode": self.exit_code,
                    "reason": self.reason,
                    "startedAt": self.started_at,
                    "finishedAt": self.finished_at,
                }
            }
            if self.message:
                state["terminated"]["message"] = self.message
        else:
            state = {"waiting": {"reason": "PodInitializing" if self.init else "ContainerCreating"}}
        return {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.running(),
            "started": self.running(),
            "restartCount": self.restarts,
            "state": state,
        }


def _projects_token(obj: dict[str, Any], volume: str) -> bool:
    """Whether the pod's volume is a projected one with a service-account token source."""
    for item in obj["spec"].get("volumes", []):
        if item["name"] == volume and "projected" in item:
            sources = item["projected"].get("sources") or []
            return any("serviceAccountToken" in source for source in sources)
    return False


@dataclass
class Pod:
    """A pod this runtime runs, with its directory and containers."""

    obj: dict[str, Any]
    directory: Path
    mounts: dict[str, Path]
    env: dict[str, str]
    containers: list[Container]
    # Per volume holding a projected service-account token: the kubeconfig made from it.
    kubeconfigs: dict[str, Path] = field(default_factory=dict)
    started_at: str = field(default_factory=_now)
    phase: str = "Pending"
    last_status: dict[str, Any] | None = None

    @property
    def path(self) -> str:
        """The pod's API path."""
        meta = self.obj["metadata"]
        return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"

    @property
    def restart_policy(self) -> str:
        """The pod's restart policy."""
        return str(self.obj["spec"].get("restartPolicy", "Always"))


class NodeRuntime:
    """Runs the pods of a set of process-backed nodes and heartbeats for them."""

    def __init__(self, rest: Rest, cluster_root: Path, nodes: list[str]) -> None:
        self.rest = rest
        self.root = cluster_root / "procnodes"
        self.nodes = nodes
        self.pods: dict[str, Pod] = {}  # by pod uid
        self.pod_node: dict[str, str] = {}
        self._next_heartbeat = 0.0
        self._bin = str(Path(sys.executable).parent)
        for node in nodes:
            self.node_dir(node).mkdir(parents=True, exist_ok=True)

    def node_dir(self, node: str) -> Path:
        """The directory holding a node's pods, local volumes and control files."""
        return self.root / node

    def node_env(self, node: str) -> dict[str, str]:
        """The node's env override (``env.json``); ValueError, saying why, when it is invalid."""
        path = self.node_dir(node) / ENV_FILENAME
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: {err}") from err
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise ValueError(f"{path}: must be a JSON object of strings")
        return data

    def is_down(self, node: str) -> bool:
        """True while the node's `down` control file exists."""
        return (self.node_dir(node) / DOWN_FILENAME).exists()

    # ----- main loop ---------------------------------------------------------------------

    def run_forever(self) -> None:
        """Serve until SIGTERM, then stop every process."""
        stopping = False

        def stop(_signum: int, _frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        while not stopping:
            try:
                self.tick()
            except (ApiError, OSError) as err:
                # The apiserver may be briefly unavailable; a kubelet keeps going.
                print(f"procnode: {err}", file=sys.stderr, flush=True)
            time.sleep(POLL_SECONDS)
        for pod in list(self.pods.values()):
            self._kill(pod, grace=1.0)

    def tick(self) -> None:
        """One pass: heartbeats when due, then every pod stepped and its status pushed."""
        if time.monotonic() >= self._next_heartbeat:
            for node in self.nodes:
                if not self.is_down(node):
                    self._heartbeat(node)
            self._next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
        for node in self.nodes:
            if self.is_down(node):
                self._drop_node(node)
                continue
            self._sync_node(node)

    # ----- nodes -------------------------------------------------------------------------

    def _heartbeat(self, node: str) -> None:
        now = _now()
        conditions = [
            ("Ready", "True", "KubeletReady", "process-backed node is ready"),
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", ""),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", ""),
            ("PIDPressure", "False", "KubeletHasSufficientPID", ""),
        ]
        status = {
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": r,
                    "message": m,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
                for t, s, r, m in conditions
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": node},
            ],
            "nodeInfo": {
                "kubeletVersion": "trainguard-procnode",
                "containerRuntimeVersion": "process://local",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "kernelVersion": os.uname().release,
                "osImage": "",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }
        self.rest.patch(f"/api/v1/nodes/{node}/status", {"status": status})
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"
        spec = {"holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS}
        try:
            self.rest.patch(lease_path, {"spec": {**spec, "renewTime": _micro_now()}})
        except ApiError as err:
            if err.status != 404:
                raise
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": node, "namespace": "kube-node-lease"},
                "spec": {**spec, "renewTime": _micro_now()},
            }
            self.rest.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease
            )

    def _drop_node(self, node: str) -> None:
        # A vanished machine: processes die at once and nobody reports anything.
        for uid in [u for u, n in self.pod_node.items() if n == node]:
            pod = self.pods.pop(uid)
            self.pod_node.pop(uid)
            self._kill(pod, grace=0.0)

    # ----- pods --------------------------------------------------------------------------

    def _sync_node(self, node: str) -> None:
        listed = self.rest.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
        seen = set()
        for obj in listed.get("items", []):
            uid = obj["metadata"]["uid"]
            seen.add(uid)
            pod = self.pods.get(uid)
            if obj["metadata"].get("deletionTimestamp"):
                self._finish_deletion(obj, pod)
                continue
            if obj["status"].get("phase") in ("Succeeded", "Failed") and pod is None:
                continue
            if pod is None:
                pod = self._admit(node, obj)
                self.pods[uid] = pod
                self.pod_node[uid] = node
            pod.obj = obj
            self._step(pod)
            self._push_status(pod)
        for uid in [u for u, n in self.pod_node.items() if n == node and u not in seen]:
            # Removed from the API without a graceful deletion (force delete).
            self.pod_node.pop(uid)
            self._kill(self.pods.pop(uid), grace=0.0)

    def _finish_deletion(self, obj: dict[str, Any], pod: Pod | None) -> None:
        uid = obj["metadata"]["uid"]
        if pod is not None:
            grace = float(obj["metadata"].get("deletionGracePeriodSeconds") or 0)
            self._kill(pod, grace=min(grace, MAX_GRACE_SECONDS))
            self.pods.pop(uid, None)
            self.pod_node.pop(uid, None)
        meta = obj["metadata"]
        self.rest.delete(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", grace_seconds=0
        )

    def _admit(self, node: str, obj: dict[str, Any]) -> Pod:
        meta = obj["metadata"]
        directory = (
            self.node_dir(node) / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        )
        directory.mkdir(parents=True, exist_ok=True)
        mounts = self._volumes(node, obj, directory)
        env = self._base_env(node, obj, directory)
        containers = [
            Container(c, init=True, sidecar=c.get("restartPolicy") == "Always")
            for c in obj["spec"].get("initContainers", [])
        ] + [Container(c, init=False, sidecar=False) for c in obj["spec"].get("containers", [])]
        kubeconfigs = {
            name: config
            for name, path in mounts.items()
            if _projects_token(obj, name)
            and (config := self._service_account_kubeconfig(obj, path)) is not None
        }
        return Pod(obj, directory, mounts, env, containers, kubeconfigs)

    def _volumes(self, node: str, obj: dict[str, Any], directory: Path) -> dict[str, Path]:
        namespace = obj["metadata"]["namespace"]
        result: dict[str, Path] = {}
        for volume in obj["spec"].get("volumes", []):
            name = volume["name"]
            path = directory / "volumes" / name
            if "persistentVolumeClaim" in volume:
                path = self._claim_dir(
                    node, namespace, volume["persistentVolumeClaim"]["claimName"]
                )
            path.mkdir(parents=True, exist_ok=True)
            if "secret" in volume:
                source = volume["secret"]
                mode = int(source.get("defaultMode", DEFAULT_KEY_MODE))
                self._write_keys(path, "secrets", namespace, source["secretName"], mode)
            elif "configMap" in volume:
                source = volume["configMap"]
                mode = int(source.get("defaultMode", DEFAULT_KEY_MODE))
                self._write_keys(path, "configmaps", namespace, source["name"], mode)
            result[name] = path
        return result

    def _claim_dir(self, node: str, namespace: str, claim: str) -> Path:
        pvc = self.rest.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        pv_name = str(pvc.get("spec", {}).get("volumeName", ""))
        if not pv_name:
            return claim_dir(self.root.parent, namespace, claim)
        pv = self.rest.get(f"/api/v1/persistentvolumes/{pv_name}")
        if "local" in pv.get("spec", {}):
            return self.node_dir(node) / "local-volumes" / pv_name
        return network_volume_dir(self.root.parent, pv_name)

    def _write_keys(self, path: Path, kind: str, namespace: str, name: str, mode: int) -> None:
        # As a kubelet does: one file per key, with the volume's defaultMode (0644 if unset).
        obj = self.rest.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        for key, value in obj.get("data", {}).items():
            content = base64.b64decode(value) if kind == "secrets" else str(value).encode()
            target = path / key
            target.write_bytes(content)
            target.chmod(mode)

    def _base_env(self, node: str, obj: dict[str, Any], directory: Path) -> dict[str, str]:
        env = {
            "PATH": f"{self._bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(directory),
            "PYTHONUNBUFFERED": "1",
            GPU_SIMULATION_ENV: str(self.node_dir(node) / GPU_SIM_FILENAME),
            POD_MARKER_ENV: str(obj["metadata"]["uid"]),
        }
        if os.environ.get(PYTHONPATH_ENV):
            env[PYTHONPATH_ENV] = os.environ[PYTHONPATH_ENV]
        if obj["spec"].get("automountServiceAccountToken", True) is not False:
            kubeconfig = self._service_account_kubeconfig(obj, directory)
            if kubeconfig is not None:
                env["KUBECONFIG"] = str(kubeconfig)
        return env

    def _service_account_kubeconfig(self, obj: dict[str, Any], directory: Path) -> Path | None:
        namespace = obj["metadata"]["namespace"]
        account = obj["spec"].get("serviceAccountName") or "default"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": SA_TOKEN_SECONDS},
        }
        try:
            answer = self.rest.request(
                "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", request
            )
        except ApiError as err:
            print(f"procnode: no token for {namespace}/{account}: {err}", file=sys.stderr)
            return None
        token = answer["status"]["token"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.rest.server,
                        "certificate-authority": str(self.root.parent / "pki" / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "local",
                    "context": {"cluster": "local", "user": account, "namespace": namespace},
                }
            ],
            "current-context": "local",
        }
        path = directory / "kubeconfig"
        path.write_text(json.dumps(config))
        return path

    def _rewrite(self, pod: Pod, container: dict[str, Any], value: str) -> str:
        mounts = sorted(
            (
                (m["mountPath"], pod.mounts[m["name"]])
                for m in container.get("volumeMounts", [])
                if m["name"] in pod.mounts
            ),
            key=lambda item: -len(item[0]),
        )
        for mount_path, host in mounts:
            prefix = mount_path.rstrip("/")
            if value == prefix or value.startswith(prefix + "/"):
                return str(host) + value[len(prefix) :]
        return value

    def _container_env(self, pod: Pod, container: dict[str, Any]) -> dict[str, str]:
        env = dict(pod.env)
        gpus = container_gpus(container)
        if gpus > 0:
            env[VISIBLE_DEVICES_ENV] = visible_devices(gpus)
        for mount in container.get("volumeMounts", []):
            if mount["name"] in pod.kubeconfigs:
                env["KUBECONFIG"] = str(pod.kubeconfigs[mount["name"]])
        # As the kubelet does: every key of `envFrom`'s ConfigMaps and Secrets, then `env`,
        # whose entries win.
        for origin in container.get("envFrom", []):
            for key, text in self._env_from(pod, origin).items():
                env[key] = self._rewrite(pod, container, text)
        for item in container.get("env", []):
            value = item.get("value")
            source = item.get("valueFrom")
            if source is not None:
                value = self._env_source(pod, source)
            if value is not None:
                env[item["name"]] = self._rewrite(pod, container, str(value))
        return env

    def _env_from(self, pod: Pod, source: dict[str, Any]) -> dict[str, str]:
        namespace = pod.obj["metadata"]["namespace"]
        for ref, kind in (("secretRef", "secrets"), ("configMapRef", "configmaps")):
            if ref in source:
                obj = self.rest.get(f"/api/v1/namespaces/{namespace}/{kind}/{source[ref]['name']}")
                prefix = source.get("prefix", "")
                return {
                    prefix + key: base64.b64decode(raw).decode() if kind == "secrets" else str(raw)
                    for key, raw in (obj.get("data") or {}).items()
                }
        return {}

    def _env_source(self, pod: Pod, source: dict[str, Any]) -> str | None:
        meta = pod.obj["metadata"]
        if "fieldRef" in source:
            field_path = source["fieldRef"]["fieldPath"]
            simple = {
                "metadata.name": meta["name"],
                "metadata.namespace": meta["namespace"],
                "metadata.uid": meta["uid"],
                "spec.nodeName": pod.obj["spec"].get("nodeName", ""),
                "spec.serviceAccountName": pod.obj["spec"].get("serviceAccountName", ""),
                "status.podIP": "127.0.0.1",
                "status.hostIP": "127.0.0.1",
            }
            if field_path in simple:
                return str(simple[field_path])
            for prefix, key in (
                ("metadata.labels", "labels"),
                ("metadata.annotations", "annotations"),
            ):
                if field_path.startswith(prefix + "['"):
                    return str(meta.get(key, {}).get(field_path[len(prefix) + 2 : -2], ""))
            return None
        for ref, kind in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
            if ref in source:
                name, key = source[ref]["name"], source[ref]["key"]
                obj = self.rest.get(f"/api/v1/namespaces/{meta['namespace']}/{kind}/{name}")
                raw = obj.get("data", {}).get(key)
                if raw is None:
                    return None
                return base64.b64decode(raw).decode() if kind == "secrets" else str(raw)
        return None

    def _start(self, pod: Pod, c: Container) -> None:
        spec = c.spec
        argv = [*spec.get("command", []), *spec.get("args", [])]
        argv = [self._rewrite(pod, spec, a) for a in argv]
        if not argv:
            c.exit_code, c.reason = 128, "NoCommand"
            c.finished_at = _now()
            return
        cwd = (
            Path(self._rewrite(pod, spec, spec.get("workingDir", "")))
            if spec.get("workingDir")
            else pod.directory
        )
        cwd.mkdir(parents=True, exist_ok=True)
        log = (pod.directory / f"{c.name}.log").open("ab")
        termination = self._termination_log(pod, c)
        termination.write_bytes(b"")  # created empty at each start, as a kubelet does
        c.message = ""
        try:
            environ = {
                **self._container_env(pod, spec),
                TERMINATION_LOG_ENV: str(termination),
                **self.node_env(str(pod.obj["spec"].get("nodeName", ""))),
            }
        except ValueError as err:
            log.write(f"procnode: {err}\n".encode())
            log.close()
            c.exit_code, c.reason, c.message = 128, "StartError", str(err)
            c.started_at = c.finished_at = _now()
            return
        try:
            c.proc = subprocess.Popen(
                argv,
                env=environ,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as err:
            log.write(f"procnode: cannot start {argv[0]}: {err}\n".encode())
            c.exit_code, c.reason = 128, "StartError"
            c.finished_at = _now()
        finally:
            log.close()
        c.started_at = _now()
        if c.proc is not None:
            c.exit_code, c.reason = None, ""

    def _termination_log(self, pod: Pod, c: Container) -> Path:
        return pod.directory / f"{c.name}.termination-log"

    def _reap(self, pod: Pod, c: Container) -> bool:
        """Record an exited process and its message; True when it exited since the last look."""
        if c.proc is None or c.proc.poll() is None:
            return False
        code = c.proc.returncode
        c.exit_code = code if code >= 0 else 128 - code  # 128+signal, as a runtime reports
        c.reason = "Completed" if code == 0 else "Error"
        c.finished_at = _now()
        c.proc = None
        c.message = self._termination_message(pod, c)
        return True

    def _termination_message(self, pod: Pod, c: Container) -> str:
        try:
            with self._termination_log(pod, c).open("rb") as handle:
                message = handle.read(TERMINATION_MESSAGE_LIMIT)
        except OSError:
            message = b""
        fallback = c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        if not message and fallback and c.exit_code != 0:
            with contextlib.suppress(OSError):
                lines = (pod.directory / f"{c.name}.log").read_bytes().splitlines()
                message = b"\n".join(lines[-FALLBACK_LOG_LINES:])[-TERMINATION_MESSAGE_LIMIT:]
        return message.decode(errors="replace")

    def _maybe_restart(self, pod: Pod, c: Container, always: bool) -> None:
        should = always or (pod.restart_policy == "OnFailure" and c.exit_code != 0)
        if pod.restart_policy == "Always" and not c.init:
            should = True
        if not should:
            return
        now = time.monotonic()
        if c.not_before == 0.0:
            c.not_before = now + min(MAX_BACKOFF_SECONDS, 2.0 ** min(c.restarts, 3))
        if now >= c.not_before:
            c.not_before = 0.0
            c.restarts += 1
            self._start(pod, c)

    def _step(self, pod: Pod) -> None:
        for c in pod.containers:
            self._reap(pod, c)
        # Init containers, in order; a sidecar counts as done once started.
        for c in (c for c in pod.containers if c.init):
            if c.sidecar:
                if c.proc is None and c.exit_code is None:
                    self._start(pod, c)
                elif c.proc is None:
                    self._maybe_restart(pod, c, always=True)
                continue
            if c.exit_code == 0 and c.proc is None:
                continue
            if c.proc is None and c.exit_code is None:
                self._start(pod, c)
                return
            if c.proc is None and c.exit_code not in (None, 0):
                if pod.restart_policy == "Never":
                    pod.phase = "Failed"
                    self._kill(pod, grace=0.0)
                else:
                    self._maybe_restart(pod, c, always=True)
            return
        mains = [c for c in pod.containers if not c.init]
        for c in mains:
            if c.proc is None and c.exit_code is None:
                self._start(pod, c)
            elif c.proc is None:
                self._maybe_restart(pod, c, always=False)
        if any(c.running() for c in mains):
            pod.phase = "Running"
        elif all(c.exit_code is not None for c in mains):
            pod.phase = "Succeeded" if all(c.exit_code == 0 for c in mains) else "Failed"
            if pod.restart_policy == "Always" or (
                pod.restart_policy == "OnFailure" and pod.phase == "Failed"
            ):
                pod.phase = "Running"  # restarting
            else:
                self._kill(pod, grace=1.0)  # sidecars end with the pod

    def _push_status(self, pod: Pod) -> None:
        inits = [c for c in pod.containers if c.init]
        mains = [c for c in pod.containers if not c.init]
        initialized = all(c.exit_code == 0 or (c.sidecar and c.running()) for c in inits)
        ready = initialized and all(c.running() for c in mains)
        now = _now()

        def cond(kind: str, ok: bool) -> dict[str, Any]:
            return {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": now}

        status = {
            "phase": pod.phase,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": pod.started_at,
            "initContainerStatuses": [c.status() for c in inits],
            "containerStatuses": [c.status() for c in mains],
        }
        # Compare without timestamps so an unchanged pod is not rewritten every pass.
        conditions = [
            ("PodScheduled", True),
            ("Initialized", initialized),
            ("ContainersReady", ready),
            ("Ready", ready),
        ]
        comparable = {**status, "conditions": conditions}
        if comparable == pod.last_status:
            return
        status["conditions"] = [cond(k, ok) for k, ok in conditions]
        self.rest.patch(pod.path + "/status", {"status": status})
        pod.last_status = comparable

    def _kill(self, pod: Pod, grace: float) -> None:
        running = [c for c in pod.containers if c.running()]
        for c in running:
            assert c.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace
        while grace > 0 and time.monotonic() < deadline and any(c.running() for c in running):
            time.sleep(0.05)
        for c in running:
            if c.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
                c.proc.wait()
                self._reap(pod, c)
        kill_marked(str(pod.obj["metadata"]["uid"]))


def _marked(pid: int, marker: bytes) -> bool:
    """Whether live process `pid` has `marker` in its environment (False: gone, or a zombie)."""
    try:
        if marker not in (PROC / str(pid) / "environ").read_bytes().split(b"\0"):
            return False
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False  # gone meanwhile, or another user's
    return stat[stat.rindex(")") + 2 :].split(" ", 1)[0] != "Z"


def pod_processes(uid: str) -> list[int]:
    """The live processes of the pod with UID `uid` on this machine (`POD_MARKER_ENV`)."""
    marker = f"{POD_MARKER_ENV}={uid}".encode()
    own = os.getpid()
    return [
        int(entry.name)
        for entry in PROC.iterdir()
        if entry.name.isdigit() and int(entry.name) != own and _marked(int(entry.name), marker)
    ]


def kill_marked(uid: str) -> list[int]:
    """SIGKILL every process of the pod `uid`, as the kill of its cgroups; return them.

    Waits (bounded) until they are gone, so a pod removed here leaves nothing running; they
    are reaped by whoever adopts them.
    """
    killed = pod_processes(uid)
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + GONE_WAIT_SECONDS
    while killed and time.monotonic() < deadline and pod_processes(uid):
        time.sleep(0.05)
    return killed


def main(argv: list[str] | None = None) -> int:
    """Run the process-backed node runtime (started by `trainguard dev cluster up`)."""
    parser = argparse.ArgumentParser(prog="python -m trainguard_dev.cluster.procnode")
    parser.add_argument("--cluster-root", required=True, type=Path)
    parser.add_argument("--server", required=True)
    parser.add_argument("--nodes", required=True, help="comma-separated node names")
    args = parser.parse_args(argv)
    rest = Rest(args.server, Pki(args.cluster_root / "pki"))
    NodeRuntime(rest, args.cluster_root, [n for n in args.nodes.split(",") if n]).run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
