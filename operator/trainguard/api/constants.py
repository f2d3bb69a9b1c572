"""Names every trainguard component shares: API coordinates, keys, condition types and reasons.

Spell none of these strings elsewhere; import them. Keys carry the `trainguard.dev/` prefix
(DESIGN.md, "Names"). Reasons are CamelCase, as Kubernetes expects in conditions and Events.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

# API coordinates.
GROUP = "trainguard.dev"
VERSION = "v1alpha1"
# Spelled out (not composed) so that type checkers see literal types.
API_VERSION: Final = "trainguard.dev/v1alpha1"
KIND: Final = "TrainingRun"
LIST_KIND = "TrainingRunList"
PLURAL = "trainingruns"
SINGULAR = "trainingrun"
SHORT_NAMES = ("tr",)
CATEGORIES = ("trainguard",)
CRD_NAME = f"{PLURAL}.{GROUP}"

# Members of one gang at most (`spec.trainer.nodes`, `status.members`).
MAX_NODES = 4096

# Prefix of every label, annotation, finalizer and taint key trainguard owns.
PREFIX = f"{GROUP}/"

# Labels on every child of a run (pods, Lease, RBAC), so indexes and selectors find them.
LABEL_RUN = f"{PREFIX}run"
LABEL_ATTEMPT = f"{PREFIX}attempt"
LABEL_COMPONENT = f"{PREFIX}component"
# A gang member's index (its node rank), on its pods and its heartbeat Lease; none on a one-pod
# run's children.
LABEL_MEMBER = f"{PREFIX}member"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "trainguard"

# Values of LABEL_COMPONENT.
COMPONENT_TRAINING_POD = "training-pod"
# The headless Service that gives a gang's members their stable names.
COMPONENT_GANG = "gang"
COMPONENT_HEARTBEAT = "heartbeat"
COMPONENT_RBAC = "rbac"
COMPONENT_NODE_CHECK = "node-check"
# The ConfigMap of the variables all of a run's pods share (`trainguard.contract.env`).
COMPONENT_POD_ENV = "pod-env"

# Annotations on the run's heartbeat Lease, written by the agent at every renewal.
ANNOTATION_VERDICT = f"{PREFIX}verdict"
ANNOTATION_EVIDENCE = f"{PREFIX}evidence"
# Key of the evidence JSON naming a cause narrower than the verdict (GPUMemoryNotReleased).
EVIDENCE_CAUSE = "cause"
ANNOTATION_STEP = f"{PREFIX}step"
ANNOTATION_SAVED_STEP = f"{PREFIX}saved-step"
# The agent's shipping report per remote layer (JSON), and what the restore step did.
ANNOTATION_LAYERS = f"{PREFIX}layers"
ANNOTATION_RESTORED = f"{PREFIX}restored"
# The init steps' summaries (JSON, the fields of status.preflight / status.staging).
ANNOTATION_PREFLIGHT = f"{PREFIX}preflight"
ANNOTATION_STAGING = f"{PREFIX}staging"
# The invalid checkpoints the agent told of: per layer how many, and the last one (JSON,
# `trainguard.contract.findings`).
ANNOTATION_INVALID_CHECKPOINTS = f"{PREFIX}invalid-checkpoints"
# When the agent's current verdict began (its clock, RFC 3339): a failure verdict with a new
# start is a new failure, even when the operator never saw the Healthy in between.
ANNOTATION_VERDICT_SINCE = f"{PREFIX}verdict-since"
# A gang's restart generation: written by the operator on every member's Lease (the generation
# every member's ranks must run), and by each member's agent (the generation its verdict is
# about: the failed launch's for Dead, the running launch's otherwise). `policies/gang.py`.
ANNOTATION_GANG_GENERATION = f"{PREFIX}gang-generation"
ANNOTATION_VERDICT_GENERATION = f"{PREFIX}verdict-generation"
# Hash of the spec a pod was built from: a changed hash means the pod is out of date.
ANNOTATION_SPEC_HASH = f"{PREFIX}spec-hash"
# The env ConfigMap a pod's containers take their shared variables from (`build.envconfig`).
ANNOTATION_ENV_CONFIG = f"{PREFIX}env-config"
# On a node: why and when trainguard tainted it (the taint itself carries only the reason).
ANNOTATION_UNHEALTHY_SINCE = f"{PREFIX}unhealthy-since"

# Finalizer on a run: its newest L1 checkpoint is flushed to a remote layer before deletion.
FINALIZER = f"{PREFIX}checkpoint-flush"

# Taint on a node found unhealthy: `trainguard.dev/unhealthy=<Reason>:NoSchedule`.
TAINT_UNHEALTHY = f"{PREFIX}unhealthy"
TAINT_EFFECT = "NoSchedule"
# What trainguard holds of a node (`trainguard.operator.policies.nodehealth`): the label
# `suspect` or `unhealthy`, why (who reported what), and its node checks.
LABEL_NODE_HEALTH = f"{PREFIX}node-health"
ANNOTATION_NODE_REASON = f"{PREFIX}unhealthy-reason"
ANNOTATION_NODE_LAST_CHECK = f"{PREFIX}last-check"
ANNOTATION_NODE_LAST_CHECK_TIME = f"{PREFIX}last-check-time"
ANNOTATION_NODE_FAILED_CHECKS = f"{PREFIX}failed-checks"
ANNOTATION_NODE_CHECKED_BOOT_ID = f"{PREFIX}checked-boot-id"
# A node check's pod: the node it checks.
ANNOTATION_CHECKED_NODE = f"{PREFIX}checked-node"

# Status name of the local checkpoint layer (remote layer names may not take it).
L1_LAYER = "l1"
# Status name of the checkpoint layer in pod memory (`trainguard.contract.env.L0_DIR`): it
# survives a trainer's death, never the pod, and is never shipped.
L0_LAYER = "l0"

# Default GPU resource name requested for the trainer.
GPU_RESOURCE = "nvidia.com/gpu"

# Keys the agent reads from a remote layer's credentials Secret, per URI scheme.
SECRET_KEY_HF_TOKEN = "token"
SECRET_KEY_SSH_PRIVATE_KEY = "ssh-privatekey"
SECRET_KEY_SSH_KNOWN_HOSTS = "known_hosts"
# An OpenSSH client config: the HostName, Port and User of the URI's host (split DNS, a port).
SECRET_KEY_SSH_CONFIG = "config"
SECRET_KEY_S3_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
SECRET_KEY_S3_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
SECRET_KEY_S3_ENDPOINT_URL = "AWS_ENDPOINT_URL"


class UriScheme(StrEnum):
    """Schemes of data sources and remote checkpoint layers."""

    FILE = "file"
    S3 = "s3"
    HF = "hf"
    SSH = "ssh"


class NetworkVolumes(StrEnum):
    """What the placement guard does with a network volume on the hot path."""

    FORBID = "Forbid"
    WARN = "Warn"
    ALLOW = "Allow"


class HashAlgorithm(StrEnum):
    """Checkpoint integrity hash, recorded by name in every manifest."""

    XXH3 = "xxh3"
    BLAKE3 = "blake3"
    SHA256 = "sha256"


class Contents(StrEnum):
    """What a checkpoint holds: everything needed to resume, or the model weights only."""

    FULL = "full"
    WEIGHTS = "weights"


class OnRepeatedFailure(StrEnum):
    """What to do when a run dies again near the same step."""

    STOP = "Stop"
    CONTINUE = "Continue"


class TolerationOperator(StrEnum):
    """Operators of a Kubernetes toleration."""

    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    """Effects of a Kubernetes taint."""

    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class ConditionStatus(StrEnum):
    """Status of a condition (metav1.ConditionStatus)."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """Condition types of a TrainingRun."""

    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    SUSPENDED = "Suspended"
    COMPLETE = "Complete"
    FAILED = "Failed"
    PREFLIGHT = "Preflight"
    DATA_STAGED = "DataStaged"
    RESTORED = "Restored"
    REPEATED_FAILURE_AT_STEP = "RepeatedFailureAtStep"


class Phase(StrEnum):
    """The one-word summary in `status.phase`, derived from the conditions."""

    PENDING = "Pending"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    SUSPENDED = "Suspended"
    COMPLETED = "Completed"
    FAILED = "Failed"


class Verdict(StrEnum):
    """The agent's classification of the trainer, renewed with the Lease."""

    HEALTHY = "Healthy"
    SLOW = "Slow"
    HUNG = "Hung"
    DEAD = "Dead"
    GHOST_MEMORY = "GhostMemory"
    IO_STUCK = "IOStuck"


class ShippingState(StrEnum):
    """State of the newest upload to a remote layer."""

    PENDING = "Pending"
    UPLOADING = "Uploading"
    VERIFIED = "Verified"
    FAILED = "Failed"


class FoundBy(StrEnum):
    """The check that found a checkpoint invalid (`trainguard.contract.findings`)."""

    RESTORE = "Restore"  # the restore init step, choosing what to resume from
    SHIPPING = "Shipping"  # the agent's shipper: before an upload, after it, or its keep-N
    SCAN = "Scan"  # the trainer harness's L1 scans: resume, keep-last-N, a save of the same step


class StagingPhase(StrEnum):
    """Phase of the stage-data init step, as it reports it."""

    LISTING = "Listing"
    HASHING = "Hashing"
    COPYING = "Copying"
    COMPLETE = "Complete"
    SKIPPED = "Skipped"
    FAILED = "Failed"


class CheckResult(StrEnum):
    """Outcome of one preflight check."""

    PASS = "pass"
    FAIL = "fail"
    SKIPPED = "skipped"


class Reason(StrEnum):
    """CamelCase reasons of conditions, Events, failures and node taints."""

    # Lifecycle.
    CREATED = "Created"
    SCHEDULING = "Scheduling"
    PREFLIGHT_PASSED = "PreflightPassed"
    PREFLIGHT_FAILED = "PreflightFailed"
    STAGING_DATA = "StagingData"
    DATA_STAGED = "DataStaged"
    DATA_STAGING_SKIPPED = "DataStagingSkipped"
    STAGING_FAILED = "StagingFailed"
    RESTORING = "Restoring"
    RESTORED = "Restored"
    NOTHING_TO_RESTORE = "NothingToRestore"
    RESTORE_FAILED = "RestoreFailed"
    TRAINING = "Training"
    COMPLETED = "Completed"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    # Spec and placement.
    INVALID_SPEC = "InvalidSpec"
    NETWORK_VOLUME_FORBIDDEN = "NetworkVolumeForbidden"
    NETWORK_VOLUME_WARNING = "NetworkVolumeWarning"
    SPEC_CHANGED = "SpecChanged"
    # Inputs the pod needs and cannot get (`policies/inputs.py`): a user's fix lets it go on.
    IMAGE_PULL_FAILED = "ImagePullFailed"
    SECRET_NOT_FOUND = "SecretNotFound"
    CLAIM_NOT_FOUND = "ClaimNotFound"
    DATA_SOURCE_UNREACHABLE = "DataSourceUnreachable"
    # Failures (also `status.lastFailure.cause`); the verdicts are causes too.
    LEASE_EXPIRED = "LeaseExpired"
    NODE_LOST = "NodeLost"
    POD_FAILED = "PodFailed"
    POD_DELETED = "PodDeleted"
    GPU_MEMORY_NOT_RELEASED = "GPUMemoryNotReleased"
    # Actions of the escalation ladder.
    RESTARTING_IN_PLACE = "RestartingInPlace"
    RESCHEDULING = "Rescheduling"
    NODE_EXCLUDED = "NodeExcluded"
    NODE_TAINTED = "NodeTainted"
    # Node health (Events on the Node).
    NODE_SUSPECTED = "NodeSuspected"
    NODE_CHECK_PASSED = "NodeCheckPassed"
    NODE_CHECK_FAILED = "NodeCheckFailed"
    NODE_CHECK_NOT_RUN = "NodeCheckNotRun"
    NODE_UNTAINTED = "NodeUntainted"
    FLUSHING_CHECKPOINT = "FlushingCheckpoint"
    FLUSH_TIMED_OUT = "FlushTimedOut"
    REPEATED_FAILURE_AT_STEP = "RepeatedFailureAtStep"
    MAX_RESTARTS_EXCEEDED = "MaxRestartsExceeded"
    # A gang's members told to restart their ranks together (`status.gangRestart`).
    GANG_RESTART = "GangRestart"
    # Checkpoints.
    CHECKPOINT_SAVED = "CheckpointSaved"
    CHECKPOINT_SHIPPED = "CheckpointShipped"
    INVALID_CHECKPOINT = "InvalidCheckpoint"
    SHIPPING_FAILED = "ShippingFailed"
    # Monitoring.
    HEALTHY = "Healthy"
    SLOW = "Slow"
    HUNG = "Hung"
    DEAD = "Dead"
    GHOST_MEMORY = "GhostMemory"
    IO_STUCK = "IOStuck"
