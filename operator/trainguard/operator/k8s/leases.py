"""A run's heartbeat Lease: what the operator reads from the agent's renewals."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from trainguard.api.constants import (
    ANNOTATION_EVIDENCE,
    ANNOTATION_INVALID_CHECKPOINTS,
    ANNOTATION_LAYERS,
    ANNOTATION_PREFLIGHT,
    ANNOTATION_RESTORED,
    ANNOTATION_SAVED_STEP,
    ANNOTATION_STAGING,
    ANNOTATION_STEP,
    ANNOTATION_VERDICT,
    ANNOTATION_VERDICT_SINCE,
    EVIDENCE_CAUSE,
    Verdict,
)
from trainguard.operator.build.names import member_of
from trainguard.operator.policies.layers import parse_layers
from trainguard.operator.policies.signals import NARROWED_CAUSES, LeaseView


def _count(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _narrowed(evidence: str, verdict: Verdict | None) -> str | None:
    # Only a cause known to narrow this very verdict counts; anything else is evidence text.
    try:
        data = json.loads(evidence)
    except ValueError:
        return None
    cause = data.get(EVIDENCE_CAUSE) if isinstance(data, dict) else None
    return cause if isinstance(cause, str) and NARROWED_CAUSES.get(cause) == verdict else None


def lease_view(lease: dict[str, Any]) -> LeaseView:
    """The operator's view of a heartbeat Lease; unknown or malformed values read as None."""
    annotations = lease.get("metadata", {}).get("annotations") or {}
    labels = lease.get("metadata", {}).get("labels") or {}
    spec = lease.get("spec") or {}
    named = annotations.get(ANNOTATION_VERDICT)
    verdict = Verdict(named) if named in set(Verdict) else None
    evidence = str(annotations.get(ANNOTATION_EVIDENCE) or "")
    duration = spec.get("leaseDurationSeconds")
    return LeaseView(
        verdict=verdict,
        step=_count(annotations.get(ANNOTATION_STEP)),
        saved_step=_count(annotations.get(ANNOTATION_SAVED_STEP)),
        evidence=evidence,
        renewed=_time(spec.get("renewTime")),
        duration_seconds=duration if isinstance(duration, int) else None,
        holder=spec.get("holderIdentity") or None,
        layers=parse_layers(annotations.get(ANNOTATION_LAYERS)),
        cause=_narrowed(evidence, verdict),
        preflight=str(annotations.get(ANNOTATION_PREFLIGHT) or ""),
        staging=str(annotations.get(ANNOTATION_STAGING) or ""),
        since=_time(annotations.get(ANNOTATION_VERDICT_SINCE)),
        invalid_checkpoints=str(annotations.get(ANNOTATION_INVALID_CHECKPOINTS) or ""),
        member=member_of(labels),
        restored=str(annotations.get(ANNOTATION_RESTORED) or ""),
    )
