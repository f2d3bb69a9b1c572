"""Node health beyond one run (pure): when a node is tainted for everyone, and when it comes back.

A run's own evidence (its agent's verdict, its preflight) excludes a node from that run at once
(`trainguard.operator.policies.failures`). Tainting the node `trainguard.dev/unhealthy` keeps
every tenant's pods off it, so the operator asks for evidence the tenant does not control
first, per the taint policy (`TaintPolicy`, the chart's `operator.taintPolicy`):

- `confirmed` (the default): the node becomes *suspect*; the operator runs its own node check
  there (a pod of its own, in its own namespace, with all the node's GPUs: `trainguard
  preflight` on a scratch volume) and taints only if the check fails. Trade-off: one tenant
  cannot take nodes from everyone, but a sick node may take other runs' pods until its check
  has run (seconds, once its GPUs are free).
- `immediate`: tainted at once. The fastest fencing of a sick node, but any run's report (its
  code is the tenant's) takes the node from everyone until a check clears it.
- `never`: only the reporting run avoids the node; nothing cluster-wide, and other runs may
  land on a sick node.

A node lost to the control plane (NotReady or gone: evidence from the node controller, not the
tenant) is tainted at once under `confirmed` too.

Remediation: a tainted node is checked again, at once after a reboot (its boot ID changed) or
a Ready transition, else on a back-off (`recheck_seconds` doubling per failed check, capped at
`MAX_RECHECK_SECONDS`). A check that passes lifts the taint; one that fails keeps it, with the
reason and the time of the check on the node (labels, annotations, Events: what `kubectl
describe node` shows). A check that could not run (the node's GPUs busy, the pod refused)
changes nothing and is tried again soon.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from trainguard.api.constants import Reason

# Seconds: a check that could not run is tried again this soon; a running one is given up
# (its pod deleted, counted as not run) after CHECK_TIMEOUT_SECONDS.
NOT_RUN_RETRY_SECONDS = 10.0
CHECK_TIMEOUT_SECONDS = 180.0
DEFAULT_RECHECK_SECONDS = 60.0
MAX_RECHECK_SECONDS = 1800.0
# GPU memory a node check allows in use while no pod holds the GPUs: beyond the driver's own
# (a few hundred MiB at most), memory held by no process is what a dead process left behind.
DEFAULT_CHECK_GPU_MAX_USED_MIB = 512.0


class TaintPolicy(StrEnum):
    """When a run's report of a sick node taints it for every tenant (see the module's table)."""

    CONFIRMED = "confirmed"
    IMMEDIATE = "immediate"
    NEVER = "never"


class Health(StrEnum):
    """What trainguard holds of a node (its label `trainguard.dev/node-health`)."""

    SUSPECT = "suspect"  # reported by a run; a node check decides
    UNHEALTHY = "unhealthy"  # tainted; re-checked until a check passes


# Causes whose evidence comes from the control plane, not from anything a tenant runs.
CONTROL_PLANE_CAUSES = frozenset({Reason.NODE_LOST.value, Reason.LEASE_EXPIRED.value})


def on_report(policy: TaintPolicy, cause: str) -> Health | None:
    """What a run's report that its node is sick (`cause`) does to the node, cluster-wide."""
    if policy is TaintPolicy.NEVER:
        return None
    if policy is TaintPolicy.IMMEDIATE or cause in CONTROL_PLANE_CAUSES:
        return Health.UNHEALTHY
    return Health.SUSPECT


class Outcome(StrEnum):
    """How a node check's pod ended (or not yet)."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_RUN = "not run"  # refused, lost, timed out: says nothing about the node
    RUNNING = "running"


@dataclass(frozen=True)
class CheckResult:
    """A node check's outcome, with its one-line reason."""

    outcome: Outcome
    message: str


# `trainguard preflight`'s exit codes that judge the node (storage, space, GPU, bandwidth);
# any other end of the check pod says nothing about it.
NODE_FAILURE_EXIT_CODES = frozenset({10, 11, 12, 13})


def judge(pod: dict[str, Any], now: datetime, started: datetime | None) -> CheckResult:
    """The outcome of a check pod, from its status as the kubelet wrote it."""
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    terminated = next(
        (
            (c.get("state") or {}).get("terminated")
            for c in status.get("containerStatuses") or []
            if (c.get("state") or {}).get("terminated")
        ),
        None,
    )
    message = _summary(((terminated or {}).get("message") or "").strip())
    if phase == "Succeeded":
        return CheckResult(Outcome.PASSED, message or "node check passed")
    if phase == "Failed":
        code = (terminated or {}).get("exitCode")
        if code in NODE_FAILURE_EXIT_CODES:
            return CheckResult(Outcome.FAILED, message or f"node check failed (exit code {code})")
        why = status.get("message") or status.get("reason") or f"exit code {code}"
        return CheckResult(Outcome.NOT_RUN, f"the check pod did not run the check: {why}")
    if started is not None and (now - started).total_seconds() > CHECK_TIMEOUT_SECONDS:
        return CheckResult(
            Outcome.NOT_RUN,
            f"the check pod did not finish within {CHECK_TIMEOUT_SECONDS:g} s (phase {phase})",
        )
    return CheckResult(Outcome.RUNNING, f"phase {phase}")


def _summary(message: str) -> str:
    # The preflight's termination message is its summary as JSON: its one-line message.
    try:
        summary = json.loads(message)
    except ValueError:
        return message
    text = summary.get("message") if isinstance(summary, dict) else None
    return str(text) if text else message


@dataclass(frozen=True)
class NodeRecord:
    """What the node's labels, annotations and status say, for the decisions here."""

    health: Health
    ready: bool
    boot_id: str
    ready_since: datetime | None  # the Ready condition's last transition
    last_check: datetime | None
    last_outcome: Outcome | None
    checked_boot_id: str
    failed_checks: int


def recheck_delay(record: NodeRecord, recheck_seconds: float) -> float:
    """Seconds after its last check that a node is checked again, barring reboot or Ready."""
    if record.last_outcome is Outcome.NOT_RUN:
        return NOT_RUN_RETRY_SECONDS
    doublings = max(record.failed_checks - 1, 0)
    return min(recheck_seconds * 2.0**doublings, MAX_RECHECK_SECONDS)


def check_due(record: NodeRecord, now: datetime, recheck_seconds: float) -> bool:
    """Whether to start a node check now (a node that is not Ready cannot run one)."""
    if not record.ready:
        return False
    if record.last_check is None:
        return True
    if record.boot_id and record.boot_id != record.checked_boot_id:
        return True  # rebooted since: what a reboot clears (ghost memory) may be gone
    if record.ready_since is not None and record.ready_since > record.last_check:
        return True  # back from NotReady since the last check
    delay = recheck_delay(record, recheck_seconds)
    return now >= record.last_check + timedelta(seconds=delay)


class Action(StrEnum):
    """What a finished check does to the node."""

    TAINT = "Taint"  # a suspect node's check failed
    UNTAINT = "Untaint"  # a tainted node's check passed
    CLEAR = "Clear"  # a suspect node's check passed: no taint, nothing held
    KEEP = "Keep"  # tainted and still failing, or the check did not run


def after_check(health: Health, result: CheckResult) -> Action:
    """The node's next state from a finished check."""
    if result.outcome is Outcome.PASSED:
        return Action.UNTAINT if health is Health.UNHEALTHY else Action.CLEAR
    if result.outcome is Outcome.FAILED and health is Health.SUSPECT:
        return Action.TAINT
    return Action.KEEP
