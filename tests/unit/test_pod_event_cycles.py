"""Pod events start cycles of their run: coalesced while one waits, and paced under a storm.

A thousand members starting at once send several events each; the operator's cycles of that
run (each writing its status) must not run back to back for the whole storm.
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
