"""Prometheus metrics of the operator, derived from the TrainingRun statuses it writes.

The metrics watch runs the way any client does (a kopf event handler on TrainingRuns), so
they count exactly what `kubectl get tr` and Argo CD see. Counters move on changes between
two statuses of the same run; the first status seen of a run (operator start) is a
baseline, so a restart of the operator does not count a run's history again. Gauges are
computed at scrape time from the latest statuses.

The detection latency is the exception (a status keeps times to the second and reaches the
watch after the write): the cycle reports it (`Settings.detected`) at the apiserver's answer
to the status write that records a failure, timed from the failure's first sight, the
agent's verdict start (`verdict-since`) or, for `LeaseExpired`, the Lease's expiry
(`renewTime + leaseDurationSeconds`). Those are the agent's clock, the write the operator's:
skew that puts the start after the write reads 0. A failed pod (`PodFailed`,
`PreflightFailed`) has no such start and is not observed (`failures.detection_seconds`).
The record is written once, so each failure is observed once.

| metric | type | labels |
|---|---|---|
| `trainguard_runs` | gauge | namespace, phase |
| `trainguard_verdicts_total` | counter | namespace, verdict |
| `trainguard_actions_total` | counter | namespace, action, reason |
| `trainguard_detection_latency_seconds` | histogram | namespace |
| `trainguard_restarts_total` | counter | namespace |
| `trainguard_reschedules_total` | counter | namespace |
| `trainguard_checkpoint_age_seconds` | gauge | namespace, run, layer |
| `trainguard_verified_checkpoint_age_seconds` | gauge | namespace, run, layer |
| `trainguard_checkpoints_invalid_total` | counter | namespace, layer |
| `trainguard_nodes_excluded` | gauge | reason |

Invalid checkpoints are counted from `status.invalidCheckpoints`, the current attempt's count
per layer with the attempt that counted: between two statuses of a run, what a layer's count
of the same attempt grew by, and all of a new attempt's count. The status itself is the record
of what was counted, so a repeated cycle counts nothing twice and neither does a restarted
operator (its first status of a run is the baseline, like every counter's); an agent
restarted in its pod counts again what it tells again (the restore step's findings).

The endpoint (`/metrics`) is served on `$TRAINGUARD_METRICS_PORT` when that is set (the
chart sets it from `metrics.port`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import ValidationError

from trainguard.api import TrainingRunStatus
from trainguard.api.constants import (
    GROUP,
    L0_LAYER,
    L1_LAYER,
    PLURAL,
    VERSION,
    ConditionType,
    Phase,
    Reason,
)
from trainguard.api.status import InvalidCheckpointCount
from trainguard.operator.conditions import find, state_reason

log = logging.getLogger(__name__)

ENV_METRICS_PORT = "TRAINGUARD_METRICS_PORT"
METRICS_ADDRESS = "0.0.0.0"
PREFIX = "trainguard"
# First sight to status: the target is 2 s median and 5 s p99 (DESIGN), the anchors minutes.
LATENCY_BUCKETS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 1200.0)
# kopf's watch event type of a deleted object.
DELETED = "DELETED"
# `reason` label of an action not caused by a failure (a new run, a suspend, a spec change).
NO_FAILURE = "None"
# The pod's own layers (memory, local disk): no remote copy whose age the verified gauge tracks.
LOCAL_LAYERS = frozenset({L0_LAYER, L1_LAYER})

RunKey = tuple[str, str]


class Metrics(Collector):
    """The operator's metrics: counters updated per status change, gauges at scrape time."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._lock = threading.Lock()
        self._runs: dict[RunKey, TrainingRunStatus] = {}
        self.verdicts = Counter(
            f"{PREFIX}_verdicts",
            "Verdicts of the agents as the runs' status reported them, by verdict.",
            ["namespace", "verdict"],
            registry=registry,
        )
        self.actions = Counter(
            f"{PREFIX}_actions",
            "What the operator did with a run (the reason of its state), and the failure "
            "that caused it (status.lastFailure.cause, None when no failure did).",
            ["namespace", "action", "reason"],
            registry=registry,
        )
        self.detection = Histogram(
            f"{PREFIX}_detection_latency_seconds",
            "From a failure's first sight (the agent's verdict start; for LeaseExpired, the "
            "Lease's expiry) to the status write recording it; clock skew below 0 reads 0.",
            ["namespace"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.restarts = Counter(
            f"{PREFIX}_restarts", "Restarts of runs, of any kind.", ["namespace"], registry=registry
        )
        self.reschedules = Counter(
            f"{PREFIX}_reschedules",
            "Moves of runs to another node.",
            ["namespace"],
            registry=registry,
        )
        self.invalid = Counter(
            f"{PREFIX}_checkpoints_invalid",
            "Checkpoints the runs' pods found invalid (restore, shipping, the trainer's L1 "
            "scans), by layer (status.invalidCheckpoints).",
            ["namespace", "layer"],
            registry=registry,
        )
        registry.register(self)

    def observe(self, key: RunKey, status: TrainingRunStatus) -> None:
        """Take in a run's status: count what changed since the last one seen."""
        with self._lock:
            previous = self._runs.get(key)
            self._runs[key] = status
        if previous is not None:
            self._count(key[0], previous, status)

    def detected(self, namespace: str, seconds: float) -> None:
        """A failure recorded in a run's status, `seconds` after its first sight."""
        self.detection.labels(namespace).observe(seconds)

    def forget(self, key: RunKey) -> None:
        """Drop a deleted run from the gauges."""
        with self._lock:
            self._runs.pop(key, None)

    def _count(self, namespace: str, old: TrainingRunStatus, new: TrainingRunStatus) -> None:
        if new.verdict is not None and new.verdict != old.verdict:
            self.verdicts.labels(namespace, new.verdict).inc()
        failure = new.last_failure
        new_failure = failure is not None and failure != old.last_failure
        action = state_reason(new)
        if action is not None and action != state_reason(old):
            cause = failure.cause if failure is not None and new_failure else NO_FAILURE
            self.actions.labels(namespace, action, cause).inc()
            if action == Reason.RESCHEDULING:
                self.reschedules.labels(namespace).inc()
        if new.restarts > old.restarts:
            self.restarts.labels(namespace).inc(new.restarts - old.restarts)
        for layer, told in newly_invalid(old.invalid_checkpoints, new.invalid_checkpoints):
            self.invalid.labels(namespace, layer).inc(told)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The gauges, from the latest status of every run (called at each scrape)."""
        with self._lock:
            runs = dict(self._runs)
        now = datetime.now(UTC)
        yield _runs_by_phase(runs)
        yield _checkpoint_ages(runs, now)
        yield _verified_ages(runs, now)
        yield _nodes_excluded(runs.values())


def newly_invalid(
    old: Iterable[InvalidCheckpointCount], new: Iterable[InvalidCheckpointCount]
) -> list[tuple[str, int]]:
    """Per layer, the invalid checkpoints counted in `new` and not in `old` (module docstring)."""
    before = {(count.layer, count.attempt): count.count for count in old}
    grown = ((c.layer, c.count - before.get((c.layer, c.attempt), 0)) for c in new)
    return [(layer, told) for layer, told in grown if told > 0]


def _runs_by_phase(runs: Mapping[RunKey, TrainingRunStatus]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        f"{PREFIX}_runs", "TrainingRuns by status.phase.", labels=["namespace", "phase"]
    )
    tally = Tally((key[0], status.phase or Phase.PENDING) for key, status in runs.items())
    for (namespace, phase), count in sorted(tally.items()):
        family.add_metric([namespace, phase], count)
    return family


def _checkpoint_ages(runs: Mapping[RunKey, TrainingRunStatus], now: datetime) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        f"{PREFIX}_checkpoint_age_seconds",
        "Age of each run's newest checkpoint, per layer.",
        labels=["namespace", "run", "layer"],
    )
    for (namespace, name), status in sorted(runs.items()):
        for layer in status.checkpoints:
            if layer.time is not None:
                age = max((now - layer.time).total_seconds(), 0.0)
                family.add_metric([namespace, name, layer.layer], age)
    return family


def _verified_ages(runs: Mapping[RunKey, TrainingRunStatus], now: datetime) -> GaugeMetricFamily:
    """How long each training run's remote layers have gone without a newer verified checkpoint.

    Only for runs in phase Running: a suspended, finished or recovering run ships nothing. The
    age counts from the layer's newest verified checkpoint (when the operator first saw it), or
    from when the run last turned Ready if that is later (a layer that never verified one, a
    run resumed after a suspension): the time it has trained since without a newer one.
    """
    family = GaugeMetricFamily(
        f"{PREFIX}_verified_checkpoint_age_seconds",
        "Seconds a Running run has trained since the newest checkpoint verified on each remote "
        "layer (since it last turned Ready, if later).",
        labels=["namespace", "run", "layer"],
    )
    for (namespace, name), status in sorted(runs.items()):
        ready = find(status.conditions, ConditionType.READY)
        if status.phase != Phase.RUNNING or ready is None:
            continue
        for layer in status.checkpoints:
            if layer.layer in LOCAL_LAYERS:
                continue
            since = max(ready.last_transition_time, layer.time or ready.last_transition_time)
            family.add_metric(
                [namespace, name, layer.layer], max((now - since).total_seconds(), 0.0)
            )
    return family


def _nodes_excluded(runs: Iterable[TrainingRunStatus]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        f"{PREFIX}_nodes_excluded",
        "Nodes excluded from runs (tainted unhealthy), by the reason of their first exclusion.",
        labels=["reason"],
    )
    first: dict[str, tuple[datetime, str]] = {}
    for status in runs:
        for excluded in status.excluded_nodes:
            known = first.get(excluded.node)
            if known is None or excluded.time < known[0]:
                first[excluded.node] = (excluded.time, excluded.reason)
    for reason, count in sorted(Tally(reason for _, reason in first.values()).items()):
        family.add_metric([reason], count)
    return family


REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
METRICS = Metrics(REGISTRY)


def serve(environ: Mapping[str, str] = os.environ) -> int | None:
    """Serve /metrics on $TRAINGUARD_METRICS_PORT; return the port, None when unset."""
    port = environ.get(ENV_METRICS_PORT)
    if not port:
        return None
    start_http_server(int(port), addr=METRICS_ADDRESS, registry=REGISTRY)
    log.info("serving metrics on %s:%s/metrics", METRICS_ADDRESS, port)
    return int(port)


@kopf.on.startup()
def start_metrics(**_: Any) -> None:
    """Start the metrics endpoint with the operator."""
    serve()


@kopf.on.event(GROUP, VERSION, PLURAL)
def run_event(
    *, type: str | None, body: kopf.Body, namespace: str | None, name: str, **_: Any
) -> None:
    """Every change of a run: its status feeds the metrics; a deletion drops it."""
    key = (namespace or "", name)
    if type == DELETED:
        METRICS.forget(key)
        return
    try:
        status = TrainingRunStatus.from_object(dict(body.get("status") or {}))
    except ValidationError as err:
        # A status the operator did not write (or an older schema): not worth a failed event.
        log.debug("metrics skip %s/%s: %s", key[0], key[1], err)
        return
    METRICS.observe(key, status)
