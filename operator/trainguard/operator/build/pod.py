"""The training pod of attempt k (DESIGN.md, "The flow", step 3).

Containers, in start order: the agent as a native sidecar (an init container with
`restartPolicy: Always`, so it watches the init steps too), the init steps `preflight`,
`stage-data` (when the data is staged) and `restore` (when there is a layer to restore
from), then the trainer under the supervisor. Every container gets the env contract of
`trainguard.contract.env`: the variables all of the run's pods share from the run's env
ConfigMap (`build.envconfig`, named in the pod's `env-config` annotation), the rest in its own
`env`; the trainer's hot path (data, L1) is on local volumes sized by
`trainguard.operator.build.sizing`; L0 is a memory-backed emptyDir in the trainer (and,
read-only, in the agent, which reports its newest checkpoint); remote-layer volumes are
mounted into the agent and the restore step only, never into the trainer.

Credentials only where they are needed: the pod does not automount its service account's
token; the agent alone mounts it (a projected volume), so the trainer, the user's own code,
holds no Kubernetes credentials and cannot write the verdict the operator acts on. A layer's
Secret is mounted into the agent and the restore step, the data source's into `stage-data`. The
companion containers (agent, init steps) run with read-only root file systems and a small
scratch volume at /tmp; the trainer's root stays writable (user code writes caches there).

A gang's member m (`PodInputs.member`) is this pod with a name of its own (`<run>-<k>-<m>`),
its index as a label, `hostname` `<run>-<m>` (the same in every attempt) in the subdomain of
the run's headless Service (`build.service`), so member 0 is `<run>-0.<run>-gang` to every
member; its contract names its node rank, the gang's size, member 0's address and port, and its
own heartbeat Lease. A one-pod run's pod (`member` None) is exactly what it always was.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainguard.api import TrainingRun, TrainingRunSpec
from trainguard.api.constants import (
    ANNOTATION_ENV_CONFIG,
    ANNOTATION_SPEC_HASH,
    COMPONENT_TRAINING_POD,
    TAINT_UNHEALTHY,
)
from trainguard.api.spec import Data, RemoteLayer
from trainguard.api.types import FILE_URI_PREFIX
from trainguard.contract.env import (
    DEFAULT_L0_DIR,
    DEFAULT_MASTER_PORT,
    DEFAULT_STATE_DIR,
    PodEnv,
    lease_name,
)
from trainguard.contract.files import GPU_FILENAME, HEARTBEAT_FILENAME, LOG_FILENAME
from trainguard.operator.build.constants import (
    AGENT_COMMAND,
    AGENT_CPU,
    AGENT_MEMORY,
    AGENT_MEMORY_LIMIT,
    API_ACCESS_DIR,
    API_TOKEN_SECONDS,
    CREDENTIALS_DIR,
    CREDENTIALS_VOLUME_PREFIX,
    DATA_SOURCE_CREDENTIALS_DIR,
    DATA_SOURCE_DIR,
    INIT_CPU,
    INIT_MEMORY,
    INIT_MEMORY_LIMIT,
    LOG_DIR,
    LOG_VOLUME_BYTES,
    REMOTE_VOLUME_PREFIX,
    STATE_VOLUME_BYTES,
    SUPERVISOR_COMMAND,
    TMP_DIR,
    TMP_VOLUME_BYTES,
    TRAINER_STOP_SECONDS,
    Container,
    Volume,
)
from trainguard.operator.build.envconfig import config_name, env_config, take_shared
from trainguard.operator.build.meta import child_meta, run_name
from trainguard.operator.build.names import (
    gang_service_name,
    member_address,
    member_hostname,
    member_labels,
    pod_labels,
    pod_name,
    rbac_name,
)
from trainguard.operator.build.sizing import DiskSizes, disk_sizes, l0_bytes, mebibytes

# Every container of the pod runs with this supplementary group (the pod's `fsGroup`), so the
# volumes they share are group-owned: the kubelet makes emptyDirs and claims group-writable
# (setgid), and the pod's programs create with a group-writable umask
# (`trainguard.contract.files.share_with_pod`). Containers may run as different users (the
# agent's image and the trainer's image each declare their own); the group is what lets the
# trainer prune a checkpoint the restore step wrote.
POD_FS_GROUP = 65532
# A layer's Secret: root-owned, readable by the pod's group, in the containers that mount it
# (the agent and the restore step; never the trainer). The data source's Secret likewise, in
# the stage-data step only.
SECRET_MODE = 0o440
# Node affinity on the node's name, not its hostname label, which may differ from it.
NODE_NAME_FIELD = "metadata.name"
SPEC_HASH_LENGTH = 16
# Spec fields added after runs already existed, with the value that means "as before": left out
# of the spec hash while they hold it. The apiserver fills a new field's default into every
# stored run, so hashing it would change the hash of every existing run and make the operator
# recreate every running pod after an upgrade. (camelCase path, default)
ADDED_DEFAULTS: tuple[tuple[tuple[str, ...], object], ...] = (
    (("trainer", "nodes"), 1),
    (("trainer", "procsPerNode"), None),
)


@dataclass(frozen=True)
class PodInputs:
    """What the pod depends on besides the spec: the attempt, status and operator settings."""

    attempt: int
    excluded_nodes: tuple[str, ...] = ()
    agent_image: str = ""
    member: int | None = None  # a gang member's index; None for a one-pod run's pod


def spec_hash(spec: TrainingRunSpec) -> str:
    """A digest of everything in the spec a pod is built from (all of it but `suspend`)."""
    data = spec.to_object()
    data.pop("suspend", None)
    for path, default in ADDED_DEFAULTS:
        *parents, name = path
        holder = data
        for key in parents:
            holder = holder.get(key) or {}
        if name in holder and holder[name] == default:
            del holder[name]
    encoded = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:SPEC_HASH_LENGTH]


def training_pod(run: TrainingRun, inputs: PodInputs) -> dict[str, Any]:
    """The complete pod manifest of attempt `inputs.attempt`."""
    name = run_name(run)
    spec = run.spec
    sizes = disk_sizes(spec)
    contract = pod_env(run, inputs.attempt, inputs.member)
    env_common = contract.env_vars()
    pod_spec: dict[str, Any] = {
        "serviceAccountName": rbac_name(name),
        # The agent mounts the token itself (`_api_access`); no other container gets it.
        "automountServiceAccountToken": False,
        "restartPolicy": "Never",
        "shareProcessNamespace": True,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "securityContext": {
            "runAsNonRoot": True,
            "fsGroup": POD_FS_GROUP,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [
            _agent(spec, inputs.agent_image, contract),
            *_init_steps(spec, inputs.agent_image, contract),
        ],
        "containers": [_trainer(spec, sizes, env_common)],
        "volumes": _volumes(spec, sizes),
    }
    if spec.placement.node_selector:
        pod_spec["nodeSelector"] = dict(spec.placement.node_selector)
    tolerations = [t.to_object() for t in spec.placement.tolerations if t.key != TAINT_UNHEALTHY]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if inputs.excluded_nodes:
        pod_spec["affinity"] = _excluding(inputs.excluded_nodes)
    shared = contract.shared_env()
    config = config_name(name, shared)
    take_shared([*pod_spec["initContainers"], *pod_spec["containers"]], config, shared)
    labels = pod_labels(name, COMPONENT_TRAINING_POD, inputs.attempt)
    if inputs.member is not None:
        pod_spec["hostname"] = member_hostname(name, inputs.member)
        pod_spec["subdomain"] = gang_service_name(name)
        labels = member_labels(name, COMPONENT_TRAINING_POD, inputs.attempt, inputs.member)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": child_meta(
            run,
            pod_name(name, inputs.attempt, inputs.member),
            labels,
            {ANNOTATION_SPEC_HASH: spec_hash(spec), ANNOTATION_ENV_CONFIG: config},
        ),
        "spec": pod_spec,
    }


def gang_pods(
    run: TrainingRun, inputs: PodInputs, members: tuple[int, ...] = ()
) -> list[dict[str, Any]]:
    """The pods of attempt `inputs.attempt`: one, or a gang's members (`members`, else all)."""
    nodes = run.spec.trainer.nodes
    if nodes == 1:
        return [training_pod(run, inputs)]
    return [training_pod(run, replace(inputs, member=m)) for m in members or range(nodes)]


def pods_env_config(run: TrainingRun, attempt: int) -> dict[str, Any]:
    """The env ConfigMap that the pods of attempt `attempt` take their shared variables from."""
    return env_config(run, pod_env(run, attempt, None if run.spec.trainer.nodes == 1 else 0))


def termination_grace_seconds(spec: TrainingRunSpec) -> int:
    """How long a deleted pod may take to stop: the trainer's exit, then the agent's flush.

    A deliberate deletion (suspend, spec change, reschedule) must not lose the newest L1
    checkpoint, which dies with an emptyDir: the agent ships it on SIGTERM, bounded by
    `spec.checkpoints.flushTimeoutSeconds`, when there is a remote layer to ship it to.
    """
    flush = spec.checkpoints.flush_timeout_seconds if spec.checkpoints.remote else 0
    return TRAINER_STOP_SECONDS + flush


def pod_env(run: TrainingRun, attempt: int, member: int | None = None) -> PodEnv:
    """The pod contract of attempt `attempt` (of gang member `member`), as the trainer sees it.

    No layer Secrets. A one-pod run's (`member` None) names no master: torchrun runs standalone.
    """
    name = run_name(run)
    spec = run.spec
    state = Path(DEFAULT_STATE_DIR)
    sizes = disk_sizes(spec)
    data = spec.data
    return PodEnv(
        run_name=name,
        run_uid=run.metadata.uid or "",
        namespace=run.metadata.namespace or "",
        attempt=attempt,
        # Every superseded attempt's fence (`policies.fencing`): restore stays in the lineage.
        fences={f.attempt: f.step for f in (run.status.fences if run.status else ())},
        lease_name=lease_name(name, member or 0),
        l1_dir=Path(spec.checkpoints.l1.mount_path),
        l0_dir=Path(DEFAULT_L0_DIR),
        data_dir=None if data is None else Path(data.mount_path),
        state_dir=state,
        heartbeat_file=state / HEARTBEAT_FILENAME,
        gpu_file=state / GPU_FILENAME,
        log_file=Path(LOG_DIR) / LOG_FILENAME,
        keep_last=spec.checkpoints.l1.keep_last,
        every_steps=spec.checkpoints.every_steps,
        every_seconds=spec.checkpoints.every_seconds,
        hash_algorithm=spec.checkpoints.hash_algorithm.value,
        monitor=spec.monitor,
        recovery=spec.recovery,
        layers=tuple(spec.checkpoints.remote),
        flush_timeout_seconds=spec.checkpoints.flush_timeout_seconds,
        procs_per_node=spec.trainer.ranks_per_node,
        data_source=_staging_source(data) if data is not None and data.stage else None,
        data_bytes=sizes.data if data is not None else None,
        checkpoint_bytes=sizes.checkpoint,
        layer_paths={layer.name: _layer_mount_path(layer) for layer in _remote_claims(spec)},
        nnodes=spec.trainer.nodes,
        node_rank=member or 0,
        master_addr=None if member is None else member_address(name, 0),
        master_port=DEFAULT_MASTER_PORT,
    )


def _staging_source(data: Data) -> str:
    # A source PVC is mounted into the stage-data step; a URI is fetched by it.
    return DATA_SOURCE_DIR if data.source.pvc is not None else str(data.source.uri)


def _layer_mount_path(layer: RemoteLayer) -> str:
    # A file:// layer's volume is mounted at the URI's path, so the URI means the same inside.
    return layer.uri.removeprefix(FILE_URI_PREFIX)


def _restricted(read_only_root: bool = True) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": read_only_root,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _mount(
    volume: str, path: str, read_only: bool = False, sub_path: str | None = None
) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": volume, "mountPath": path}
    if read_only:
        mount["readOnly"] = True
    if sub_path:
        mount["subPath"] = sub_path
    return mount


def _gpus(spec: TrainingRunSpec) -> dict[str, str]:
    resources = spec.trainer.resources
    return {resources.gpu_resource: str(resources.gpus)} if resources.gpus else {}


def _l1_mount(spec: TrainingRunSpec) -> dict[str, Any]:
    return _mount(Volume.L1, spec.checkpoints.l1.mount_path)


def _l0_mount(read_only: bool = False) -> dict[str, Any]:
    return _mount(Volume.L0, DEFAULT_L0_DIR, read_only)


def _state_mount() -> dict[str, Any]:
    return _mount(Volume.STATE, DEFAULT_STATE_DIR)


def _tmp_mount() -> dict[str, Any]:
    return _mount(Volume.TMP, TMP_DIR)


def _remote_claims(spec: TrainingRunSpec) -> list[RemoteLayer]:
    return [layer for layer in spec.checkpoints.remote if layer.claim_name is not None]


def _remote_mounts(spec: TrainingRunSpec, read_only: bool) -> list[dict[str, Any]]:
    mounts = [
        _mount(REMOTE_VOLUME_PREFIX + layer.name, _layer_mount_path(layer), read_only)
        for layer in _remote_claims(spec)
    ]
    mounts += [
        _mount(CREDENTIALS_VOLUME_PREFIX + layer.name, _credentials_dir(layer), True)
        for layer in spec.checkpoints.remote
        if layer.credentials_secret is not None
    ]
    return mounts


def _credentials_dir(layer: RemoteLayer) -> str:
    return f"{CREDENTIALS_DIR}/{layer.name}"


def _with_credentials(spec: TrainingRunSpec, contract: PodEnv) -> list[dict[str, Any]]:
    # Only the containers that mount the Secrets (agent, restore) learn where they are.
    secrets = {
        layer.name: _credentials_dir(layer)
        for layer in spec.checkpoints.remote
        if layer.credentials_secret is not None
    }
    return contract.model_copy(update={"layer_secrets": secrets}).env_vars()


def _small(cpu: str, memory: str, memory_limit: str) -> dict[str, Any]:
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory_limit}}


def _agent(spec: TrainingRunSpec, image: str, contract: PodEnv) -> dict[str, Any]:
    return {
        "name": Container.AGENT,
        "image": image,
        "command": list(AGENT_COMMAND),
        "restartPolicy": "Always",
        "env": _with_credentials(spec, contract),
        "resources": _small(AGENT_CPU, AGENT_MEMORY, AGENT_MEMORY_LIMIT),
        "securityContext": _restricted(),
        "volumeMounts": [
            _l1_mount(spec),
            _l0_mount(read_only=True),
            _state_mount(),
            _mount(Volume.LOGS, LOG_DIR, read_only=True),
            _mount(Volume.API_ACCESS, API_ACCESS_DIR, read_only=True),
            _tmp_mount(),
            *_remote_mounts(spec, read_only=False),
        ],
    }


def _init_step(
    step: str,
    image: str,
    env_common: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    gpus: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources = _small(INIT_CPU, INIT_MEMORY, INIT_MEMORY_LIMIT)
    if gpus:
        # Init steps that check the GPU request the same GPUs as the trainer.
        resources["requests"].update(gpus)
        resources["limits"].update(gpus)
    container: dict[str, Any] = {
        "name": step,
        "image": image,
        "command": ["trainguard", step],
        "env": copy.deepcopy(env_common),
        "resources": resources,
        "securityContext": _restricted(),
        "volumeMounts": [*mounts, _tmp_mount()],
    }
    return container


def _init_steps(spec: TrainingRunSpec, image: str, contract: PodEnv) -> list[dict[str, Any]]:
    env_common = contract.env_vars()
    steps = [
        _init_step(
            Container.PREFLIGHT,
            image,
            env_common,
            [_l1_mount(spec), _state_mount()],
            gpus=_gpus(spec),
        )
    ]
    data = spec.data
    if data is not None and data.stage:
        # The state volume carries its progress report to the agent, and on to the status.
        mounts = [_mount(Volume.DATA, data.mount_path), _state_mount()]
        stage_env = env_common
        if data.source.pvc is not None:
            mounts.append(
                _mount(Volume.DATA_SOURCE, DATA_SOURCE_DIR, True, data.source.pvc.sub_path)
            )
        if data.source.credentials_secret is not None:
            # Only this step reads the source, so only it mounts the Secret and learns where.
            mounts.append(_mount(Volume.DATA_SOURCE_CREDENTIALS, DATA_SOURCE_CREDENTIALS_DIR, True))
            secrets = Path(DATA_SOURCE_CREDENTIALS_DIR)
            stage_env = contract.model_copy(update={"data_secrets": secrets}).env_vars()
        steps.append(_init_step(Container.STAGE_DATA, image, stage_env, mounts))
    if spec.checkpoints.remote or spec.checkpoints.l1.storage.local_volume is not None:
        steps.append(
            _init_step(
                Container.RESTORE,
                image,
                _with_credentials(spec, contract),
                [_l1_mount(spec), _state_mount(), *_remote_mounts(spec, read_only=True)],
            )
        )
    return steps


def _trainer_env(spec: TrainingRunSpec, env_common: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The contract's variables win over the user's of the same name (names must be unique).
    ours = {item["name"] for item in env_common}
    user = [item.to_object() for item in spec.trainer.env if item.name not in ours]
    return [*user, *copy.deepcopy(env_common)]


def _trainer(
    spec: TrainingRunSpec, sizes: DiskSizes, env_common: list[dict[str, Any]]
) -> dict[str, Any]:
    trainer = spec.trainer
    requests: dict[str, str] = {"ephemeral-storage": mebibytes(sizes.ephemeral_request)}
    limits: dict[str, str] = {}
    for resource, value in (("cpu", trainer.resources.cpu), ("memory", trainer.resources.memory)):
        if value is not None:
            requests[resource] = limits[resource] = str(value)
    requests.update(_gpus(spec))
    limits.update(_gpus(spec))
    mounts = [_l1_mount(spec), _l0_mount(), _state_mount(), _mount(Volume.LOGS, LOG_DIR)]
    if spec.data is not None:
        # Staged data is a local copy; an unstaged PVC is read in place, at its subPath.
        sub_path = (
            None
            if spec.data.stage or spec.data.source.pvc is None
            else spec.data.source.pvc.sub_path
        )
        mounts.insert(0, _mount(Volume.DATA, spec.data.mount_path, True, sub_path))
    container: dict[str, Any] = {
        "name": Container.TRAINER,
        "image": trainer.image,
        "command": [*SUPERVISOR_COMMAND, *trainer.command],
        "env": _trainer_env(spec, env_common),
        "resources": {"requests": requests, "limits": limits} if limits else {"requests": requests},
        "securityContext": _restricted(read_only_root=False),
        "volumeMounts": mounts,
    }
    if trainer.args:
        container["args"] = list(trainer.args)
    if trainer.working_dir:
        container["workingDir"] = trainer.working_dir
    return container


def _empty_dir(size: int | None, medium: str | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {}
    if medium:
        source["medium"] = medium
    if size is not None:
        source["sizeLimit"] = mebibytes(size)
    return {"emptyDir": source}


def _claim(name: str, read_only: bool) -> dict[str, Any]:
    claim: dict[str, Any] = {"claimName": name}
    if read_only:
        claim["readOnly"] = True
    return {"persistentVolumeClaim": claim}


def _l1_volume(spec: TrainingRunSpec, sizes: DiskSizes) -> dict[str, Any]:
    local = spec.checkpoints.l1.storage.local_volume
    if local is None:
        return _empty_dir(sizes.l1)
    storage_class = local.storage_class_name or spec.placement.local_storage_class_name
    # A generic ephemeral volume: a PVC of the node-local class, created and deleted with
    # the pod (a rescheduled run restores from a remote layer, not from the old node's disk).
    return {
        "ephemeral": {
            "volumeClaimTemplate": {
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage_class,
                    "resources": {"requests": {"storage": mebibytes(sizes.l1 or 0)}},
                }
            }
        }
    }


def _volumes(spec: TrainingRunSpec, sizes: DiskSizes) -> list[dict[str, Any]]:
    volumes = [
        {"name": Volume.L1, **_l1_volume(spec, sizes)},
        {"name": Volume.L0, **_empty_dir(l0_bytes(sizes.checkpoint), medium="Memory")},
        {"name": Volume.STATE, **_empty_dir(STATE_VOLUME_BYTES, medium="Memory")},
        {"name": Volume.LOGS, **_empty_dir(LOG_VOLUME_BYTES)},
        {"name": Volume.TMP, **_empty_dir(TMP_VOLUME_BYTES)},
        {"name": Volume.API_ACCESS, **_api_access()},
    ]
    data = spec.data
    if data is not None:
        pvc = data.source.pvc
        if data.stage:
            volumes.insert(0, {"name": Volume.DATA, **_empty_dir(sizes.data)})
            if pvc is not None:
                volumes.append({"name": Volume.DATA_SOURCE, **_claim(pvc.claim_name, True)})
            secret = data.source.credentials_secret
            if secret is not None:
                volumes.append(
                    {
                        "name": Volume.DATA_SOURCE_CREDENTIALS,
                        "secret": {"secretName": secret.name, "defaultMode": SECRET_MODE},
                    }
                )
        elif pvc is not None:
            volumes.insert(0, {"name": Volume.DATA, **_claim(pvc.claim_name, True)})
    for layer in _remote_claims(spec):
        volumes.append(
            {"name": REMOTE_VOLUME_PREFIX + layer.name, **_claim(str(layer.claim_name), False)}
        )
    for layer in spec.checkpoints.remote:
        if layer.credentials_secret is not None:
            volumes.append(
                {
                    "name": CREDENTIALS_VOLUME_PREFIX + layer.name,
                    "secret": {
                        "secretName": layer.credentials_secret.name,
                        "defaultMode": SECRET_MODE,
                    },
                }
            )
    return volumes


def _api_access() -> dict[str, Any]:
    # What the kubelet automounts, as a volume the agent alone mounts: a bound token of the
    # pod's service account (rotated by the kubelet), the cluster's CA and the namespace.
    return {
        "projected": {
            "defaultMode": SECRET_MODE,
            "sources": [
                {
                    "serviceAccountToken": {
                        "path": "token",
                        "expirationSeconds": API_TOKEN_SECONDS,
                    }
                },
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                        ]
                    }
                },
            ],
        }
    }


def _excluding(nodes: tuple[str, ...]) -> dict[str, Any]:
    # The apiserver allows exactly one value in a `matchFields` requirement: one NotIn per
    # node, which the scheduler ANDs within the term.
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": NODE_NAME_FIELD, "operator": "NotIn", "values": [node]}
                            for node in sorted(nodes)
                        ]
                    }
                ]
            }
        }
    }
