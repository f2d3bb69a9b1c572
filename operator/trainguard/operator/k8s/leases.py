"""A run's heartbeat Lease: what the operator reads from the agent's renewals.

The one thing the operator writes there besides the Lease's existence is a gang's restart
generation (`order_generation`).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from trainguard.api.constants import (
    ANNOTATION_EVIDENCE,
    ANNOTATION_GANG_GENERATION,
    ANNOTATION_INVALID_CHECKPOINTS,
    ANNOTATION_LAYERS,
    ANNOTATION_PREFLIGHT,
    ANNOTATION_RESTORED,
    ANNOTATION_SAVED_STEP,
    ANNOTATION_STAGING,
    ANNOTATION_STEP,
    ANNOTATION_VERDICT,
    ANNOTATION_VERDICT_GENERATION,
    ANNOTATION_VERDICT_SINCE,
    EVIDENCE_CAUSE,
    Verdict,
)
from trainguard.contract.env import lease_name
from trainguard.operator.build.names import member_of
from trainguard.operator.k8s.client import Kube, concurrently, object_path
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
        ordered_generation=_count(annotations.get(ANNOTATION_GANG_GENERATION)),
        generation=_count(annotations.get(ANNOTATION_VERDICT_GENERATION)),
    )


MERGE_PATCH = "application/merge-patch+json"


def order_generation(
    kube: Kube, namespace: str, run: str, members: list[int], generation: int
) -> None:
    """Write the gang's restart generation on these members' Leases (`policies.gang`).

    A merge patch of one annotation: the agent's renewals (its own annotations, holder, renew
    time) and the operator's applied fields are left as they are.
    """
    body = {"metadata": {"annotations": {ANNOTATION_GANG_GENERATION: str(generation)}}}

    def patch(member: int) -> None:
        path = object_path("coordination.k8s.io/v1", "leases", namespace, lease_name(run, member))
        kube.request("PATCH", path, body, content_type=MERGE_PATCH)

    concurrently(patch, members)
