"""The agent's signals: reading the heartbeat Lease, and when a verdict calls for a cycle now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from trainguard.api import TrainingRunStatus
from trainguard.api.constants import Verdict
from trainguard.api.status import Failure as FailureRecord
from trainguard.operator.k8s.leases import lease_view
from trainguard.operator.policies.signals import LeaseView, expired, renewed_by, urgent

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def lease(annotations: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "llm-heartbeat", "annotations": annotations}, "spec": spec}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (lease({}), LeaseView()),
        (
            lease(
                {
                    "trainguard.dev/verdict": "Dead",
                    "trainguard.dev/step": "120",
                    "trainguard.dev/saved-step": "100",
                    "trainguard.dev/evidence": '{"reason":"exit 1"}',
                },
                renewTime="2026-01-01T00:00:00.000000Z",
                leaseDurationSeconds=15,
            ),
            LeaseView(Verdict.DEAD, 120, 100, '{"reason":"exit 1"}', T0, 15),
        ),
        # The agent writes Unknown and empty steps before it knows; neither is a status value.
        (
            lease({"trainguard.dev/verdict": "Unknown", "trainguard.dev/step": ""}),
            LeaseView(),
        ),
        (lease({"trainguard.dev/step": "-3"}, renewTime="yesterday"), LeaseView()),
    ],
)
def test_lease_view(body: dict[str, Any], expected: LeaseView) -> None:
    assert lease_view(body) == expected


def _status(verdict: Verdict | None, handled: str | None = None) -> TrainingRunStatus:
    last = None
    if handled is not None:
        last = FailureRecord(cause=handled, time=T0, attempt=2, message="")
    return TrainingRunStatus(attempt=2, verdict=verdict, last_failure=last)


@pytest.mark.parametrize(
    ("verdict", "status", "expected"),
    [
        (Verdict.DEAD, _status(Verdict.HEALTHY), True),
        (Verdict.DEAD, _status(None), True),
        (Verdict.GHOST_MEMORY, _status(Verdict.DEAD, "Dead"), True),
        (Verdict.DEAD, _status(Verdict.DEAD, "Dead"), False),  # shown and handled
        # Shown (read from an earlier attempt's Lease) but not handled for this attempt.
        (Verdict.DEAD, _status(Verdict.DEAD), True),
        (Verdict.SLOW, _status(Verdict.HEALTHY), False),  # not a failure: the resync carries it
        (Verdict.HEALTHY, _status(Verdict.DEAD), False),
        (None, _status(Verdict.HEALTHY), False),
    ],
)
def test_urgent(verdict: Verdict | None, status: TrainingRunStatus, expected: bool) -> None:
    assert urgent(LeaseView(verdict), status) is expected


def test_no_lease_is_never_urgent() -> None:
    assert not urgent(None, TrainingRunStatus())


def test_renewed_by_the_pod_of_the_attempt() -> None:
    assert renewed_by(LeaseView(holder="llm-2"), "llm", 2)
    assert not renewed_by(LeaseView(holder="llm-1"), "llm", 2)
    assert not renewed_by(LeaseView(holder="llm-1"), "llm", None)


@pytest.mark.parametrize(
    ("view", "age", "expected"),
    [
        (LeaseView(renewed=T0, duration_seconds=15), 14, False),
        (LeaseView(renewed=T0, duration_seconds=15), 16, True),
        (LeaseView(duration_seconds=15), 1000, False),  # never renewed: the agent is starting
        (LeaseView(renewed=T0), 1000, False),
    ],
)
def test_expired(view: LeaseView, age: int, expected: bool) -> None:
    assert expired(view, T0 + timedelta(seconds=age)) is expected
