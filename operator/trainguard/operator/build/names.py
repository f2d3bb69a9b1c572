"""One helper per name, label and selector of a run's children: spelled here and nowhere else.

The heartbeat Lease's name (`lease_name`) belongs to the pod contract, which the agent reads too.
"""

from __future__ import annotations

from trainguard.api.constants import (
    LABEL_ATTEMPT,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_RUN,
    MANAGED_BY,
)


def pod_name(run: str, attempt: int) -> str:
    """The pod of attempt k: deterministic, so a restarted operator re-applies, never duplicates."""
    return f"{run}-{attempt}"


def rbac_name(run: str) -> str:
    """The ServiceAccount, Role and RoleBinding of the run's pod (one name for the three).

    The suffix keeps them apart from a user's own ServiceAccount named like the run, which
    a forced apply would otherwise take over.
    """
    return f"{run}-trainguard"


def run_labels(run: str, component: str) -> dict[str, str]:
    """Labels on every child of a run."""
    return {LABEL_RUN: run, LABEL_COMPONENT: component, LABEL_MANAGED_BY: MANAGED_BY}


def pod_labels(run: str, component: str, attempt: int) -> dict[str, str]:
    """Labels of a training pod: the run's, plus its attempt."""
    return {**run_labels(run, component), LABEL_ATTEMPT: str(attempt)}


def attempt_of(labels: dict[str, str]) -> int | None:
    """The attempt a pod's labels name, or None when missing or not a positive integer."""
    value = labels.get(LABEL_ATTEMPT, "")
    return int(value) if value.isdigit() and int(value) > 0 else None
