"""The init steps' reports, pure: which preflight result and staging progress the status shows.

The steps (`trainguard preflight`, `trainguard stage-data`) summarise their reports in the
fields of `status.preflight` / `status.staging` (JSON, camelCase). Two places carry them:
- the run's heartbeat Lease, whose agent (a native sidecar started before the steps) copies
  them into annotations on every renewal: staging progress while it runs, then the outcome;
- the steps' termination messages in the pod's `initContainerStatuses`: the final outcome,
  there even when a failed step failed the pod before the agent renewed again.

A report speaks for the current attempt only: the Lease when its holder is that attempt's
pod, a termination message when it is that pod's. A final one (termination message) wins
over the Lease's, which may lag a renewal behind.
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import ValidationError

from trainguard.api import TrainingRunStatus
from trainguard.api.status import Preflight, Staging, StatusModel
from trainguard.operator.policies.lifecycle import PodView
from trainguard.operator.policies.signals import LeaseView, renewed_by

M = TypeVar("M", bound=StatusModel)


def parse(model: type[M], text: str | None) -> M | None:
    """A step's summary as the status model; None when absent or not one.

    Keys the model lacks are left out: a newer agent may report more.
    """
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    known = {field.alias or name for name, field in model.model_fields.items()}
    try:
        return model.from_object({k: v for k, v in data.items() if k in known})
    except ValidationError:
        return None


def reports(
    run: str, attempt: int | None, pod: PodView | None, lease: LeaseView | None
) -> tuple[Preflight | None, Staging | None]:
    """The current attempt's preflight result and staging progress, where known."""
    preflight: Preflight | None = None
    staging: Staging | None = None
    if lease is not None and renewed_by(lease, run, attempt):
        preflight, staging = parse(Preflight, lease.preflight), parse(Staging, lease.staging)
    if pod is not None and pod.attempt == attempt:
        preflight = parse(Preflight, pod.preflight_report) or preflight
        staging = parse(Staging, pod.staging_report) or staging
    return preflight, staging


def news(run: str, lease: LeaseView | None, status: TrainingRunStatus) -> bool:
    """Whether the Lease carries a step report of the current attempt the status lacks.

    Staging progress then reaches the status at the agent's pace, not the resync's.
    """
    if lease is None or not renewed_by(lease, run, status.attempt):
        return False
    preflight, staging = parse(Preflight, lease.preflight), parse(Staging, lease.staging)
    return (preflight is not None and preflight != status.preflight) or (
        staging is not None and staging != status.staging
    )
