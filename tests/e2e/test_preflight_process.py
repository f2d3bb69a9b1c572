"""Preflight and staging, end to end on process-backed nodes: a sick node is left before training.

The run's first attempt is placed on node A (node B is cordoned until A holds the pod, then
uncordoned: the run's own placement is never changed). A has one real fault:
- `corrupt`: A's disk corrupts data at rest. The preflight's documented fault hook, switched
  on for node A only through its env override (``procnodes/A/env.json``), flips a byte of the
  test file on the disk between its close and its read-back;
- `space`: A's pod storage is a real 256 MiB filesystem (a tmpfs mounted over A's pods
  directory, where every emptyDir of a pod on A lives), smaller than one margin of free space
  the run needs beside its checkpoints: preflight's statvfs sees the small disk;
- `ghost`: A's simulated GPU holds 30 GiB that no process accounts for (``gpu-sim.json``).

In each case the preflight fails on A, the operator lists A in `status.excludedNodes` with
reason `PreflightFailed` and the evidence in an Event, and the next attempt lands on B and
trains; no training process ever ran on A. A is tainted for every run only when the
operator's own node check on A fails too (the default `confirmed` policy): a corrupting disk
and ghost memory are; a disk merely too small for this run passes the check and is not. On
B, staging is made slow through B's env override (the stage-data step's documented
slow-source hook), so its progress can be seen reaching the status while it runs; the
figures of B's preflight and the staging outcome are then in the status and in `kubectl
describe tr`. Both nodes' bandwidth floors are lowered to 5 MB/s (the preflight's per-node
setting, in the same env override): this machine's disk, shared by the whole test run, may
fall below the production floor.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, condition, events_of, get_json, pods_of

from trainguard.api.constants import LABEL_NODE_HEALTH, TAINT_UNHEALTHY
from trainguard.initsteps import preflight
from trainguard.initsteps import stage_data as staging
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.procnode import ENV_FILENAME, GPU_SIM_FILENAME
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SHARDS = 24
# Per file, on B: 24 files over 4 streams take about 6 s, long enough to watch.
SLOW_FILE_SECONDS = 1.0
SMALL_DISK_BYTES = 256 * 2**20
GHOST_MIB = 30000
TEST_FLOOR_MBPS = "5"


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """Synthetic token shards, the run's data source (file://)."""
    return make_shards(tmp_path / "shards", shards=SHARDS, tokens=20_000, seed=3)


def _run(name: str, shards: Path) -> dict[str, Any]:
    return reference_run(name, shards, 20, {"monitor": {"startupGraceSeconds": 5}})


def _node_dir(cluster: Cluster, node: str) -> Path:
    return cluster.root / "procnodes" / node


def _write_env(cluster: Cluster, node: str, values: dict[str, str]) -> None:
    # Both nodes are this shared test machine's disk, whose bandwidth under a loaded test
    # run can fall below the production floor (50 MB/s): the floors are set for this node
    # class, so only the fault under test fails a preflight.
    floors = {preflight.MIN_WRITE_ENV: TEST_FLOOR_MBPS, preflight.MIN_READ_ENV: TEST_FLOOR_MBPS}
    (_node_dir(cluster, node) / ENV_FILENAME).write_text(json.dumps({**floors, **values}))


@pytest.fixture
def small_disk(cluster: Cluster) -> Iterator[Any]:
    """Mount a small real filesystem over a node's pods directory; unmounted afterwards."""
    mounted: list[Path] = []

    def mount(node: str) -> Path:
        point = _node_dir(cluster, node) / "pods"
        point.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK_BYTES}", "tmpfs", str(point)],
            check=True,
        )
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=True)


@pytest.fixture
def cordoned(cluster: Cluster) -> Iterator[Any]:
    """Cordon nodes for a while; every node cordoned here is uncordoned afterwards."""
    held: set[str] = set()

    def cordon(node: str, on: bool) -> None:
        cluster.kubectl("cordon" if on else "uncordon", node)
        (held.add if on else held.discard)(node)

    yield cordon
    for node in held:
        cluster.kubectl("uncordon", node, check=False)


def _status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = get_json(cluster, "tr", name, "-n", namespace).get("status", {})
    return status


@pytest.fixture
def status_samples(cluster: Cluster, namespace: str) -> Iterator[Any]:
    """Sample a run's status in the background from the moment `start(name)` is called.

    Staging on the healthy node runs while the test still checks the sick one (its node
    check can take longer than the staging): sampling from the start sees the progress
    whenever it runs. The sampler stops afterwards.
    """
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def sample(name: str) -> None:
        while not stop.is_set():
            # A kubectl call cut short is skipped; the next sample is a fraction later.
            with contextlib.suppress(subprocess.SubprocessError, ValueError):
                samples.append(_status(cluster, namespace, name))
            stop.wait(0.2)

    def start(name: str) -> list[dict[str, Any]]:
        thread = threading.Thread(target=sample, args=(name,), daemon=True)
        thread.start()
        threads.append(thread)
        return samples

    yield start
    stop.set()
    for thread in threads:
        thread.join(timeout=10)


_AGE_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def _age_seconds(event_line: str) -> int:
    """The age `kubectl describe` shows for an Event line ("12s", "2m3s", "3h"), in seconds."""
    age = event_line.split()[2]
    parts = re.findall(r"(\d+)([dhms])", age)
    assert parts and "".join(n + u for n, u in parts) == age, event_line
    return sum(int(n) * _AGE_UNITS[u] for n, u in parts)


def _pod_dirs(cluster: Cluster, node: str, namespace: str) -> list[Path]:
    return sorted((_node_dir(cluster, node) / "pods").glob(f"{namespace}_*"))


@pytest.mark.parametrize("operator", ["chart-rbac"], indirect=True)
@pytest.mark.parametrize(
    ("fault", "failure"),
    [
        ("corrupt", preflight.Failure.STORAGE_CORRUPT),
        ("space", preflight.Failure.INSUFFICIENT_SPACE),
        ("ghost", preflight.Failure.GPU_MEMORY_HELD),
    ],
)
def test_a_node_failing_preflight_is_excluded_and_the_run_trains_elsewhere(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    shards: Path,
    process_nodes: list[str],
    small_disk: Any,
    cordoned: Any,
    status_samples: Any,
    fault: str,
    failure: str,
) -> None:
    sick, healthy = process_nodes[0], process_nodes[1]
    _write_env(cluster, sick, {})
    if fault == "corrupt":
        _write_env(cluster, sick, {preflight.INJECT_ENV: preflight.INJECT_CORRUPT_READBACK})
    elif fault == "space":
        small_disk(sick)
    else:
        (_node_dir(cluster, sick) / GPU_SIM_FILENAME).write_text(
            json.dumps({"ghost_mib": GHOST_MIB})
        )
    _write_env(cluster, healthy, {staging.INJECT_ENV: f"slow-files:{SLOW_FILE_SECONDS}"})
    name = f"pf-{fault}"

    # The first attempt goes to the sick node: the healthy one is cordoned until then.
    cordoned(healthy, True)
    apply(cluster, namespace, _run(name, shards))

    def first_pod() -> dict[str, Any] | None:
        pods = pods_of(cluster, namespace, name)
        return next((p for p in pods if p["spec"].get("nodeName")), None)

    pod = eventually(first_pod, timeout=60, what="the first pod bound")
    assert pod["spec"]["nodeName"] == sick
    samples = status_samples(name)
    cordoned(healthy, False)

    # A is excluded for PreflightFailed, tainted, with the evidence in an Event.
    def excluded() -> list[dict[str, Any]] | None:
        nodes = _status(cluster, namespace, name).get("excludedNodes") or []
        return nodes or None

    (entry,) = eventually(excluded, timeout=90, what=f"{sick} in status.excludedNodes")
    assert (entry["node"], entry["reason"]) == (sick, "PreflightFailed")

    # Tainted for every run once the operator's own node check on A fails too: the check
    # runs preflight there, on the same disk and GPU.
    def tainted() -> bool:
        taints = get_json(cluster, "node", sick)["spec"].get("taints") or []
        ours = {"key": TAINT_UNHEALTHY, "value": "PreflightFailed", "effect": "NoSchedule"}
        return ours in [{k: t.get(k) for k in ("key", "value", "effect")} for t in taints]

    def held() -> bool:
        labels = get_json(cluster, "node", sick)["metadata"].get("labels") or {}
        return LABEL_NODE_HEALTH in labels

    if fault == "space":
        # Too small for this run's checkpoints is not broken: the check passes, no taint.
        eventually(lambda: not held(), timeout=60, what=f"{sick}'s node check passed")
        assert not tainted()
    else:
        eventually(tainted, timeout=60, what=f"{sick} tainted after its node check")
    evidence = [e for e in events_of(cluster, namespace, name) if e["reason"] == "PreflightFailed"]
    assert evidence and evidence[0]["type"] == "Warning"
    assert failure in evidence[0]["message"], evidence[0]["message"]
    status = _status(cluster, namespace, name)
    assert status["lastFailure"]["cause"] == "PreflightFailed"
    assert status["lastFailure"]["node"] == sick

    # The next attempt stages on B: its progress reaches the status while staging runs (the
    # status was sampled since B was uncordoned, as the staging may run during A's checks).
    def staged() -> dict[str, Any] | None:
        current = _status(cluster, namespace, name)
        progress = current.get("staging") or {}
        done = progress.get("attempt") == 2 and progress.get("phase") == staging.COMPLETE
        return current if done else None

    status = eventually(staged, timeout=120, what="attempt 2 staged on the healthy node")
    seen_running = [
        {**current["staging"], "condition": condition({"status": current}, "DataStaged")}
        for current in list(samples)
        if (current.get("staging") or {}).get("attempt") == 2
        and current["staging"].get("phase") == staging.COPYING
    ]
    partial = [
        p
        for p in seen_running
        if 0 < p.get("bytesDone", 0) < p["bytesTotal"] and p["filesDone"] < SHARDS
    ]
    assert partial, f"no progress seen while staging ran: {seen_running}"
    live = partial[0]
    assert live["bytesPerSecond"] > 0 and live.get("etaSeconds") is not None, live
    assert live["condition"]["status"] == "False" and live["condition"]["reason"] == "StagingData"
    assert "files" in live["condition"]["message"] and "ETA" in live["condition"]["message"]
    done = status["staging"]
    assert done["filesDone"] == done["filesTotal"] >= SHARDS
    assert done["bytesDone"] == done["bytesTotal"] > 0
    assert done["copied"] == done["filesTotal"] and done["recopies"] == 0
    staged_condition = condition({"status": status}, "DataStaged")
    assert staged_condition is not None and staged_condition["status"] == "True"
    assert staged_condition["reason"] == "DataStaged"

    # B's preflight figures are in the status.
    result = status["preflight"]
    assert (result["attempt"], result["node"], result["passed"]) == (2, healthy, True)
    assert result["writeMbps"] > 0 and result["readMbps"] > 0
    assert result["freeBytes"] > result["needBytes"] > 0
    assert result["gpu"] == "pass"
    passed = condition({"status": status}, "Preflight")
    assert passed is not None and (passed["status"], passed["reason"]) == (
        "True",
        "PreflightPassed",
    )
    assert "MB/s" in passed["message"] and "free" in passed["message"]

    # The agent carries both summaries in the Lease, in well under 1 KiB together.
    lease = get_json(cluster, "lease", f"{name}-heartbeat", "-n", namespace)
    annotations = lease["metadata"]["annotations"]
    carried = [annotations[f"trainguard.dev/{key}"] for key in ("preflight", "staging")]
    assert json.loads(carried[0])["passed"] is True
    assert sum(len(text.encode()) for text in carried) < 1024, carried

    # ... and it trains there.
    def training() -> dict[str, Any] | None:
        current = _status(cluster, namespace, name)
        ok = current.get("node") == healthy and (current.get("step") or 0) > 0
        return current if ok else None

    eventually(training, timeout=120, what="training on the healthy node")
    assert [p["spec"]["nodeName"] for p in pods_of(cluster, namespace, name)] == [healthy]

    # No training process ever ran on A: its pod never got past preflight.
    (sick_pod,) = _pod_dirs(cluster, sick, namespace)
    assert (sick_pod / "preflight.log").exists()
    assert not (sick_pod / "trainer.log").exists()
    assert not (sick_pod / "volumes" / "state" / "heartbeat.json").exists()

    # `kubectl describe tr` tells the story: the exclusion, both conditions with their
    # figures, the status objects, and the Events in order.
    described = cluster.kubectl("describe", "tr", name, "-n", namespace).stdout
    for pattern in (
        rf"Excluded Nodes:\s+Node:\s+{sick}\s+Reason:\s+PreflightFailed",
        r"Message:\s+passed \(attempt 2 on \S+\): write [\d.]+ MB/s, read [\d.]+ MB/s; "
        r"[\d.]+ \w+ free, [\d.]+ \w+ needed; GPU check pass.*\n.*\n\s+Reason:\s+PreflightPassed"
        r"\s+Status:\s+True\s+Type:\s+Preflight",
        r"Message:\s+verified \(attempt 2\): (\d+)/\1 files.*copied \d+, re-copied 0\n.*\n"
        r"\s+Reason:\s+DataStaged\s+Status:\s+True\s+Type:\s+DataStaged",
        rf"Last Failure:\s+Attempt:\s+1\s+Cause:\s+PreflightFailed\s+Message:\s+{failure} ",
        r"Preflight:\s+Attempt:\s+2\s+Free Bytes:\s+\d+",
        r"Read Mbps:\s+[\d.]+\s+Write Mbps:\s+[\d.]+",
        r"Staging:\s+Attempt:\s+2\s+Bytes Done:\s+\d+",
    ):
        assert re.search(pattern, described), f"{pattern!r} not in:\n{described}"
    events = described[described.index("Events:") :]
    told = [
        re.search(rf"(Warning|Normal)\s+{reason}\s+.*", events)
        for reason in ("PreflightFailed", "PreflightPassed", "StagingData", "DataStaged")
    ]
    assert all(told), events
    lines = [m.group(0) for m in told if m is not None]
    assert (
        lines[0].startswith("Warning") and f"evidence: {failure} (attempt 1 on {sick})" in lines[0]
    )
    # Causal order, by each Event's age: Events within the same second are listed either way,
    # so an older Event has an age no smaller than a newer one's, never a fixed place in the list.
    age = [_age_seconds(line) for line in lines]  # PreflightFailed, Passed, StagingData, Staged
    assert age[0] >= max(age[1:]) and min(age[1], age[2]) >= age[3], events

    if fault == "ghost":
        _remediated(cluster, sick, tainted)


def _remediated(cluster: Cluster, node: str, tainted: Any) -> None:
    """A tainted node is re-checked: still failing it stays tainted; clean, it comes back."""

    def annotations() -> dict[str, str]:
        notes: dict[str, str] = get_json(cluster, "node", node)["metadata"].get("annotations")
        return notes or {}

    # The operator's re-checks (every few seconds here) still find the ghost memory.
    eventually(
        lambda: int(annotations().get("trainguard.dev/failed-checks", "0")) >= 2,
        timeout=60,
        what=f"{node} checked again and still failing",
    )
    assert tainted()
    notes = annotations()
    assert notes["trainguard.dev/last-check"].startswith("failed: "), notes
    described = cluster.kubectl("describe", "node", node).stdout
    # Why it is tainted and when it was last checked, where an administrator looks.
    for told in ("unhealthy-reason: PreflightFailed reported by run", "last-check-time:"):
        assert told in described, described
    for reason in ("NodeSuspected", "NodeTainted", "NodeCheckFailed"):
        assert re.search(rf"Warning\s+{reason}\s", described), described
    # The GPU clean again (as a reboot leaves it): the next check passes, the taint goes.
    (_node_dir(cluster, node) / GPU_SIM_FILENAME).write_text(json.dumps({"ghost_mib": 0}))
    eventually(lambda: not tainted(), timeout=60, what=f"{node} untainted")
    described = cluster.kubectl("describe", "node", node).stdout
    assert re.search(r"Normal\s+NodeUntainted\s", described), described
    assert "trainguard.dev/node-health" not in get_json(cluster, "node", node)["metadata"]["labels"]
