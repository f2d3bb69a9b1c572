"""What the signal scenarios assert, once for every tier that runs them (process-backed, real).

Each scenario is told here as a sequence of reads and assertions over plain data (a run's
status, its Events, the operator's `/metrics` text); where a tier must act (kill the trainer,
stop the operator, read its metrics), the scenario takes a `TimedRun` the tier implements in
its own way, so that only the plumbing differs between tiers, never what is asserted:

- `assert_invalid_checkpoint_told`: a checkpoint found invalid is in `status.lastInvalidCheckpoint`,
  counted once in `status.invalidCheckpoints` and told by one Warning Event `InvalidCheckpoint`
  naming its layer, step, file and reason;
- `assert_deaths_timed_from_the_verdict`: the detection-latency histogram's observations lie
  within what the test measured itself, from the agent's verdict start to the status write;
- `assert_staged`: the data's every file staged, verified, with its progress in the status;
  `assert_data_secrets_in_stage_data_alone`: the source's credentials reach no other container.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from trainguard.api.constants import (
    ANNOTATION_VERDICT,
    ANNOTATION_VERDICT_SINCE,
    ConditionType,
    Reason,
    Verdict,
)
from trainguard.contract import env
from trainguard.initsteps import stage_data as staging
from trainguard.operator.build.constants import Container
from trainguard.operator.metrics import PREFIX
from trainguard_dev.testing.polling import eventually

Obj = dict[str, Any]

DETECTION_HISTOGRAM = f"{PREFIX}_detection_latency_seconds"
INVALID_COUNTER = f"{PREFIX}_checkpoints_invalid"
DEAD = Verdict.DEAD.value
HEALTHY = Verdict.HEALTHY.value

# The file of a reference trainer's checkpoint that the corruption scenarios damage, and what
# verification then says of it (the manifests' default hash).
VICTIM = "model.safetensors"
HASH_MISMATCH = "xxh3-128 hash mismatch"
# Reads of the status while a death is awaited: the bound is the first read that shows it.
POLL_SECONDS = 0.05
# The time the operator is stopped while the second death happens.
PAUSE_SECONDS = 4.0
# The operator reads its clock once the apiserver's answer is in: a read of the status may
# end a moment before that.
MARGIN_SECONDS = 0.25
DEATH_SEEN_TIMEOUT_S = 60.0
VERDICT_TIMEOUT_S = 10.0
RESTART_TIMEOUT_S = 90.0
HEALTHY_TIMEOUT_S = 30.0
METRICS_TIMEOUT_S = 10.0


# ----- the operator's metrics -------------------------------------------------------------


def metric_value(text: str, family: str, sample: str, labels: Mapping[str, str]) -> float:
    """The value of `sample` (a sample name of `family`) whose labels include `labels`; 0."""
    for found in text_string_to_metric_families(text):
        if found.name != family:
            continue
        for item in found.samples:
            if item.name == sample and labels.items() <= item.labels.items():
                return float(item.value)
    return 0.0


def detections(text: str, namespace: str) -> tuple[int, float]:
    """The detection-latency histogram's count and sum for the namespace (0, 0.0 before any)."""
    labels = {"namespace": namespace}
    count = metric_value(text, DETECTION_HISTOGRAM, f"{DETECTION_HISTOGRAM}_count", labels)
    total = metric_value(text, DETECTION_HISTOGRAM, f"{DETECTION_HISTOGRAM}_sum", labels)
    return int(count), total


def invalid_checkpoints(text: str, namespace: str, layer: str) -> int:
    """`trainguard_checkpoints_invalid_total` of a layer in the namespace (0 before any)."""
    labels = {"namespace": namespace, "layer": layer}
    return int(metric_value(text, INVALID_COUNTER, f"{INVALID_COUNTER}_total", labels))


# ----- a checkpoint found invalid ----------------------------------------------------------


def flip_a_byte(data: bytes) -> bytes:
    """`data` with one bit of its middle byte flipped: the size unchanged, only a hash tells."""
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x01
    return bytes(flipped)


def invalid_checkpoint_events(events: Sequence[Obj]) -> list[Obj]:
    """The run's `InvalidCheckpoint` Events among `events`."""
    return [e for e in events if e.get("reason") == Reason.INVALID_CHECKPOINT]


def assert_invalid_checkpoint_told(
    status: Obj,
    events: Sequence[Obj],
    *,
    layer: str,
    step: int,
    file: str,
    reason: str,
    found: str,
    attempt: int,
) -> None:
    """The finding is the status's last, counted once for its attempt, told by one Warning."""
    last = status.get("lastInvalidCheckpoint")
    assert last == {
        "layer": layer,
        "step": step,
        "file": file,
        "reason": reason,
        "found": found,
        "time": (last or {}).get("time"),
        "attempt": attempt,
    }, last
    assert last["time"], last
    counts = status["invalidCheckpoints"]
    assert counts == [{"layer": layer, "attempt": attempt, "count": 1}], counts
    told = invalid_checkpoint_events(events)
    assert len(told) == 1, told
    [event] = told
    assert event["type"] == "Warning", event
    assert f"layer {layer}, step {step}, {file}: {reason}" in event["message"], event["message"]


# ----- detection latency -------------------------------------------------------------------


class TimedRun(Protocol):
    """A run of the reference trainer, Healthy, and the levers a tier has on it."""

    namespace: str

    def status(self) -> Obj:
        """The run's status (empty until the operator wrote one)."""

    def heartbeat(self) -> Obj | None:
        """The trainer's heartbeat, or None before its first write."""

    def kill_trainer(self, pid: int) -> None:
        """SIGKILL the trainer process `pid` (the heartbeat's), as a crash would."""

    def lease_annotations(self) -> dict[str, str]:
        """The annotations of the run's heartbeat Lease."""

    def metrics(self) -> str:
        """The operator's `/metrics` text."""

    def pause_operator(self) -> None:
        """Stop the operator (every process of it), as SIGSTOP does."""

    def resume_operator(self) -> None:
        """Let a stopped operator run on."""


def _kill(run: TimedRun) -> tuple[Obj, float]:
    """SIGKILL the trainer; its heartbeat and the wall-clock time just before the kill."""
    beat = run.heartbeat()
    assert beat is not None and beat.get("pid"), beat
    killed = time.time()
    run.kill_trainer(int(beat["pid"]))
    return beat, killed


def _death_seen(run: TimedRun, restarts: int) -> float:
    """Poll the status until it records death number `restarts`; the time of that read's end."""

    def seen() -> float | None:
        status = run.status()
        failure = status.get("lastFailure") or {}
        done = failure.get("cause") == DEAD and status.get("restarts") == restarts
        return time.time() if done else None

    return eventually(seen, DEATH_SEEN_TIMEOUT_S, f"death {restarts} in the status", POLL_SECONDS)


def _timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _dead_since(run: TimedRun, killed: float) -> float | None:
    """The agent's start of a Dead verdict after `killed`, as its Lease says (µs), else None."""
    annotations = run.lease_annotations()
    text = annotations.get(ANNOTATION_VERDICT_SINCE)
    if annotations.get(ANNOTATION_VERDICT) != DEAD or not text:
        return None
    since = _timestamp(text)
    return since if since >= killed else None


def _observed(run: TimedRun, count: int) -> float:
    """The histogram's sum once it holds `count` observations (exactly that many)."""

    def counted() -> tuple[int, float] | None:
        found = detections(run.metrics(), run.namespace)
        return found if found[0] >= count else None

    found = eventually(counted, METRICS_TIMEOUT_S, f"{count} detection(s) in the metrics")
    assert found[0] == count, found
    return found[1]


def _healthy(run: TimedRun) -> None:
    eventually(lambda: run.status().get("verdict") == HEALTHY, HEALTHY_TIMEOUT_S, HEALTHY)


def assert_deaths_timed_from_the_verdict(run: TimedRun) -> None:
    """Two real deaths of a Healthy run, each timed from the agent's verdict start to the status.

    The first comes as it comes: its observation lies within what the test measures itself,
    the kill to the first read of the status that shows it. The second comes while the
    operator is stopped: the write recording it comes after the operator woke, and the
    observation counts from the agent's verdict start (read on the Lease meanwhile), not from
    the operator's waking. The histogram's count and sum are taken as deltas, so a namespace
    where other runs died before counts as well as a fresh one.
    """
    base_count, base_sum = detections(run.metrics(), run.namespace)
    restarts = int(run.status().get("restarts") or 0)

    first, killed = _kill(run)
    seen = _death_seen(run, restarts + 1)
    latency = _observed(run, base_count + 1) - base_sum
    recorded = run.status()["lastFailure"]["since"]
    print(f"death 1: status seen {seen - killed:.3f} s after the kill; observed {latency:.3f} s")
    assert 0 < latency <= seen - killed + MARGIN_SECONDS
    # The record keeps the agent's verdict start (to the second): after the kill.
    assert int(killed) <= _timestamp(recorded)

    def restarted() -> Obj | None:
        beat = run.heartbeat()
        fresh = beat and beat["pid"] != first["pid"] and beat.get("step") is not None
        return beat if fresh else None

    eventually(restarted, RESTART_TIMEOUT_S, "the trainer restarted in place", 0.1)
    _healthy(run)
    run.pause_operator()
    try:
        _, killed = _kill(run)
        since = eventually(
            lambda: _dead_since(run, killed), VERDICT_TIMEOUT_S, "the agent's Dead", 0.1
        )
        time.sleep(max(0.0, killed + PAUSE_SECONDS - time.time()))
        woken = time.time()
    finally:
        run.resume_operator()
    seen = _death_seen(run, restarts + 2)
    second = _observed(run, base_count + 2) - base_sum - latency
    print(
        f"death 2: verdict {since - killed:.3f} s after the kill, operator woken after "
        f"{woken - killed:.3f} s, status seen after {seen - killed:.3f} s; "
        f"observed {second:.3f} s"
    )
    assert woken - since <= second <= seen - since + MARGIN_SECONDS


# ----- data staging ------------------------------------------------------------------------


def condition(run: Obj, kind: str) -> Obj | None:
    """A condition of a run's status."""
    for found in run.get("status", {}).get("conditions", []):
        if found["type"] == kind:
            return dict(found)
    return None


def assert_staged(run: Obj, files: Sequence[Path]) -> None:
    """The run's data staged: every one of `files` (the source's), verified, in the status."""
    done = run["status"]["staging"]
    assert done["phase"] == staging.COMPLETE, done
    assert done["filesDone"] == done["filesTotal"] == len(files), done
    assert done["bytesDone"] == sum(p.stat().st_size for p in files), done
    staged = condition(run, ConditionType.DATA_STAGED)
    assert staged is not None, run["status"].get("conditions")
    assert (staged["status"], staged["reason"]) == ("True", Reason.DATA_STAGED), staged


def assert_data_secrets_in_stage_data_alone(pod: Obj) -> None:
    """The data source's Secret is named to the `stage-data` step and to no other container."""
    spec = pod["spec"]
    for container in [*spec["initContainers"], *spec["containers"]]:
        names = {item["name"] for item in container.get("env", [])}
        assert (env.DATA_SECRETS in names) == (container["name"] == Container.STAGE_DATA), container
