"""A run's heartbeat Lease: what the operator reads from the agent's renewals."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from trainguard.api.constants import (
    ANNOTATION_EVIDENCE,
    ANNOTATION_LAYERS,
    ANNOTATION_PREFLIGHT,
    ANNOTATION_SAVED_STEP,
    ANNOTATION_STAGING,
    ANNOTATION_STEP,
    ANNOTATION_VERDICT,
    ANNOTATION_VERDICT_SINCE,
    Verdict,
)
from trainguard.policies.layers import parse_layers
from trainguard.policies.signals import LeaseView


def _count(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def lease_view(lease: dict[str, Any]) -> LeaseView:
    """The operator's view of a heartbeat Lease; unknown or malformed values read as None."""
    annotations = lease.get("metadata", {}).get("annotations") or {}
    spec = lease.get("spec") or {}
    verdict = annotations.get(ANNOTATION_VERDICT)
    duration = spec.get("leaseDurationSeconds")
    return LeaseView(
        verdict=Verdict(verdict) if verdict in set(Verdict) else None,
        step=_count(annotations.get(ANNOTATION_STEP)),
        saved_step=_count(annotations.get(ANNOTATION_SAVED_STEP)),
        evidence=str(annotations.get(ANNOTATION_EVIDENCE) or ""),
        renewed=_time(spec.get("renewTime")),
        duration_seconds=duration if isinstance(duration, int) else None,
        holder=spec.get("holderIdentity") or None,
        layers=parse_layers(annotations.get(ANNOTATION_LAYERS)),
        preflight=str(annotations.get(ANNOTATION_PREFLIGHT) or ""),
        staging=str(annotations.get(ANNOTATION_STAGING) or ""),
        since=_time(annotations.get(ANNOTATION_VERDICT_SINCE)),
    )
