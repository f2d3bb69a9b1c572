"""The TrainingRun status: what the operator observed, as `kubectl get tr` and Argo CD see it.

Only the operator writes it. Conditions have the metav1.Condition shape; `phase` is derived
from them (trainguard.operator.conditions). Times serialize as RFC 3339 UTC with second
precision, like metav1.Time.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AwareDatetime, ConfigDict, Field, PlainSerializer

from trainguard.api.base import KubeModel, map_list
from trainguard.api.constants import (
    MAX_NODES,
    CheckResult,
    ConditionStatus,
    Contents,
    FoundBy,
    Phase,
    ShippingState,
    StagingPhase,
    Verdict,
)
from trainguard.api.types import MAX_LABEL_LENGTH, MAX_NAME_LENGTH

MAX_CONDITIONS = 32
MAX_EXCLUDED_NODES = 256
MAX_LAYERS = 16
MAX_FENCES = 64
# A finding's file and reason: the agent cuts them far shorter (`trainguard.contract.findings`).
MAX_FINDING_TEXT = 1024
MAX_MESSAGE_LENGTH = 32768
MAX_REASON_LENGTH = 1024
# metav1.Condition's patterns and bounds.
CONDITION_TYPE_RE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
MAX_CONDITION_TYPE_LENGTH = 316
REASON_RE = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
RFC3339 = "%Y-%m-%dT%H:%M:%SZ"


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(RFC3339)


Timestamp = Annotated[AwareDatetime, PlainSerializer(_rfc3339, return_type=str, when_used="json")]
ReasonText = Annotated[str, Field(min_length=1, max_length=MAX_REASON_LENGTH, pattern=REASON_RE)]
Message = Annotated[str, Field(max_length=MAX_MESSAGE_LENGTH)]
NodeName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]


class StatusModel(KubeModel):
    """Base of status models: parsed from the apiserver's JSON, so times arrive as strings."""

    model_config = ConfigDict(strict=False)


class Condition(StatusModel):
    """One aspect of the run's state (metav1.Condition)."""

    type: str = Field(
        min_length=1,
        max_length=MAX_CONDITION_TYPE_LENGTH,
        pattern=CONDITION_TYPE_RE,
        description="Condition type, e.g. Ready, Progressing, Degraded, RepeatedFailureAtStep.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was set for."
    )
    last_transition_time: Timestamp = Field(description="When status last changed.")
    reason: ReasonText = Field(description="CamelCase reason of the last transition.")
    message: Message = Field(description="Human-readable details.")


class ExcludedNode(StatusModel):
    """A node the run will not be placed on again, and why."""

    node: NodeName = Field(description="Node name.")
    reason: ReasonText = Field(
        description="Why it was excluded, e.g. GhostMemory, IOStuck, NodeLost."
    )
    time: Timestamp = Field(description="When it was excluded.")


class Shipping(StatusModel):
    """The newest upload to a remote layer."""

    state: ShippingState = Field(description="Pending, Uploading, Verified or Failed.")
    step: int = Field(ge=0, description="Step of the checkpoint being shipped.")
    bytes_done: int | None = Field(default=None, ge=0, description="Bytes uploaded so far.")
    bytes_total: int | None = Field(default=None, ge=0, description="Bytes to upload.")
    time: Timestamp | None = Field(default=None, description="When the state last changed.")
    message: Message | None = Field(default=None, description="Error of a Failed upload.")
    shipped: int | None = Field(
        default=None,
        ge=0,
        description="Checkpoints this attempt's agent shipped to the layer and verified there.",
    )
    skipped: int | None = Field(
        default=None,
        ge=0,
        description="Checkpoints this attempt's agent did not ship to the layer because a newer "
        "one superseded them while the layer was busy or waiting to retry (the layer ships the "
        "newest checkpoint it can finish).",
    )


class LayerCheckpoint(StatusModel):
    """The newest checkpoint of one layer."""

    layer: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_LENGTH)] = Field(
        description="Layer name: l1, or a remote layer's name."
    )
    step: int | None = Field(default=None, ge=0, description="Step of its newest checkpoint.")
    time: Timestamp | None = Field(
        default=None,
        description="When the operator first saw that checkpoint verified on the layer.",
    )
    verified: bool = Field(
        default=False, description="Whether every file matched its manifest's size and hash."
    )
    contents: Contents | None = Field(default=None, description="full or weights.")
    shipping: Shipping | None = Field(
        default=None, description="Upload in progress or last finished (remote layers)."
    )


class Fence(StatusModel):
    """A superseded attempt and the newest checkpoint it reported: its limit in the lineage."""

    attempt: int = Field(ge=1, description="The superseded attempt.")
    step: int | None = Field(
        default=None,
        ge=0,
        description="Newest checkpoint step it reported on a remote layer. Restore uses its "
        "checkpoints up to this step only; none: it reported none, and none is used.",
    )
    time: Timestamp = Field(description="When the next attempt was started.")


LayerName = Annotated[str, Field(min_length=1, max_length=MAX_LABEL_LENGTH)]
FindingText = Annotated[str, Field(min_length=1, max_length=MAX_FINDING_TEXT)]


class InvalidCheckpoint(StatusModel):
    """A checkpoint found invalid: on which layer, what is wrong with it, which check found it.

    It is skipped (never restored from) and kept for inspection, never deleted.
    """

    layer: LayerName = Field(description="Layer name: l1, or a remote layer's name.")
    step: int | None = Field(default=None, ge=0, description="Step of the checkpoint.")
    file: FindingText | None = Field(
        default=None,
        description="File within the checkpoint that is wrong; none: the checkpoint as a whole "
        "(e.g. its manifest missing).",
    )
    reason: FindingText = Field(
        description="What is wrong, e.g. xxh3-128 hash mismatch, size 10 != 12 in the manifest, "
        "missing MANIFEST.json."
    )
    found: FoundBy = Field(
        description="The check that found it: Restore (the restore step), Shipping (the agent, "
        "before or after an upload, or its keep-N on the layer) or Scan (the trainer's L1 "
        "scans: resume, keep-last-N, a save of the same step)."
    )
    time: Timestamp = Field(description="When it was found (the pod's clock).")
    attempt: int | None = Field(default=None, ge=1, description="Attempt whose pod found it.")


class InvalidCheckpointCount(StatusModel):
    """How many invalid checkpoints an attempt's agent told of on one layer."""

    layer: LayerName = Field(description="Layer name: l1, or a remote layer's name.")
    attempt: int = Field(ge=1, description="The attempt whose agent told of them.")
    count: int = Field(
        ge=0,
        description="Invalid checkpoints found on the layer during the attempt (each told once, "
        "with a Warning Event InvalidCheckpoint).",
    )


class Restore(StatusModel):
    """The checkpoint the trainer last resumed from, and its layer."""

    layer: LayerName | None = Field(
        default=None,
        description="Layer it came from: a remote layer's name or l1 (the restore step, at a "
        "pod's start), l0 or l1 (a trainer restarted in place); none: a fresh start.",
    )
    step: int | None = Field(default=None, ge=0, description="Step of the checkpoint.")
    attempt: int | None = Field(default=None, ge=1, description="Attempt whose pod resumed.")
    time: Timestamp | None = Field(default=None, description="When it resumed (the pod's clock).")
    message: Message = Field(description="What the pod reported, in one line.")


class Failure(StatusModel):
    """The last failure of the run, with its evidence."""

    cause: ReasonText = Field(
        description="Verdict or cause: Dead, Hung, GhostMemory, IOStuck, LeaseExpired, ..."
    )
    step: int | None = Field(default=None, ge=0, description="Step the trainer had reached.")
    time: Timestamp = Field(description="When the failure was detected.")
    node: NodeName | None = Field(default=None, description="Node the run was on.")
    attempt: int | None = Field(default=None, ge=1, description="Attempt that failed.")
    message: Message = Field(description="Evidence: what the agent or operator saw.")
    since: Timestamp | None = Field(
        default=None,
        description="When the agent's failure verdict began (the agent's clock): a new start "
        "is a new failure.",
    )
    checkpoint_step: int | None = Field(
        default=None,
        ge=0,
        description="Newest verified checkpoint step when the failure was detected: a newer "
        "one at the next failure is progress.",
    )


class Staging(StatusModel):
    """Data staging of an attempt (the stage-data init step): progress, then the outcome."""

    attempt: int | None = Field(default=None, ge=1, description="Attempt whose pod staged.")
    phase: StagingPhase = Field(
        description="Listing, Hashing, Copying, then Complete, Skipped or Failed."
    )
    files_done: int = Field(default=0, ge=0, description="Files of the phase done.")
    files_total: int = Field(default=0, ge=0, description="Files of the phase.")
    bytes_done: int = Field(default=0, ge=0, description="Bytes of the phase done.")
    bytes_total: int = Field(default=0, ge=0, description="Bytes of the phase.")
    bytes_per_second: float | None = Field(
        default=None, ge=0.0, description="Rate of the phase so far."
    )
    eta_seconds: float | None = Field(
        default=None, ge=0.0, description="Estimated seconds left in the phase."
    )
    copied: int | None = Field(default=None, ge=0, description="Files copied from the source.")
    recopies: int | None = Field(
        default=None, ge=0, description="Copies repeated after a verification mismatch."
    )
    message: Message | None = Field(default=None, description="Error of a failed staging.")


class Preflight(StatusModel):
    """The preflight checks of an attempt: storage integrity and bandwidth, space, GPU."""

    attempt: int | None = Field(default=None, ge=1, description="Attempt whose pod checked.")
    node: NodeName | None = Field(default=None, description="Node that was checked.")
    passed: bool = Field(description="Whether every check passed.")
    failure: ReasonText | None = Field(
        default=None,
        description="First failure: StorageCorrupt, StorageError, InsufficientSpace, "
        "GpuMemoryHeld or StorageSlow.",
    )
    write_mbps: float | None = Field(
        default=None, ge=0.0, description="Slowest write bandwidth of a test file, MB/s."
    )
    read_mbps: float | None = Field(
        default=None, ge=0.0, description="Slowest read-back bandwidth of a test file, MB/s."
    )
    free_bytes: int | None = Field(
        default=None, ge=0, description="Free space of the tightest filesystem."
    )
    need_bytes: int | None = Field(
        default=None, ge=0, description="Space that filesystem needs (data, checkpoints, margin)."
    )
    gpu: CheckResult | None = Field(default=None, description="GPU check: pass, fail, skipped.")
    gpu_used_mib: float | None = Field(
        default=None, ge=0.0, description="GPU memory in use before training, MiB."
    )
    gpu_total_mib: float | None = Field(default=None, ge=0.0, description="GPU memory, MiB.")
    message: Message = Field(description="The failed checks, else every check, in one line.")


class Member(StatusModel):
    """One member of a gang (`spec.trainer.nodes` > 1) in the current attempt."""

    index: int = Field(ge=0, lt=MAX_NODES, description="Member index: its node rank.")
    pod: NodeName | None = Field(default=None, description="Its pod; none while it has none.")
    node: NodeName | None = Field(default=None, description="Node the pod is on.")
    phase: Annotated[str, Field(max_length=MAX_LABEL_LENGTH)] | None = Field(
        default=None, description="The pod's phase (Pending, Running, ...)."
    )
    verdict: Verdict | None = Field(
        default=None, description="Its agent's latest verdict; none until it renews its Lease."
    )
    generation: int | None = Field(
        default=None,
        ge=0,
        description="The gang restart generation its agent's verdict is about: its running "
        "ranks', or for Dead the launch that failed; none until it renews its Lease.",
    )


class GangRestart(StatusModel):
    """The last restart of a whole gang: the generation every member was told, and its cause."""

    generation: int = Field(
        ge=1,
        description="The gang's restart generation: a member whose ranks run an older one "
        "restarts them at once.",
    )
    member: int = Field(ge=0, lt=MAX_NODES, description="The member whose failure caused it.")
    cause: ReasonText = Field(
        description="Dead, Hung (a rank's), NodeLost, GhostMemory, IOStuck or PodFailed."
    )
    time: Timestamp = Field(description="When the operator ordered it.")
    message: Message = Field(description="What happened, in one line.")


class TrainingRunStatus(StatusModel):
    """Observed state of a TrainingRun, written by the operator only."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the status was computed for."
    )
    phase: Phase | None = Field(
        default=None,
        description="Pending, Running, Recovering, Suspended, Completed or Failed.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Ready, Progressing, Degraded, Suspended, Complete, Failed and more.",
        json_schema_extra=map_list("type"),
    )
    verdict: Verdict | None = Field(
        default=None,
        description="The current attempt's latest verdict; none until its agent renews the Lease.",
    )
    step: int | None = Field(default=None, ge=0, description="Latest training step.")
    tokens_per_second: float | None = Field(
        default=None, ge=0.0, description="Latest training throughput."
    )
    node: NodeName | None = Field(default=None, description="Node of the current attempt.")
    attempt: int | None = Field(
        default=None, ge=1, description="Current attempt (a new pod is a new attempt)."
    )
    restarts: int = Field(default=0, ge=0, description="Restarts so far, of any kind.")
    in_place_restarts: int = Field(
        default=0, ge=0, description="Restarts in place since the run last moved to a node."
    )
    restarts_without_progress: int = Field(
        default=0,
        ge=0,
        description="Restarts since the run last made progress (a verified checkpoint newer "
        "than the newest at the failure before): counted against recovery.maxRestarts.",
    )
    backoff_restarts: int = Field(
        default=0,
        ge=0,
        description="Restarts since the run last ran recovery.backoff.resetAfterSeconds after a "
        "restart before failing: the n-th waits initialSeconds * 2^(n-1), up to maxSeconds.",
    )
    checkpoint_step: int | None = Field(
        default=None, ge=0, description="Newest verified checkpoint step across all layers."
    )
    checkpoints: list[LayerCheckpoint] = Field(
        default_factory=list,
        max_length=MAX_LAYERS,
        description="Newest checkpoint per layer, and shipping progress.",
        json_schema_extra=map_list("layer"),
    )
    excluded_nodes: list[ExcludedNode] = Field(
        default_factory=list,
        max_length=MAX_EXCLUDED_NODES,
        description="Nodes the run will not be placed on again.",
        json_schema_extra=map_list("node"),
    )
    fences: list[Fence] = Field(
        default_factory=list,
        max_length=MAX_FENCES,
        description="Superseded attempts and the newest checkpoint each reported: what they "
        "ship later (a pod on a partitioned node) is never restored.",
        json_schema_extra=map_list("attempt"),
    )
    members: list[Member] = Field(
        default_factory=list,
        max_length=MAX_NODES,
        description="A gang's members in the current attempt, by index (empty for one pod).",
        json_schema_extra=map_list("index"),
    )
    members_ready: Annotated[str, Field(max_length=MAX_LABEL_LENGTH)] | None = Field(
        default=None,
        description="A gang's members running / members, e.g. 3/4 (none for one pod).",
    )
    gang_retry_time: Timestamp | None = Field(
        default=None,
        description="A gang whose members could not all be placed was deleted whole; its next "
        "attempt is not created before this time.",
    )
    gang_restart: GangRestart | None = Field(
        default=None,
        description="A gang's last restart of every member's ranks, ordered by the operator "
        "(none before the first).",
    )
    last_failure: Failure | None = Field(default=None, description="The last failure.")
    last_restore: Restore | None = Field(
        default=None,
        description="The last resume: at a pod's start (the restore step) or after a restart "
        "in place (the trainer, e.g. from l0), with the layer and step it came from.",
    )
    last_invalid_checkpoint: InvalidCheckpoint | None = Field(
        default=None, description="The last checkpoint found invalid, of any attempt."
    )
    invalid_checkpoints: list[InvalidCheckpointCount] = Field(
        default_factory=list,
        max_length=MAX_LAYERS,
        description="Invalid checkpoints the current attempt found, per layer.",
        json_schema_extra=map_list("layer"),
    )
    preflight: Preflight | None = Field(
        default=None, description="The newest preflight result, with its figures."
    )
    staging: Staging | None = Field(
        default=None, description="Data staging of the newest attempt that staged (live)."
    )
    start_time: Timestamp | None = Field(default=None, description="When training first started.")
    completion_time: Timestamp | None = Field(
        default=None, description="When the run completed or failed."
    )
