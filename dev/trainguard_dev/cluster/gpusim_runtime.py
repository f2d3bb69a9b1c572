"""A GPU simulator at the container-runtime level of the local cluster's real nodes (test only).

Modelled on nvidia-container-runtime: a wrapper around runc that edits the OCI spec of a
container before runc creates it. A real node's containerd runs it (through a small shell shim,
its runc ``BinaryName``) for every runc call; every call but ``create`` goes straight to runc.

On ``create`` it reads the bundle's ``config.json``, finds the pod and container from the CRI
annotations, and asks the apiserver (with the node's own credentials) for the pod. When that
container requests or is limited to ``nvidia.com/gpu`` > 0, the spec gains:
- a bind mount of the node's simulator state directory (on the host, under the cluster root,
  so that it outlives pods) at `CONTAINER_DIR`;
- ``TRAINGUARD_GPU_SIMULATION`` naming the state file in it (the JSON that the agent's
  simulated GPU probe reads: tests write ``ghost_mib`` there to leave ghost memory on the node,
  one figure or per GPU index);
- ``NVIDIA_VISIBLE_DEVICES`` listing the simulated GPUs' UUIDs, one per GPU requested: the
  probe simulates that many GPUs.

Every container of a pod (GPU or not) also gains the node's environment, when the node has one
(`ENV_FILENAME` beside the node's files, a JSON object of names and values, written by tests
and removed after): what a cloud gives every pod on its nodes (instance credentials and their
endpoints, as a pod-identity agent or webhook does), as a process-backed node's file of the same
name gives its processes.

Never part of the product or the chart: it exists so that GPU scenarios run on real kubelets.
Usage (by the shim): ``python -m trainguard_dev.cluster.gpusim_runtime CONFIG RUNC-ARGS...``.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from trainguard.contract.env import GPU_SIMULATION
from trainguard.gpu import VISIBLE_DEVICES_ENV, simulated_uuids

GPU_RESOURCE = "nvidia.com/gpu"
STATE_FILENAME = "gpu-sim.json"
ENV_FILENAME = "env.json"
CONTAINER_DIR = "/run/trainguard-gpusim"
ANNOTATION_TYPE = "io.kubernetes.cri.container-type"
ANNOTATION_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
ANNOTATION_POD = "io.kubernetes.cri.sandbox-name"
ANNOTATION_CONTAINER = "io.kubernetes.cri.container-name"
# runc's global options that take a value (``--root DIR``); the rest are flags.
RUNC_VALUE_OPTIONS = {"--root", "--log", "--log-format", "--criu", "--rootless"}
API_TIMEOUT_SECONDS = 5.0


def subcommand(args: list[str]) -> tuple[str, int]:
    """The runc subcommand and its index in `args` ("" and -1 when there is none)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            return arg, i
        i += 2 if arg in RUNC_VALUE_OPTIONS else 1
    return "", -1


def bundle_dir(args: list[str], start: int) -> Path:
    """The ``--bundle``/``-b`` of a create call; runc's default is the working directory."""
    for i in range(start, len(args)):
        arg = args[i]
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--bundle="):
            return Path(arg.split("=", 1)[1])
    return Path.cwd()


def gpus_requested(pod: dict[str, Any], container: str) -> int:
    """The GPUs a container of `pod` asks for (the larger of its request and limit)."""
    spec = pod.get("spec", {})
    for entry in (*spec.get("initContainers", []), *spec.get("containers", [])):
        if entry.get("name") == container:
            return container_gpus(entry)
    return 0


def container_gpus(container: dict[str, Any]) -> int:
    """The GPUs a container spec asks for (the larger of its request and limit)."""
    resources = container.get("resources", {})
    values = [resources.get(k, {}).get(GPU_RESOURCE, "0") for k in ("requests", "limits")]
    return max(int(str(v)) for v in values)


def visible_devices(gpus: int) -> str:
    """``NVIDIA_VISIBLE_DEVICES`` for a container with `gpus` simulated GPUs (the probe's UUIDs)."""
    return ",".join(simulated_uuids(gpus))


def inject(spec: dict[str, Any], state_dir: Path, gpus: int) -> None:
    """Give the container the simulator: the env pointing at the state file and its mount."""
    process = spec.setdefault("process", {})
    env = [e for e in process.get("env", []) if not e.startswith((GPU_SIMULATION + "=",))]
    env += [
        f"{GPU_SIMULATION}={CONTAINER_DIR}/{STATE_FILENAME}",
        f"{VISIBLE_DEVICES_ENV}={visible_devices(gpus)}",
    ]
    process["env"] = env
    spec.setdefault("mounts", []).append(
        {
            "destination": CONTAINER_DIR,
            "type": "bind",
            "source": str(state_dir),
            "options": ["rbind", "rw"],
        }
    )


def node_env(path: Path) -> list[str]:
    """The node's environment (``NAME=value`` entries) from its JSON file; none without one."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise ValueError(f"{path}: not an object of strings")
    return [f"{name}={value}" for name, value in data.items()]


def add_env(spec: dict[str, Any], entries: list[str]) -> None:
    """Set `entries` (``NAME=value``) in the container's environment, over what it had."""
    names = {entry.split("=", 1)[0] for entry in entries}
    process = spec.setdefault("process", {})
    kept = [e for e in process.get("env", []) if e.split("=", 1)[0] not in names]
    process["env"] = kept + entries


def fetch_pod(config: dict[str, str], namespace: str, name: str) -> dict[str, Any]:
    """GET the pod from the apiserver with the node's credentials."""
    context = ssl.create_default_context(cafile=config["ca"])
    context.load_cert_chain(config["cert"], config["key"])
    path = f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods/{urllib.parse.quote(name)}"
    with urllib.request.urlopen(
        config["server"] + path, context=context, timeout=API_TIMEOUT_SECONDS
    ) as resp:
        pod: dict[str, Any] = json.loads(resp.read())
    return pod


def prepare(config: dict[str, str], bundle: Path) -> None:
    """Edit the bundle's spec when it is a container of a pod: the node's env, the GPUs."""
    spec_path = bundle / "config.json"
    spec: dict[str, Any] = json.loads(spec_path.read_text())
    annotations = spec.get("annotations", {})
    if annotations.get(ANNOTATION_TYPE) != "container":
        return  # a pod sandbox (pause) or not a CRI container at all
    # A node started before nodes had an environment has no such entry.
    environment = node_env(Path(config["env_file"])) if "env_file" in config else []
    add_env(spec, environment)
    pod = fetch_pod(config, annotations[ANNOTATION_NAMESPACE], annotations[ANNOTATION_POD])
    gpus = gpus_requested(pod, annotations[ANNOTATION_CONTAINER])
    if gpus > 0:
        inject(spec, Path(config["state_dir"]), gpus)
    elif not environment:
        return
    tmp = spec_path.with_name(".config.json.gpusim")
    tmp.write_text(json.dumps(spec))
    tmp.replace(spec_path)


def main(argv: list[str]) -> None:
    """Edit the spec on ``create``, then exec the real runc with the same arguments."""
    config: dict[str, str] = json.loads(Path(argv[0]).read_text())
    args = argv[1:]
    command, index = subcommand(args)
    if command == "create":
        try:
            prepare(config, bundle_dir(args, index + 1))
        except Exception as err:  # a GPU container without its simulator must not start
            print(f"gpusim runtime: {err}", file=sys.stderr)
            sys.exit(1)
    os.execv(config["runc"], [config["runc"], *args])


if __name__ == "__main__":
    main(sys.argv[1:])
