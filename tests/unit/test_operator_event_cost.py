"""What each watch event costs the operator, for a gang of a thousand members starting at once.

Pod events start cycles of their run: coalesced while one waits, and paced under a storm (the
cycles, each writing the run's status, must not run back to back for the whole storm). kopf's
diff base, which it builds for every event, is built for runs only, and is then kopf's own.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from trainguard.api.constants import LABEL_RUN
from trainguard.operator import handlers

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

KEY = ("team-a", "llm")


def _storm(monkeypatch: pytest.MonkeyPatch, cycle_seconds: float, events: int) -> list[float]:
    """`events` pod events, all while the first cycle runs; the cycles' start and end times."""
    times: list[float] = []

    async def cycle(memo: Any, key: tuple[str, str]) -> None:
        assert key == KEY
        times.append(time.monotonic())
        await asyncio.sleep(cycle_seconds)
        times.append(time.monotonic())

    monkeypatch.setattr(handlers, "_cycle_key", cycle)
    memo = SimpleNamespace(records=handlers.RunRecords())
    indexes = {handlers.RUNS: {KEY: [{"metadata": {"uid": "uid-1"}}]}}

    def event() -> Any:
        return handlers.pod_changed(
            namespace=KEY[0], labels={LABEL_RUN: KEY[1]}, memo=memo, **indexes
        )

    async def scenario() -> None:
        first = asyncio.create_task(event())
        await asyncio.sleep(cycle_seconds / 4)  # the first cycle runs
        await asyncio.gather(first, *(event() for _ in range(events)))

    asyncio.run(scenario())
    return times


def test_events_during_a_cycle_make_one_more_cycle_which_waits_as_long_as_the_last_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    times = _storm(monkeypatch, cycle_seconds=0.3, events=50)
    assert len(times) == 4, times  # two cycles for 51 events
    first_end, second_start = times[1], times[2]
    took = times[1] - times[0]
    assert second_start - first_end >= took - 0.02, times


def test_the_pause_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "POD_CYCLE_PAUSE_MAX_SECONDS", 0.1)
    times = _storm(monkeypatch, cycle_seconds=0.6, events=5)
    assert len(times) == 4, times
    assert 0.08 <= times[2] - times[1] < 0.4, times


def _run_body() -> dict[str, Any]:
    return {
        "apiVersion": "trainguard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {
            "name": "llm",
            "namespace": "team-a",
            "uid": "uid-1",
            "resourceVersion": "42",
            "labels": {"team": "a"},
            "annotations": {
                "note": "kept",
                "trainguard.dev/last-handled-configuration": "{}",
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
            },
            "managedFields": [{"manager": "trainguard", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"trainer": {"nodes": 4, "image": "trainer:1"}},
        "status": {"members": [{"index": i, "phase": "Running"} for i in range(1024)]},
    }


@pytest.mark.parametrize("extra", [None, ["spec"], ["status.members"], [("metadata", "uid")]])
def test_a_runs_diff_base_is_kopfs_own(extra: list[Any] | None) -> None:
    import kopf

    ours = handlers.RunsDiffBase(prefix="trainguard.dev", key="last-handled-configuration")
    kopfs = kopf.AnnotationsDiffBaseStorage(
        prefix="trainguard.dev", key="last-handled-configuration"
    )
    body = kopf.Body(_run_body())  # type: ignore[arg-type]
    assert ours.build(body=body, extra_fields=extra) == kopfs.build(body=body, extra_fields=extra)


def test_no_diff_base_is_built_for_pods_and_leases() -> None:
    import kopf

    ours = handlers.RunsDiffBase(prefix="trainguard.dev", key="last-handled-configuration")
    for kind in ("Pod", "Lease"):
        body = kopf.Body({**_run_body(), "apiVersion": "v1", "kind": kind})  # type: ignore[arg-type]
        assert ours.build(body=body) == {}
