"""The TrainingRun spec: what the user declares, with its defaults and validation rules.

Field descriptions become the CRD's descriptions (`kubectl explain`), so they are written for
the user. Defaults follow DESIGN.md; the numbers behind them come from INCIDENTS.md.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, Strict

from trainguard.api.base import FieldRule, KubeModel, ObjectRule, map_list, unique_by
from trainguard.api.constants import (
    GPU_RESOURCE,
    L0_LAYER,
    L1_LAYER,
    MAX_NODES,
    Contents,
    HashAlgorithm,
    NetworkVolumes,
    OnRepeatedFailure,
    TaintEffect,
    TolerationOperator,
)
from trainguard.api.types import (
    FILE_URI_PREFIX,
    HF_URI_PREFIX,
    MAX_LABEL_LENGTH,
    MAX_NAME_LENGTH,
    SSH_URI_PREFIX,
    AbsolutePath,
    DataUri,
    DnsLabel,
    DnsSubdomain,
    EnvVarName,
    QualifiedName,
    Quantity,
    RelativePath,
    Uri,
)

# Defaults (DESIGN.md; the cadence of 50 steps is the one that lost 22 steps in incident 2,
# kept because a lost step costs less than a blocked one for typical runs).
# Where the pod mounts L1 and the local data copy unless the spec says otherwise.
DEFAULT_L1_DIR = "/trainguard/l1"
DEFAULT_DATA_DIR = "/trainguard/data"
DEFAULT_EVERY_STEPS = 50
DEFAULT_KEEP_LAST = 2
DEFAULT_REMOTE_KEEP = 2
DEFAULT_FLUSH_TIMEOUT_SECONDS = 600
DEFAULT_INTERVAL_SECONDS = 1
DEFAULT_HANG_AFTER_SECONDS = 300
DEFAULT_SLOW_AFTER_SECONDS = 120
# monitor.hangAfterStepTimes: its range, the steps the harness takes its slowest from, and the
# shortest bound it gives (the agent times a step from the loop's report in the heartbeat,
# written once a second: a healthy step reads about a second old at most, plus the step).
MIN_HANG_STEP_TIMES = 2.0
MAX_HANG_STEP_TIMES = 1000.0
STEP_TIME_WINDOW = 100
MIN_ADAPTIVE_HANG_SECONDS = 3
DEFAULT_STARTUP_GRACE_SECONDS = 900
DEFAULT_IO_STUCK_AFTER_SECONDS = 60
DEFAULT_LEASE_DURATION_SECONDS = 15
DEFAULT_GHOST_THRESHOLD_MIB = 2048
DEFAULT_GHOST_RATIO = 1.5
DEFAULT_GPU_RELEASE_SECONDS = 30
DEFAULT_IN_PLACE_RESTARTS = 3
DEFAULT_MAX_RESTARTS = 10
DEFAULT_BACKOFF_INITIAL_SECONDS = 5
DEFAULT_BACKOFF_MAX_SECONDS = 300
# The kubelet forgets a crash loop's back-off after 10 minutes of running.
DEFAULT_BACKOFF_RESET_AFTER_SECONDS = 600
DEFAULT_SAME_STEP_WINDOW = 10
DEFAULT_GPUS = 1
# Pods per attempt (members of the gang): one unless the run asks for a gang.
DEFAULT_NODES = 1

# Bounds: lists and strings need them so the apiserver can price the CEL rules.
MAX_ARGS = 256
MAX_ARG_LENGTH = 4096
MAX_ENV = 128
MAX_ENV_VALUE_LENGTH = 32768
MAX_IMAGE_LENGTH = 512
MAX_REMOTE_LAYERS = 8
MAX_TOLERATIONS = 32
MAX_NODE_SELECTOR = 32
MAX_KEEP = 1000
MAX_GPUS = 64
MAX_PROCS_PER_NODE = 256
MAX_SECONDS = 7 * 24 * 3600
MAX_STEPS = 10**9
MAX_RESTARTS = 10000
MAX_PARAMETERS = 10**15

# Strict mode wants enum members; the apiserver sends their string values.
Lax = Strict(False)
Seconds = Annotated[int, Field(ge=0, le=MAX_SECONDS)]
PositiveSeconds = Annotated[int, Field(ge=1, le=MAX_SECONDS)]


def _sub(model: type[KubeModel], description: str) -> Any:
    """A nested object that is always present, defaulted like the apiserver does it.

    The CRD default is the whole defaulted object, not `{}`: the apiserver checks a default
    against the CEL rules as it is, without applying the nested defaults first.
    """
    return Field(
        default_factory=model,
        description=description,
        json_schema_extra={"default": model().to_object()},
    )


class EnvVar(KubeModel):
    """An environment variable of the trainer."""

    name: EnvVarName = Field(description="Name of the variable.")
    value: str = Field(
        default="", max_length=MAX_ENV_VALUE_LENGTH, description="Value of the variable."
    )


class Resources(KubeModel):
    """Compute resources of the trainer container. Storage is sized by trainguard."""

    gpus: int = Field(
        default=DEFAULT_GPUS,
        ge=0,
        le=MAX_GPUS,
        description="GPUs requested (0 for a CPU-only run).",
    )
    gpu_resource: QualifiedName = Field(
        default=GPU_RESOURCE, description="Extended resource name that GPUs are requested by."
    )
    cpu: Quantity | None = Field(
        default=None, description="CPU request and limit, e.g. 8 or 7500m."
    )
    memory: Quantity | None = Field(
        default=None, description="Memory request and limit, e.g. 64Gi."
    )


class Trainer(KubeModel):
    """The training container. trainguard runs `command` under its supervisor.

    With more than one rank per pod (`procsPerNode`, by default the GPU count), the supervisor
    starts the command once per rank through PyTorch's elastic launcher (torchrun), with the
    standard RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and restarts all ranks
    together when any of them dies.
    """

    object_rules = (
        ObjectRule(
            cel=f"self.nodes <= {MAX_NODES}",
            message=f"nodes must be at most {MAX_NODES}: members of one gang",
            message_expression=(
                f"'nodes %d exceeds the largest gang, {MAX_NODES} members'.format([self.nodes])"
            ),
            describe=lambda s: f"nodes {s.nodes} exceeds the largest gang, {MAX_NODES} members",
            check=lambda s: s.nodes <= MAX_NODES,
            field="nodes",
        ),
        ObjectRule(
            cel=(
                "!has(self.procsPerNode) || self.resources.gpus == 0 || "
                "self.procsPerNode <= self.resources.gpus"
            ),
            message="procsPerNode exceeds the GPU count (resources.gpus): one rank per GPU at most",
            message_expression=(
                "'procsPerNode %d exceeds the GPU count %d (resources.gpus): one rank per GPU "
                "at most'.format([self.procsPerNode, self.resources.gpus])"
            ),
            describe=lambda s: (
                f"procsPerNode {s.procs_per_node} exceeds the GPU count {s.resources.gpus} "
                "(resources.gpus): one rank per GPU at most"
            ),
            check=lambda s: (
                s.procs_per_node is None
                or s.resources.gpus == 0
                or s.procs_per_node <= s.resources.gpus
            ),
            field="procsPerNode",
        ),
    )

    image: str = Field(
        min_length=1, max_length=MAX_IMAGE_LENGTH, description="Container image of the trainer."
    )
    # An empty entry is no program and no argument: exec would fail in every attempt.
    command: list[Annotated[str, Field(min_length=1, max_length=MAX_ARG_LENGTH)]] = Field(
        min_length=1,
        max_length=MAX_ARGS,
        description=(
            "Command that starts training (no shell; no empty entries). Required: the "
            "supervisor starts it and restarts it in place after a software death."
        ),
    )
    args: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] = Field(
        default_factory=list, max_length=MAX_ARGS, description="Arguments to the command."
    )
    env: Annotated[
        list[EnvVar],
        unique_by("name", "name", "env names must be unique"),
    ] = Field(
        default_factory=list,
        max_length=MAX_ENV,
        description="Environment variables (names unique).",
        json_schema_extra=map_list("name"),
    )
    working_dir: AbsolutePath | None = Field(
        default=None, description="Working directory (absolute); the image's when omitted."
    )
    resources: Resources = _sub(Resources, "GPUs, CPU and memory of the trainer.")
    nodes: int = Field(
        default=DEFAULT_NODES,
        ge=1,
        description=(
            f"Pods per attempt: members of the gang (at most {MAX_NODES}), member k being node "
            "rank k with the stable name <run>-<k>.<run>-gang (a gang's run name is a DNS label "
            "of at most 58 characters); 1 is a one-pod run. Each member runs procsPerNode "
            "ranks and requests resources on its node: ask for a node's GPUs to place one "
            "member per node."
        ),
    )
    procs_per_node: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PROCS_PER_NODE,
        description=(
            "Ranks per pod, started by PyTorch's elastic launcher (torchrun) under the "
            "supervisor. Omitted: the GPU count (resources.gpus), or 1 for a CPU-only run; at "
            "most the GPU count when GPUs are requested. Set 1 when the command starts its "
            "own ranks."
        ),
    )

    @property
    def ranks_per_node(self) -> int:
        """The ranks each pod runs: `procsPerNode`, else one per GPU, else one."""
        if self.procs_per_node is not None:
            return self.procs_per_node
        return max(1, self.resources.gpus)


class Model(KubeModel):
    """What is being trained; used for sizing when the checkpoint size is not given."""

    name: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LENGTH, description="Model name."
    )
    parameters: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PARAMETERS,
        description=(
            "Parameter count. When spec.checkpoints.size is omitted, the size of a full "
            "checkpoint is estimated from it to size local disk."
        ),
    )


class PvcSource(KubeModel):
    """An existing PersistentVolumeClaim in the run's namespace."""

    claim_name: DnsSubdomain = Field(description="Name of the PersistentVolumeClaim.")
    sub_path: RelativePath | None = Field(
        default=None, description="Directory inside the volume (relative); its root if omitted."
    )


class DataSource(KubeModel):
    """Where the data comes from: exactly one of pvc and uri."""

    object_rules = (
        ObjectRule(
            cel="has(self.pvc) != has(self.uri)",
            message="set exactly one of pvc and uri",
            check=lambda s: (s.pvc is None) != (s.uri is None),
        ),
        ObjectRule(
            cel=(
                "!has(self.credentialsSecret) || "
                f"(has(self.uri) && !self.uri.startsWith('{FILE_URI_PREFIX}'))"
            ),
            message=(
                "credentialsSecret is for s3://, hf:// and ssh:// sources; a pvc or file:// "
                "source takes none"
            ),
            check=lambda s: (
                s.credentials_secret is None
                or (s.uri is not None and not s.uri.startswith(FILE_URI_PREFIX))
            ),
            field="credentialsSecret",
        ),
        ObjectRule(
            cel=(
                f"!has(self.uri) || !self.uri.startsWith('{SSH_URI_PREFIX}') || "
                "has(self.credentialsSecret)"
            ),
            message=(
                "an ssh:// data source needs credentialsSecret (a Secret with ssh-privatekey "
                "and optionally known_hosts)"
            ),
            check=lambda s: (
                s.uri is None
                or not s.uri.startswith(SSH_URI_PREFIX)
                or s.credentials_secret is not None
            ),
            field="credentialsSecret",
        ),
    )

    pvc: PvcSource | None = Field(default=None, description="An existing PVC, with a subPath.")
    uri: DataUri | None = Field(
        default=None,
        description=(
            "A URI: file:///path, s3://bucket/prefix, hf://datasets/owner/name[@revision][/path] "
            "(a dataset on the Hugging Face Hub) or ssh://[user@]host[:port]/path."
        ),
    )
    credentials_secret: SecretRef | None = Field(
        default=None,
        description=(
            "Secret with the credentials of a uri source, mounted read-only into the "
            "stage-data step only: s3 AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and optionally "
            "AWS_ENDPOINT_URL (omit to use the pod's identity); hf token (omit for a public "
            "dataset); ssh ssh-privatekey and optionally known_hosts and config (an OpenSSH "
            "client config: the HostName, Port and User of the URI's host) (required for ssh://)."
        ),
    )


class Data(KubeModel):
    """Training data. Staged data is copied to local disk, verified, before training starts."""

    object_rules = (
        ObjectRule(
            cel="self.stage || has(self.source.pvc)",
            message=(
                "stage: false reads the data in place and needs source.pvc; a uri source is "
                "always staged to local disk"
            ),
            check=lambda s: s.stage or s.source.pvc is not None,
            field="stage",
        ),
    )

    source: DataSource = Field(description="Where the data comes from.")
    size: Quantity | None = Field(
        default=None,
        description="Size of the data, e.g. 71Gi; sizes the local disk request when staged.",
    )
    mount_path: AbsolutePath = Field(
        default=DEFAULT_DATA_DIR, description="Where the trainer finds the data."
    )
    stage: bool = Field(
        default=True,
        description=(
            "Copy the data to local disk before training (recommended: network volumes hang "
            "reads). false mounts the PVC directly, subject to spec.placement.networkVolumes."
        ),
    )


class EmptyDirStorage(KubeModel):
    """L1 on an emptyDir volume: node-local, dies with the pod (flushed before deletions)."""

    size_limit: Quantity | None = Field(
        default=None,
        description=(
            "Size of the volume; derived from the checkpoint size and keepLast when omitted."
        ),
    )


class LocalVolumeStorage(KubeModel):
    """L1 on a node-local PersistentVolume provisioned for the run."""

    storage_class_name: DnsSubdomain | None = Field(
        default=None,
        description=(
            "StorageClass of node-local volumes; spec.placement.localStorageClassName if omitted."
        ),
    )
    size: Quantity = Field(description="Size of the volume, e.g. 200Gi.")


class L1Storage(KubeModel):
    """The volume behind L1: exactly one of emptyDir and localVolume."""

    object_rules = (
        ObjectRule(
            cel="has(self.emptyDir) != has(self.localVolume)",
            message="set exactly one of emptyDir and localVolume",
            check=lambda s: (s.empty_dir is None) != (s.local_volume is None),
        ),
    )

    empty_dir: EmptyDirStorage | None = Field(
        default=None, description="An emptyDir volume (the default)."
    )
    local_volume: LocalVolumeStorage | None = Field(
        default=None, description="A node-local PersistentVolume."
    )


def _default_l1_storage() -> L1Storage:
    return L1Storage(empty_dir=EmptyDirStorage())


class L1(KubeModel):
    """The local checkpoint layer: written by the trainer, on local disk only."""

    keep_last: int = Field(
        default=DEFAULT_KEEP_LAST,
        ge=1,
        le=MAX_KEEP,
        description=(
            "Checkpoints kept on local disk. The newest verified one is never deleted before a "
            "newer one has verified."
        ),
    )
    mount_path: AbsolutePath = Field(
        default=DEFAULT_L1_DIR, description="Where the trainer writes checkpoints."
    )
    storage: L1Storage = Field(
        default_factory=_default_l1_storage,
        description="Volume that holds L1.",
        json_schema_extra={"default": _default_l1_storage().to_object()},
    )


class SecretRef(KubeModel):
    """A Secret in the run's namespace."""

    name: DnsSubdomain = Field(description="Name of the Secret.")


LayerName = Annotated[
    DnsLabel,
    FieldRule(
        cel=f"self != '{L1_LAYER}' && self != '{L0_LAYER}'",
        message=f"'{L1_LAYER}' and '{L0_LAYER}' are reserved for the local layers; "
        "choose another name",
        check=lambda name: name not in (L1_LAYER, L0_LAYER),
    ),
]


class RemoteLayer(KubeModel):
    """A remote checkpoint layer: verified L1 checkpoints are shipped to it in the background."""

    object_rules = (
        ObjectRule(
            cel=f"!self.uri.startsWith('{HF_URI_PREFIX}') || self.contents == 'weights'",
            message="an hf:// layer holds model weights only: set contents: weights",
            check=lambda s: not s.uri.startswith(HF_URI_PREFIX) or s.contents is Contents.WEIGHTS,
            field="contents",
        ),
        ObjectRule(
            cel=(
                f"!(self.uri.startsWith('{HF_URI_PREFIX}') || "
                f"self.uri.startsWith('{SSH_URI_PREFIX}')) || has(self.credentialsSecret)"
            ),
            message=(
                "hf:// and ssh:// layers need credentialsSecret (a Secret with a token or an "
                "SSH key)"
            ),
            check=lambda s: (
                not s.uri.startswith((HF_URI_PREFIX, SSH_URI_PREFIX))
                or s.credentials_secret is not None
            ),
            field="credentialsSecret",
        ),
        ObjectRule(
            cel=f"!self.uri.startsWith('{FILE_URI_PREFIX}') || !has(self.credentialsSecret)",
            message=(
                "file:// layers take no credentialsSecret; mount the destination with claimName"
            ),
            check=lambda s: not s.uri.startswith(FILE_URI_PREFIX) or s.credentials_secret is None,
            field="credentialsSecret",
        ),
        ObjectRule(
            cel=f"!self.uri.startsWith('{FILE_URI_PREFIX}') || has(self.claimName)",
            message=(
                "a file:// layer needs claimName, the PVC mounted at its path: without one the "
                "path is inside the agent's container and is lost with the pod"
            ),
            check=lambda s: not s.uri.startswith(FILE_URI_PREFIX) or s.claim_name is not None,
            field="claimName",
        ),
        ObjectRule(
            cel=f"!has(self.claimName) || self.uri.startsWith('{FILE_URI_PREFIX}')",
            message="claimName is only for file:// layers",
            check=lambda s: s.claim_name is None or s.uri.startswith(FILE_URI_PREFIX),
            field="claimName",
        ),
    )

    name: LayerName = Field(
        description=f"Name of the layer (a DNS label, unique, not '{L1_LAYER}' or '{L0_LAYER}'); "
        "used in status."
    )
    uri: Uri = Field(
        description=(
            "Destination: file:///path (the path where claimName is mounted), "
            "s3://bucket/prefix, hf://owner/repo (Hugging Face Hub, weights only) or "
            "ssh://[user@]host[:port]/path."
        )
    )
    contents: Annotated[Contents, Lax] = Field(
        default=Contents.FULL,
        description="full ships everything needed to resume; weights ships model weights only.",
    )
    every_steps: int = Field(
        default=0,
        ge=0,
        le=MAX_STEPS,
        description=(
            "Ship at most one checkpoint per this many steps; 0 ships every verified L1 "
            "checkpoint (subject to everySeconds)."
        ),
    )
    every_seconds: Seconds = Field(
        default=0, description="Ship at most one checkpoint per this many seconds; 0: no limit."
    )
    keep: int = Field(
        default=DEFAULT_REMOTE_KEEP, ge=1, le=MAX_KEEP, description="Checkpoints kept in the layer."
    )
    credentials_secret: SecretRef | None = Field(
        default=None,
        description=(
            "Secret with the credentials: s3 AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and "
            "optionally AWS_ENDPOINT_URL (omit to use the pod's identity); hf token; ssh "
            "ssh-privatekey and optionally known_hosts and config (an OpenSSH client config: "
            "the HostName, Port and User of the URI's host). Required for hf:// and ssh://."
        ),
    )
    claim_name: DnsSubdomain | None = Field(
        default=None,
        description=(
            "PVC mounted into the agent and the restore step (never the trainer) at the URI's "
            "path, e.g. a network volume used as a backup destination. Required for file:// "
            "layers (without it the path would be inside the agent's container, lost with the "
            "pod); only for them."
        ),
    )


class Checkpoints(KubeModel):
    """Checkpoint cadence, integrity and layers (L1 local, then remote layers)."""

    object_rules = (
        ObjectRule(
            cel="self.everySteps > 0 || self.everySeconds > 0",
            message=(
                "at least one checkpoint cadence is required: set everySteps or everySeconds "
                "above 0"
            ),
            check=lambda s: s.every_steps > 0 or s.every_seconds > 0,
            field="everySteps",
        ),
    )

    every_steps: int = Field(
        default=DEFAULT_EVERY_STEPS,
        ge=0,
        le=MAX_STEPS,
        description="Save a checkpoint every this many steps; 0 turns the step cadence off.",
    )
    every_seconds: Seconds = Field(
        default=0,
        description="Save a checkpoint every this many seconds; 0 turns the time cadence off.",
    )
    size: Quantity | None = Field(
        default=None,
        description=(
            "Size of one full checkpoint, e.g. 35Gi; sizes local disk. Estimated from "
            "spec.model.parameters when omitted."
        ),
    )
    hash_algorithm: Annotated[HashAlgorithm, Lax] = Field(
        default=HashAlgorithm.XXH3,
        description="Hash that verifies every checkpoint file (xxh3 is the fastest).",
    )
    flush_timeout_seconds: PositiveSeconds = Field(
        default=DEFAULT_FLUSH_TIMEOUT_SECONDS,
        description=(
            "Before a deliberate pod deletion, wait up to this long for the newest L1 "
            "checkpoint to reach a remote layer."
        ),
    )
    l1: L1 = _sub(L1, "The local layer.")
    remote: Annotated[
        list[RemoteLayer],
        unique_by("name", "name", "remote layer names must be unique"),
    ] = Field(
        default_factory=list,
        max_length=MAX_REMOTE_LAYERS,
        description="Remote layers, each with a unique name.",
        json_schema_extra=map_list("name"),
    )


class Toleration(KubeModel):
    """A toleration of the training pod (Kubernetes semantics)."""

    object_rules = (
        ObjectRule(
            cel="self.operator == 'Exists' || has(self.key)",
            message="key is required unless operator is Exists",
            check=lambda s: s.operator is TolerationOperator.EXISTS or s.key is not None,
            field="key",
        ),
        ObjectRule(
            cel="self.operator != 'Exists' || !has(self.value) || self.value == ''",
            message="value must be empty when operator is Exists",
            check=lambda s: s.operator is not TolerationOperator.EXISTS or not s.value,
            field="value",
        ),
        ObjectRule(
            cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="tolerationSeconds needs effect: NoExecute",
            check=lambda s: s.toleration_seconds is None or s.effect is TaintEffect.NO_EXECUTE,
            field="tolerationSeconds",
        ),
    )

    key: QualifiedName | None = Field(default=None, description="Taint key; all keys if omitted.")
    operator: Annotated[TolerationOperator, Lax] = Field(
        default=TolerationOperator.EQUAL, description="Exists or Equal."
    )
    value: str | None = Field(
        default=None, max_length=MAX_LABEL_LENGTH, description="Taint value (operator Equal)."
    )
    effect: Annotated[TaintEffect, Lax] | None = Field(
        default=None, description="Taint effect; all effects if omitted."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, le=MAX_SECONDS, description="How long a NoExecute taint is tolerated."
    )


class Placement(KubeModel):
    """Where the run may go, and the guard that keeps its hot path off network volumes."""

    network_volumes: Annotated[NetworkVolumes, Lax] = Field(
        default=NetworkVolumes.FORBID,
        description=(
            "A network volume (NFS, CephFS, GlusterFS, MooseFS, network CSI drivers, any "
            "ReadWriteMany volume) on the hot path (data, L1): Forbid refuses the run, Warn "
            "reports it, Allow accepts it. Remote layers may always use network volumes."
        ),
    )
    node_selector: dict[
        str,
        Annotated[str, Field(max_length=MAX_LABEL_LENGTH)],
    ] = Field(
        default_factory=dict,
        max_length=MAX_NODE_SELECTOR,
        description="Node labels the training pod requires.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=MAX_TOLERATIONS,
        description="Tolerations of the training pod (trainguard's own taint is never tolerated).",
    )
    local_storage_class_name: DnsSubdomain | None = Field(
        default=None,
        description=(
            "StorageClass that provisions node-local PersistentVolumes (e.g. local-path); used "
            "for L1 localVolume storage when that names none, and trusted as local by the guard."
        ),
    )


class GhostMemory(KubeModel):
    """When driver-reported GPU memory that no live process accounts for is a verdict."""

    threshold_mib: int = Field(
        default=DEFAULT_GHOST_THRESHOLD_MIB,
        ge=1,
        le=10**7,
        alias="thresholdMiB",
        description=(
            "GhostMemory when the driver reports this many MiB more than the framework holds "
            "(or held by no live process)."
        ),
    )
    ratio: float = Field(
        default=DEFAULT_GHOST_RATIO,
        gt=1.0,
        le=100.0,
        description="GhostMemory when driver-used / framework-reserved exceeds this ratio.",
    )
    release_timeout_seconds: PositiveSeconds = Field(
        default=DEFAULT_GPU_RELEASE_SECONDS,
        description=(
            "After a death, GPU memory not released within this long means the node is sick: "
            "the run moves to another node."
        ),
    )


PY_SPY_REMOVED = (
    "pySpy was removed: the stacks of a hung trainer come from the harness's signal handler "
    "(faulthandler), which needs no SYS_PTRACE; only false is accepted"
)


def _off(value: bool) -> bool:
    return not value


class Monitor(KubeModel):
    """How the agent watches the trainer. Death is detected by absence, not by log age."""

    object_rules = (
        ObjectRule(
            cel="self.slowAfterSeconds < self.hangAfterSeconds",
            message="slowAfterSeconds must be less than hangAfterSeconds",
            check=lambda s: s.slow_after_seconds < s.hang_after_seconds,
            field="slowAfterSeconds",
        ),
        ObjectRule(
            cel="self.leaseDurationSeconds >= 2 * self.intervalSeconds",
            message=(
                "leaseDurationSeconds must be at least 2 x intervalSeconds, so one late renewal "
                "does not expire the Lease"
            ),
            check=lambda s: s.lease_duration_seconds >= 2 * s.interval_seconds,
            field="leaseDurationSeconds",
        ),
    )

    interval_seconds: int = Field(
        default=DEFAULT_INTERVAL_SECONDS,
        ge=1,
        le=60,
        description="Seconds between two looks at the trainer (and Lease renewals).",
    )
    hang_after_seconds: PositiveSeconds = Field(
        default=DEFAULT_HANG_AFTER_SECONDS,
        description="Hung: the process is alive but the step has not advanced for this long.",
    )
    hang_after_step_times: float | None = Field(
        default=None,
        ge=MIN_HANG_STEP_TIMES,
        le=MAX_HANG_STEP_TIMES,
        description=(
            "Hung sooner: also when, while training, the step has not advanced for this many "
            "times the trainer's slowest recent step (the harness measures its last "
            f"{STEP_TIME_WINDOW} steps), if that is shorter than hangAfterSeconds; never "
            f"below {MIN_ADAPTIVE_HANG_SECONDS} s or 3 x intervalSeconds (what the heartbeat "
            "and the agent's looks resolve). A save or a restore is judged by "
            "hangAfterSeconds alone. It holds from the trainer's sixth step, within "
            "startupGraceSeconds too. Work between two steps longer than this bound (an "
            "evaluation) reads as a hang: leave it unset for such a loop. Unset: "
            "hangAfterSeconds alone."
        ),
    )
    slow_after_seconds: PositiveSeconds = Field(
        default=DEFAULT_SLOW_AFTER_SECONDS,
        description="Slow: the log has not changed for this long (log age never means death).",
    )
    startup_grace_seconds: Seconds = Field(
        default=DEFAULT_STARTUP_GRACE_SECONDS,
        description=(
            "No Hung or Slow verdict before the first step or within this long of a start "
            "(compilation, restore)."
        ),
    )
    io_stuck_after_seconds: PositiveSeconds = Field(
        default=DEFAULT_IO_STUCK_AFTER_SECONDS,
        description="IOStuck: the trainer has been in uninterruptible I/O (D state) this long.",
    )
    lease_duration_seconds: PositiveSeconds = Field(
        default=DEFAULT_LEASE_DURATION_SECONDS,
        description="The run's Lease expires (agent or node gone) this long after a renewal.",
    )
    min_tokens_per_second: float | None = Field(
        default=None,
        ge=0.0,
        description="Slow: tokens/s below this rate. No rate check if omitted.",
    )
    ghost_memory: GhostMemory = _sub(GhostMemory, "Ghost GPU memory thresholds.")
    # Removed, kept only to refuse it with a reason. Every run stored before carries the old
    # default (false): it stays valid and in the spec hash, so the removal replaces no pod.
    py_spy: Annotated[bool, FieldRule(cel="!self", message=PY_SPY_REMOVED, check=_off)] | None = (
        Field(
            default=None,
            description=(
                "Removed: a hung trainer's stacks are written by the harness's signal handler "
                "(faulthandler, on SIGUSR1 from the supervisor) before it is killed, with no "
                "added capability; py-spy would need SYS_PTRACE, which the restricted Pod "
                "Security profile forbids. false, the former default, is accepted and does "
                "nothing."
            ),
        )
    )


class Backoff(KubeModel):
    """Exponential delay between restarts."""

    object_rules = (
        ObjectRule(
            cel="self.initialSeconds <= self.maxSeconds",
            message="initialSeconds must not exceed maxSeconds",
            check=lambda s: s.initial_seconds <= s.max_seconds,
            field="initialSeconds",
        ),
    )

    initial_seconds: Seconds = Field(
        default=DEFAULT_BACKOFF_INITIAL_SECONDS, description="Delay before the first restart."
    )
    max_seconds: Seconds = Field(
        default=DEFAULT_BACKOFF_MAX_SECONDS, description="Cap of the doubling delay."
    )
    reset_after_seconds: PositiveSeconds = Field(
        default=DEFAULT_BACKOFF_RESET_AFTER_SECONDS,
        description=(
            "A run that ran this long after a restart before it failed again starts the "
            "delay over at initialSeconds (like the kubelet's 10 minutes for a crash loop)."
        ),
    )


class Recovery(KubeModel):
    """The escalation ladder: restart in place, then reschedule, then give up."""

    object_rules = (
        ObjectRule(
            cel="self.inPlaceRestarts <= self.maxRestarts",
            message="inPlaceRestarts must not exceed maxRestarts",
            check=lambda s: s.in_place_restarts <= s.max_restarts,
            field="inPlaceRestarts",
        ),
    )

    in_place_restarts: int = Field(
        default=DEFAULT_IN_PLACE_RESTARTS,
        ge=0,
        le=MAX_RESTARTS,
        description=(
            "Restarts on the same node (fast, L1 intact) after a Dead or Hung verdict before "
            "the run is rescheduled to another node."
        ),
    )
    max_restarts: int = Field(
        default=DEFAULT_MAX_RESTARTS,
        ge=0,
        le=MAX_RESTARTS,
        description=(
            "Restarts in a row without progress before the run is Failed: a failure after a "
            "newer verified checkpoint than at the previous failure starts the count again."
        ),
    )
    backoff: Backoff = _sub(Backoff, "Delay between restarts.")
    same_step_window: int = Field(
        default=DEFAULT_SAME_STEP_WINDOW,
        ge=0,
        le=MAX_STEPS,
        description=(
            "A death within this many steps of the previous one is a repeated failure "
            "(condition RepeatedFailureAtStep)."
        ),
    )
    on_repeated_failure: Annotated[OnRepeatedFailure, Lax] = Field(
        default=OnRepeatedFailure.STOP,
        description="Stop the run (Failed) or Continue restarting after a repeated failure.",
    )


def _l1_storage_class_known(spec: TrainingRunSpec) -> bool:
    local = spec.checkpoints.l1.storage.local_volume
    return (
        local is None
        or local.storage_class_name is not None
        or spec.placement.local_storage_class_name is not None
    )


def _mounts_apart(spec: TrainingRunSpec) -> bool:
    if spec.data is None:
        return True
    data, l1 = spec.data.mount_path, spec.checkpoints.l1.mount_path
    return data != l1 and not data.startswith(l1 + "/") and not l1.startswith(data + "/")


class TrainingRunSpec(KubeModel):
    """A long training run that trainguard keeps alive."""

    object_rules = (
        ObjectRule(
            cel=(
                "!has(self.checkpoints.l1.storage.localVolume) || "
                "has(self.checkpoints.l1.storage.localVolume.storageClassName) || "
                "has(self.placement.localStorageClassName)"
            ),
            message=(
                "L1 localVolume needs a storageClassName, here or in "
                "spec.placement.localStorageClassName"
            ),
            check=_l1_storage_class_known,
            field="checkpoints.l1.storage.localVolume",
        ),
        ObjectRule(
            cel=(
                "!has(self.data) || (self.data.mountPath != self.checkpoints.l1.mountPath && "
                "!self.data.mountPath.startsWith(self.checkpoints.l1.mountPath + '/') && "
                "!self.checkpoints.l1.mountPath.startsWith(self.data.mountPath + '/'))"
            ),
            message=(
                "data.mountPath and checkpoints.l1.mountPath must be separate directories, "
                "neither inside the other"
            ),
            check=_mounts_apart,
            field="data.mountPath",
        ),
    )

    trainer: Trainer = Field(description="The training container.")
    model: Model | None = Field(default=None, description="What is being trained.")
    data: Data | None = Field(
        default=None, description="Training data to stage onto local disk (or mount)."
    )
    checkpoints: Checkpoints = _sub(Checkpoints, "Checkpoint cadence, integrity and layers.")
    placement: Placement = _sub(Placement, "Node selection and the network-volume guard.")
    monitor: Monitor = _sub(Monitor, "Thresholds of the agent's verdicts.")
    recovery: Recovery = _sub(Recovery, "Restart and reschedule policy.")
    suspend: bool = Field(
        default=False,
        description=(
            "true stops the run after flushing its newest checkpoint to a remote layer; false "
            "resumes it from the newest valid checkpoint."
        ),
    )
