"""Status arithmetic, pure: conditions in metav1.Condition shape, the derived phase, events.

Each reconcile cycle summarises the run in one `RunState` (a CamelCase reason, a message
and the truth of each standard condition). `advance()` turns the previous status and that
state into the next status, keeping `lastTransitionTime` of conditions whose status did not
change; `changed()` says whether it must be written; `transition_events()` lists the Events
to send after the write (one per change of the state's reason).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from trainguard.api import Condition, TrainingRunStatus
from trainguard.api.constants import ConditionStatus, ConditionType, Phase, Verdict
from trainguard.api.status import LayerCheckpoint

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
    # The agent's signals; None keeps what the status holds (no Lease read this cycle).
    verdict: Verdict | None = None
    step: int | None = None
    checkpoint_step: int | None = None
    # The agent's shipping report per remote layer; merged into what the status holds.
    checkpoints: tuple[LayerCheckpoint, ...] = ()


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
    """The next status: the state's conditions, the derived phase, the observed fields."""
    conditions: list[Condition] = list(old.conditions)
    for kind, holds in state.truth().items():
        status = ConditionStatus.TRUE if holds else ConditionStatus.FALSE
        conditions = set_condition(
            conditions, kind, status, state.reason, state.message, generation, now
        )
    return old.model_copy(
        update={
            "observed_generation": generation,
            "phase": derive_phase(conditions),
            "conditions": conditions,
            "attempt": observed.attempt,
            "node": observed.node,
            "restarts": observed.restarts,
            "verdict": observed.verdict or old.verdict,
            "step": old.step if observed.step is None else observed.step,
            "checkpoint_step": (
                old.checkpoint_step
                if observed.checkpoint_step is None
                else observed.checkpoint_step
            ),
            "checkpoints": merge_layers(old.checkpoints, observed.checkpoints),
            "start_time": old.start_time or (now if observed.started else None),
            "completion_time": old.completion_time
            or (now if state.complete or state.failed else None),
        }
    )


def merge_layers(
    old: Sequence[LayerCheckpoint], new: Sequence[LayerCheckpoint]
) -> list[LayerCheckpoint]:
    """The status's layers updated with the agent's report: a newer step wins.

    A new pod's agent knows nothing of what an earlier attempt shipped: a layer it reports
    without a step (or with an older one) keeps the step the status holds, as the remote copy
    is still there.
    """
    merged = {layer.layer: layer for layer in old}
    for layer in new:
        before = merged.get(layer.layer)
        if before is not None and before.step is not None and (layer.step or -1) < before.step:
            layer = layer.model_copy(update={"step": before.step, "verified": before.verified})
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
