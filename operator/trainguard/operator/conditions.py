"""Status arithmetic, pure: conditions in metav1.Condition shape, the derived phase, events.

Each reconcile cycle summarises the run in one `RunState` (a CamelCase reason, a message
and the truth of each standard condition). `advance()` turns the previous status and that
state into the next status, keeping `lastTransitionTime` of conditions whose status did not
change; `changed()` says whether it must be written; `transition_events()` lists the Events
to send after the write (one per change of the state's reason).

The init steps have conditions of their own, set from `status.preflight` / `status.staging`
(`step_conditions`): `Preflight` (True, PreflightPassed, with the figures; False,
PreflightFailed, with the failed checks) and `DataStaged` (False, StagingData, with the
progress while staging runs; True, DataStaged or DataStagingSkipped; False, StagingFailed).
`step_events` tells each new outcome once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from trainguard.api import Condition, TrainingRunStatus
from trainguard.api.constants import (
    L0_LAYER,
    ConditionStatus,
    ConditionType,
    Phase,
    Reason,
    StagingPhase,
    Verdict,
)
from trainguard.api.quantity import human_bytes
from trainguard.api.status import (
    InvalidCheckpoint,
    InvalidCheckpointCount,
    LayerCheckpoint,
    Member,
    Preflight,
    Restore,
    Staging,
)

# Events carry messages under 1 KiB of UTF-8 (kubectl describe stays readable); conditions
# may hold more, but the apiserver's bound is far above anything useful.
MAX_EVENT_BYTES = 1000
MAX_CONDITION_MESSAGE = 4000
ELLIPSIS = "..."

# The condition types every cycle sets, and the one whose reason is the state's reason.
STANDARD_CONDITIONS = (
    ConditionType.READY,
    ConditionType.PROGRESSING,
    ConditionType.DEGRADED,
    ConditionType.SUSPENDED,
    ConditionType.COMPLETE,
    ConditionType.FAILED,
)
STATE_CONDITION = ConditionType.PROGRESSING


@dataclass(frozen=True)
class RunState:
    """What one cycle concluded: a reason and message, and which conditions hold."""

    reason: str
    message: str
    ready: bool = False
    progressing: bool = False
    degraded: bool = False
    suspended: bool = False
    complete: bool = False
    failed: bool = False
    warning: bool = False

    def truth(self) -> dict[ConditionType, bool]:
        """Each standard condition type and whether it holds."""
        return {
            ConditionType.READY: self.ready,
            ConditionType.PROGRESSING: self.progressing,
            ConditionType.DEGRADED: self.degraded,
            ConditionType.SUSPENDED: self.suspended,
            ConditionType.COMPLETE: self.complete,
            ConditionType.FAILED: self.failed,
        }


@dataclass(frozen=True)
class Observed:
    """Status fields observed this cycle besides the conditions."""

    attempt: int | None = None
    node: str | None = None
    restarts: int = 0
    started: bool = False
    # The agent's signals; None keeps what the status holds (no Lease read this cycle, or not
    # renewed yet by this attempt's agent), but a verdict only within one attempt (`advance`).
    verdict: Verdict | None = None
    step: int | None = None
    checkpoint_step: int | None = None
    # The agent's shipping report per remote layer; merged into what the status holds.
    checkpoints: tuple[LayerCheckpoint, ...] = ()
    # The init steps' reports of the current attempt; None keeps what the status holds.
    preflight: Preflight | None = None
    staging: Staging | None = None
    # The invalid checkpoints the current attempt's agent told of (`policies.findings`): its
    # counts replace the status's; None (not renewed yet by this attempt's agent) keeps them.
    invalid_counts: tuple[InvalidCheckpointCount, ...] | None = None
    last_invalid: InvalidCheckpoint | None = None
    # A gang's members in the current attempt and how many run (none for one pod), and when
    # a gang taken down for want of nodes is tried again.
    members: tuple[Member, ...] = ()
    members_ready: str | None = None
    gang_retry_time: datetime | None = None
    # The current attempt's last restore record; None keeps what the status holds.
    last_restore: Restore | None = None


@dataclass(frozen=True)
class EventSpec:
    """An Event to send about the run."""

    reason: str
    message: str
    warning: bool = False


def shorten(text: str, limit: int) -> str:
    """Text cut to at most `limit` characters, marked when cut."""
    return text if len(text) <= limit else text[: limit - len(ELLIPSIS)] + ELLIPSIS


def shorten_bytes(text: str, limit: int) -> str:
    """Text cut to at most `limit` bytes of UTF-8 (never inside a character), marked when cut."""
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    return encoded[: limit - len(ELLIPSIS)].decode(errors="ignore") + ELLIPSIS


def find(conditions: Iterable[Condition], kind: str) -> Condition | None:
    """The condition of this type, if set."""
    return next((c for c in conditions if c.type == kind), None)


def is_true(conditions: Iterable[Condition], kind: str) -> bool:
    """Whether the condition of this type is set and True."""
    found = find(conditions, kind)
    return found is not None and found.status is ConditionStatus.TRUE


def set_condition(
    conditions: Sequence[Condition],
    kind: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """The conditions with one set; lastTransitionTime moves only when its status changes."""
    old = find(conditions, kind)
    moved = old is None or old.status is not status
    new = Condition(
        type=kind,
        status=status,
        reason=str(reason),
        message=shorten(message, MAX_CONDITION_MESSAGE),
        observed_generation=generation,
        last_transition_time=now if moved or old is None else old.last_transition_time,
    )
    if old is None:
        return [*conditions, new]
    return [new if c.type == kind else c for c in conditions]


def derive_phase(conditions: Sequence[Condition]) -> Phase:
    """The one-word summary: the first of these that holds, in order of finality."""
    for kind, phase in (
        (ConditionType.FAILED, Phase.FAILED),
        (ConditionType.COMPLETE, Phase.COMPLETED),
        (ConditionType.SUSPENDED, Phase.SUSPENDED),
        (ConditionType.DEGRADED, Phase.RECOVERING),
        (ConditionType.READY, Phase.RUNNING),
    ):
        if is_true(conditions, kind):
            return phase
    return Phase.PENDING


def advance(
    old: TrainingRunStatus,
    state: RunState,
    observed: Observed,
    generation: int | None,
    now: datetime,
) -> TrainingRunStatus:
    """The next status: the state's conditions, the derived phase, the observed fields.

    A verdict describes one pod: a new attempt starts without one (a rescheduled run does not
    show its sick node's `GhostMemory`; `lastFailure` keeps it) until its own agent reports.
    The steps and the layers' checkpoints are the run's progress: they carry over. So does the
    last invalid checkpoint, until a newer one is found.
    """
    conditions: list[Condition] = list(old.conditions)
    for kind, holds in state.truth().items():
        status = ConditionStatus.TRUE if holds else ConditionStatus.FALSE
        conditions = set_condition(
            conditions, kind, status, state.reason, state.message, generation, now
        )
    conditions = step_conditions(
        conditions,
        observed.preflight or old.preflight,
        observed.staging or old.staging,
        generation,
        now,
    )
    return old.model_copy(
        update={
            "observed_generation": generation,
            "phase": derive_phase(conditions),
            "conditions": conditions,
            "attempt": observed.attempt,
            "node": observed.node,
            "restarts": observed.restarts,
            "verdict": observed.verdict
            or (old.verdict if observed.attempt == old.attempt else None),
            "step": old.step if observed.step is None else observed.step,
            "checkpoint_step": (
                old.checkpoint_step
                if observed.checkpoint_step is None
                else observed.checkpoint_step
            ),
            "preflight": observed.preflight or old.preflight,
            "staging": observed.staging or old.staging,
            "checkpoints": merge_layers(old.checkpoints, observed.checkpoints, now),
            "invalid_checkpoints": old.invalid_checkpoints
            if observed.invalid_counts is None
            else list(observed.invalid_counts),
            "last_invalid_checkpoint": observed.last_invalid or old.last_invalid_checkpoint,
            "members": list(observed.members),
            "members_ready": observed.members_ready,
            "gang_retry_time": observed.gang_retry_time,
            "last_restore": observed.last_restore or old.last_restore,
            "start_time": old.start_time or (now if observed.started else None),
            "completion_time": old.completion_time
            or (now if state.complete or state.failed else None),
        }
    )


def merge_layers(
    old: Sequence[LayerCheckpoint], new: Sequence[LayerCheckpoint], now: datetime
) -> list[LayerCheckpoint]:
    """The status's layers updated with the agent's report: a newer step wins.

    A new pod's agent knows nothing of what an earlier attempt shipped: a layer it reports
    without a step (or with an older one) keeps the step the status holds, as the remote copy
    is still there. A layer's `time` is when a step was first seen there (`now`, the cycle
    that saw it: within a resync of the verification), so its age tells how long the layer
    has gone without a newer verified checkpoint.
    """
    merged = {layer.layer: layer for layer in old}
    for layer in new:
        before = merged.get(layer.layer)
        if layer.layer == L0_LAYER:
            # L0 lives in pod memory: a new pod's is empty, and what it reports is all there is.
            seen = before.time if before is not None and before.step == layer.step else None
            since = None if layer.step is None else seen or now
            merged[L0_LAYER] = layer.model_copy(update={"time": since})
            continue
        if before is not None and before.step is not None and (layer.step or -1) <= before.step:
            kept = {"step": before.step, "verified": before.verified, "time": before.time or now}
            layer = layer.model_copy(update=kept)
        elif layer.step is not None:
            layer = layer.model_copy(update={"time": now})
        merged[layer.layer] = layer
    return [merged[name] for name in sorted(merged)]


def changed(old: TrainingRunStatus, new: TrainingRunStatus) -> bool:
    """Whether the new status differs from the old one as the apiserver would store it."""
    return old.to_object() != new.to_object()


def state_reason(status: TrainingRunStatus) -> str | None:
    """The reason of the last state written (that of the Progressing condition)."""
    found = find(status.conditions, STATE_CONDITION)
    return found.reason if found is not None else None


def transition_events(
    old: TrainingRunStatus, state: RunState, extra: Sequence[EventSpec] = ()
) -> list[EventSpec]:
    """Events for this cycle: the state, when its reason changed, then `extra`."""
    events = []
    if state_reason(old) != state.reason:
        events.append(EventSpec(state.reason, state.message, state.warning))
    events.extend(extra)
    return [replace(e, message=shorten_bytes(e.message, MAX_EVENT_BYTES)) for e in events]


# Staging phases that are still running.
STAGING_RUNNING = frozenset({StagingPhase.LISTING, StagingPhase.HASHING, StagingPhase.COPYING})


def preflight_figures(preflight: Preflight) -> str:
    """The preflight's figures in one line: bandwidth, space, GPU."""
    parts = []
    if preflight.write_mbps is not None and preflight.read_mbps is not None:
        parts.append(f"write {preflight.write_mbps:g} MB/s, read {preflight.read_mbps:g} MB/s")
    if preflight.free_bytes is not None and preflight.need_bytes is not None:
        parts.append(
            f"{human_bytes(preflight.free_bytes)} free, {human_bytes(preflight.need_bytes)} needed"
        )
    if preflight.gpu is not None:
        gpu = f"GPU check {preflight.gpu}"
        if preflight.gpu_used_mib is not None and preflight.gpu_total_mib is not None:
            gpu += f" ({preflight.gpu_used_mib:g} of {preflight.gpu_total_mib:g} MiB used)"
        parts.append(gpu)
    return "; ".join(parts)


def preflight_condition(preflight: Preflight) -> tuple[ConditionStatus, Reason, str]:
    """The Preflight condition of a result: status, reason, message."""
    where = f"attempt {preflight.attempt or '?'} on {preflight.node or 'its node'}"
    figures = preflight_figures(preflight)
    if preflight.passed:
        return ConditionStatus.TRUE, Reason.PREFLIGHT_PASSED, f"passed ({where}): {figures}"
    failed = f"{preflight.failure or 'failed'} ({where}): {preflight.message}"
    return ConditionStatus.FALSE, Reason.PREFLIGHT_FAILED, f"{failed}; {figures}".rstrip("; ")


def staging_progress(staging: Staging) -> str:
    """Staging progress in one line: files, bytes, rate, ETA."""
    total = staging.bytes_total
    percent = f" ({100 * staging.bytes_done / total:.0f}%)" if total else ""
    line = (
        f"{staging.files_done}/{staging.files_total} files, "
        f"{human_bytes(staging.bytes_done)} of {human_bytes(total)}{percent}"
    )
    if staging.bytes_per_second:
        line += f", {staging.bytes_per_second / 1e6:.1f} MB/s"
    if staging.eta_seconds is not None and staging.phase in STAGING_RUNNING:
        line += f", ETA {staging.eta_seconds:.0f} s"
    return line


def staging_condition(staging: Staging) -> tuple[ConditionStatus, Reason, str]:
    """The DataStaged condition of a staging report: status, reason, message."""
    where = f"attempt {staging.attempt or '?'}"
    progress = staging_progress(staging)
    if staging.phase is StagingPhase.COMPLETE:
        counts = f"copied {staging.copied or 0}, re-copied {staging.recopies or 0}"
        return ConditionStatus.TRUE, Reason.DATA_STAGED, f"verified ({where}): {progress}; {counts}"
    if staging.phase is StagingPhase.SKIPPED:
        message = f"already staged and verified here ({where}): {progress}"
        return ConditionStatus.TRUE, Reason.DATA_STAGING_SKIPPED, message
    if staging.phase is StagingPhase.FAILED:
        message = f"failed ({where}): {staging.message or 'no message'}; {progress}"
        return ConditionStatus.FALSE, Reason.STAGING_FAILED, message
    phase = staging.phase.value.lower()
    return ConditionStatus.FALSE, Reason.STAGING_DATA, f"{phase} ({where}): {progress}"


def step_conditions(
    conditions: Sequence[Condition],
    preflight: Preflight | None,
    staging: Staging | None,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """The conditions with Preflight and DataStaged set from the steps' reports (if any)."""
    result = list(conditions)
    for kind, made in (
        (ConditionType.PREFLIGHT, preflight and preflight_condition(preflight)),
        (ConditionType.DATA_STAGED, staging and staging_condition(staging)),
    ):
        if made:
            truth, reason, message = made
            result = set_condition(result, kind, truth, reason, message, generation, now)
    return result


def step_events(old: TrainingRunStatus, new: TrainingRunStatus) -> list[EventSpec]:
    """One Event per new outcome of a step (and per staging start) of an attempt.

    A failed preflight is told by the failure it is (`PreflightFailed`, with the evidence),
    not here.
    """
    events = []
    pre, was = new.preflight, old.preflight
    told = was is not None and was.passed and was.attempt == (pre and pre.attempt)
    if pre is not None and pre.passed and not told:
        _, reason, message = preflight_condition(pre)
        events.append(EventSpec(reason, message))
    stage, before = new.staging, old.staging
    if stage is not None:
        running = stage.phase in STAGING_RUNNING
        kept = (
            before is not None
            and before.attempt == stage.attempt
            and (before.phase in STAGING_RUNNING if running else before.phase is stage.phase)
        )
        if not kept:
            _, reason, message = staging_condition(stage)
            events.append(EventSpec(reason, message, warning=reason is Reason.STAGING_FAILED))
    return [replace(e, message=shorten_bytes(e.message, MAX_EVENT_BYTES)) for e in events]
