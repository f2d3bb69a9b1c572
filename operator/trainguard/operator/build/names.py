"""One helper per name, label and selector of a run's children: spelled here and nowhere else.

The heartbeat Lease's name (`lease_name`) belongs to the pod contract, which the agent reads too.
"""

from __future__ import annotations

from trainguard.api.constants import (
    LABEL_ATTEMPT,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_MEMBER,
    LABEL_RUN,
    MANAGED_BY,
)

# The headless Service of a gang is `<run>` + this suffix (`trainguard.api.trainingrun` bounds a
# gang's run name so that it stays a DNS label).
GANG_SERVICE_SUFFIX = "-gang"
# The env ConfigMap of a run is `<run>` + this + a digest of its content.
ENV_CONFIG_INFIX = "-env-"


def pod_name(run: str, attempt: int, member: int | None = None) -> str:
    """The pod of attempt k: deterministic, so a restarted operator re-applies, never duplicates.

    A gang's member m of attempt k is `<run>-<k>-<m>`; a one-pod run's (`member` None) keeps
    the name it always had.
    """
    return f"{run}-{attempt}" if member is None else f"{run}-{attempt}-{member}"


def gang_service_name(run: str) -> str:
    """The headless Service whose subdomain gives a gang's members their stable names."""
    return f"{run}{GANG_SERVICE_SUFFIX}"


def member_hostname(run: str, member: int) -> str:
    """Member m's hostname, the same in every attempt, so its address outlives its pods."""
    return f"{run}-{member}"


def member_address(run: str, member: int) -> str:
    """Member m's stable name, resolved by the cluster DNS in the run's namespace."""
    return f"{member_hostname(run, member)}.{gang_service_name(run)}"


def env_config_name(run: str, digest: str) -> str:
    """The run's env ConfigMap holding the shared variables whose digest is `digest`."""
    return f"{run}{ENV_CONFIG_INFIX}{digest}"


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


def member_labels(run: str, component: str, attempt: int, member: int) -> dict[str, str]:
    """Labels of a gang member's pod: the attempt's, plus its index."""
    return {**pod_labels(run, component, attempt), LABEL_MEMBER: str(member)}


def member_of(labels: dict[str, str]) -> int | None:
    """The member index a child's labels name, or None (a one-pod run's child, or malformed)."""
    value = labels.get(LABEL_MEMBER, "")
    return int(value) if value.isdigit() else None


def attempt_of(labels: dict[str, str]) -> int | None:
    """The attempt a pod's labels name, or None when missing or not a positive integer."""
    value = labels.get(LABEL_ATTEMPT, "")
    return int(value) if value.isdigit() and int(value) > 0 else None
