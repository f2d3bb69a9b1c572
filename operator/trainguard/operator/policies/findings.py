"""Invalid checkpoints, pure: the agent's summary in the Lease -> the status.

The agent tells each invalid checkpoint its pod finds as a Warning Event and carries a summary
in the heartbeat Lease (`trainguard.contract.findings`): how many it told per layer, and the
last one. The status shows the last one of any attempt (`status.lastInvalidCheckpoint`) and
the current attempt's counts (`status.invalidCheckpoints`, each entry naming its attempt), from
which the metric `trainguard_checkpoints_invalid_total` counts (`trainguard.operator.metrics`).
Only a Lease renewed by the current attempt's pod speaks for the run; without a summary its
agent found nothing, and a summary that cannot be read changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from trainguard.api import TrainingRunStatus
from trainguard.api.status import InvalidCheckpoint, InvalidCheckpointCount
from trainguard.operator.policies.signals import LeaseView, renewed_by


@dataclass(frozen=True)
class Reported:
    """What the current attempt's agent told of: counts per layer, and the last finding."""

    counts: tuple[InvalidCheckpointCount, ...] = ()
    last: InvalidCheckpoint | None = None


def _json(text: str) -> dict[str, Any] | None:
    """The summary's JSON: {} without one (nothing found), None when it cannot be read."""
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _counts(data: object, attempt: int) -> tuple[InvalidCheckpointCount, ...]:
    if not isinstance(data, dict):
        return ()
    counts = []
    for layer, count in sorted(data.items()):
        try:
            counts.append(InvalidCheckpointCount(layer=layer, attempt=attempt, count=count))
        except ValidationError:
            continue  # a layer or a count the status cannot hold: left out, never fatal
    return tuple(counts)


def _last(data: object, attempt: int) -> InvalidCheckpoint | None:
    if not isinstance(data, dict):
        return None
    known = {field.alias or name for name, field in InvalidCheckpoint.model_fields.items()}
    try:
        fields = {key: value for key, value in data.items() if key in known}
        return InvalidCheckpoint.from_object({**fields, "attempt": attempt})
    except ValidationError:
        return None


def reported(run: str, attempt: int | None, lease: LeaseView | None) -> Reported | None:
    """The current attempt's findings (none found: empty).

    None when its agent has not renewed the Lease yet, or when the summary cannot be read:
    the status then keeps what it holds (its counts are not reset, to be counted again).
    """
    if lease is None or attempt is None or not renewed_by(lease, run, attempt):
        return None
    data = _json(lease.invalid_checkpoints)
    if data is None:
        return None
    return Reported(_counts(data.get("counts"), attempt), _last(data.get("last"), attempt))


def news(run: str, lease: LeaseView | None, status: TrainingRunStatus) -> bool:
    """Whether the Lease tells of an invalid checkpoint the status does not show yet.

    The status then shows it at the agent's pace, not the resync's.
    """
    found = reported(run, status.attempt, lease)
    return (
        found is not None
        and found.last is not None
        and found.last != status.last_invalid_checkpoint
    )
