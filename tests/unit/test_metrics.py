"""The operator's metrics: what a sequence of run statuses counts, and the gauges it shows."""

from __future__ import annotations

import socket
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from trainguard.api import Condition, TrainingRunStatus
from trainguard.operator.metrics import ENV_METRICS_PORT, Metrics, serve

pytestmark = pytest.mark.unit

T0 = "2025-06-01T09:59:58Z"
RUN = ("team-a", "llm")
SCRAPE_TIMEOUT_SECONDS = 5


def status(reason: str, phase: str = "Running", **fields: Any) -> TrainingRunStatus:
    """A status whose state (the Progressing condition) has this reason."""
    condition = {
        "type": "Progressing",
        "status": "True",
        "reason": reason,
        "message": "",
        "lastTransitionTime": T0,
    }
    return TrainingRunStatus.from_object({"phase": phase, "conditions": [condition], **fields})


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> Metrics:
    return Metrics(registry)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_first_status_of_a_run_is_a_baseline(metrics: Metrics, registry: CollectorRegistry) -> None:
    # An operator that starts sees every run once: their history must not count again.
    metrics.observe(RUN, status("Training", restarts=3, verdict="Slow"))
    assert value(registry, "trainguard_restarts_total", namespace="team-a") == 0
    assert value(registry, "trainguard_verdicts_total", namespace="team-a", verdict="Slow") == 0
    assert value(registry, "trainguard_runs", namespace="team-a", phase="Running") == 1


def test_restarts_and_verdicts_count_changes(metrics: Metrics, registry: CollectorRegistry) -> None:
    metrics.observe(RUN, status("Training", restarts=0, verdict="Healthy"))
    metrics.observe(RUN, status("Training", restarts=0, verdict="Healthy"))
    metrics.observe(RUN, status("Training", restarts=2, verdict="Hung"))
    metrics.observe(RUN, status("Training", restarts=2, verdict="Hung"))
    assert value(registry, "trainguard_restarts_total", namespace="team-a") == 2
    assert value(registry, "trainguard_verdicts_total", namespace="team-a", verdict="Hung") == 1
    assert value(registry, "trainguard_verdicts_total", namespace="team-a", verdict="Healthy") == 0


def test_action_with_its_failure(metrics: Metrics, registry: CollectorRegistry) -> None:
    failure = {"cause": "Dead", "time": T0, "message": "no trainer process", "step": 40}
    metrics.observe(RUN, status("Training"))
    metrics.observe(RUN, status("Rescheduling", "Recovering", lastFailure=failure))
    metrics.observe(RUN, status("Scheduling", "Pending", lastFailure=failure))
    labels = {"namespace": "team-a"}
    assert value(
        registry, "trainguard_actions_total", action="Rescheduling", reason="Dead", **labels
    )
    assert value(registry, "trainguard_actions_total", action="Scheduling", reason="None", **labels)
    assert value(registry, "trainguard_reschedules_total", **labels) == 1
    # The operator's own record time (lastFailure.time) says nothing of the detection's
    # latency: the watched statuses do not time it, the cycle that writes the record does.
    assert value(registry, "trainguard_detection_latency_seconds_count", **labels) == 0


def test_detection_latency_is_what_the_cycles_time(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    metrics.detected("team-a", 1.5)
    metrics.detected("team-a", 0.0)
    labels = {"namespace": "team-a"}
    assert value(registry, "trainguard_detection_latency_seconds_count", **labels) == 2
    assert value(registry, "trainguard_detection_latency_seconds_sum", **labels) == 1.5
    assert value(registry, "trainguard_detection_latency_seconds_bucket", le="2.0", **labels) == 2
    assert value(registry, "trainguard_detection_latency_seconds_bucket", le="1.0", **labels) == 1
    assert value(registry, "trainguard_detection_latency_seconds_count", namespace="b") == 0


def test_gauges_follow_the_latest_statuses(metrics: Metrics, registry: CollectorRegistry) -> None:
    saved = (datetime.now(UTC) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    checkpoints = [{"layer": "l1", "step": 400, "time": saved, "verified": True}, {"layer": "s3"}]
    excluded = [{"node": "gpu-1", "reason": "GhostMemory", "time": T0}]
    metrics.observe(RUN, status("Training", checkpoints=checkpoints, excludedNodes=excluded))
    metrics.observe(("team-a", "other"), status("Training", excludedNodes=excluded))
    metrics.observe(("team-b", "done"), status("Completed", "Completed"))
    assert value(registry, "trainguard_runs", namespace="team-a", phase="Running") == 2
    assert value(registry, "trainguard_runs", namespace="team-b", phase="Completed") == 1
    age = value(
        registry, "trainguard_checkpoint_age_seconds", namespace="team-a", run="llm", layer="l1"
    )
    assert 600 <= age < 660
    assert (
        registry.get_sample_value(
            "trainguard_checkpoint_age_seconds",
            {"namespace": "team-a", "run": "llm", "layer": "s3"},
        )
        is None
    )
    # The same node excluded by two runs is one node.
    assert value(registry, "trainguard_nodes_excluded", reason="GhostMemory") == 1
    metrics.forget(("team-b", "done"))
    assert value(registry, "trainguard_runs", namespace="team-b", phase="Completed") == 0


def invalid(attempt: int, **counts: int) -> list[dict[str, Any]]:
    """`status.invalidCheckpoints` of one attempt."""
    return [{"layer": layer, "attempt": attempt, "count": n} for layer, n in counts.items()]


def test_invalid_checkpoints_count_what_each_attempt_told_once(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    def total(layer: str) -> float:
        labels = {"namespace": "team-a", "layer": layer}
        return value(registry, "trainguard_checkpoints_invalid_total", **labels)

    metrics.observe(RUN, status("Training", invalidCheckpoints=invalid(1, backup=2)))  # baseline
    assert total("backup") == 0
    metrics.observe(RUN, status("Training", invalidCheckpoints=invalid(1, backup=3, l1=1)))
    metrics.observe(RUN, status("Training", invalidCheckpoints=invalid(1, backup=3, l1=1)))
    assert (total("backup"), total("l1")) == (1, 1)  # the growth, once per change
    # The next attempt's agent counts from zero: all of its count is new, the old is not lost.
    metrics.observe(RUN, status("Training", attempt=2, invalidCheckpoints=[]))
    metrics.observe(RUN, status("Training", attempt=2, invalidCheckpoints=invalid(2, backup=1)))
    assert (total("backup"), total("l1")) == (2, 1)


def test_the_verified_checkpoint_age_of_a_training_run(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    def moment(minutes: int) -> str:
        return (datetime.now(UTC) - timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def training(ready_since: str) -> TrainingRunStatus:
        ready = {"type": "Ready", "status": "True", "reason": "Training", "message": ""}
        run = status("Training", checkpoints=checkpoints)
        ready_condition = Condition.from_object({**ready, "lastTransitionTime": ready_since})
        return run.model_copy(update={"conditions": [*run.conditions, ready_condition]})

    def age(layer: str) -> float | None:
        labels = {"namespace": "team-a", "run": "llm", "layer": layer}
        return registry.get_sample_value("trainguard_verified_checkpoint_age_seconds", labels)

    checkpoints = [
        {"layer": "s3", "step": 400, "time": moment(90), "verified": True},
        {"layer": "backup"},  # never verified one
    ]
    metrics.observe(RUN, training(ready_since=moment(120)))
    s3, backup = age("s3"), age("backup")
    assert s3 is not None and 90 * 60 <= s3 < 91 * 60
    assert backup is not None and 120 * 60 <= backup < 121 * 60  # since it turned Ready
    # Resumed after a long suspension: the age counts from when it trains again.
    metrics.observe(RUN, training(ready_since=moment(5)))
    s3 = age("s3")
    assert s3 is not None and 5 * 60 <= s3 < 6 * 60
    # Not training: nothing is shipped, no age.
    metrics.observe(RUN, status("Suspended", "Suspended", checkpoints=checkpoints))
    assert age("s3") is None


def test_endpoint_serves_the_metrics_when_a_port_is_set() -> None:
    assert serve({}) is None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert serve({ENV_METRICS_PORT: str(port)}) == port
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_SECONDS) as response:
        text = response.read().decode()
    assert "# TYPE trainguard_runs gauge" in text
    assert "# TYPE trainguard_detection_latency_seconds histogram" in text
    assert "python_info" in text  # the platform collector rides along
