"""The agent's wake on the supervisor's state file (`trainguard.agent.wake`), on real inotify."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trainguard.agent.wake import StateFileWake
from trainguard.contract.files import write_json

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def _later(seconds: float, action: object) -> threading.Timer:
    timer = threading.Timer(seconds, action)  # type: ignore[arg-type]
    timer.start()
    return timer


def test_replacing_the_file_cuts_the_wait_short(tmp_path: Path) -> None:
    watched = tmp_path / "supervisor.json"
    wake = StateFileWake(watched)
    assert wake.watching
    timer = _later(0.2, lambda: write_json(watched, {"state": "backoff"}))
    try:
        started = time.monotonic()
        assert wake.wait(10.0) is True
        assert time.monotonic() - started < 5.0
    finally:
        timer.cancel()
        wake.close()


def test_other_files_of_the_directory_do_not_wake_it(tmp_path: Path) -> None:
    wake = StateFileWake(tmp_path / "supervisor.json")
    timer = _later(0.1, lambda: write_json(tmp_path / "heartbeat.json", {"step": 1}))
    try:
        started = time.monotonic()
        assert wake.wait(0.6) is False
        assert time.monotonic() - started >= 0.6
    finally:
        timer.cancel()
        wake.close()


def test_a_change_before_the_wait_is_not_lost(tmp_path: Path) -> None:
    # The supervisor may write between two looks: the next wait returns at once.
    watched = tmp_path / "supervisor.json"
    wake = StateFileWake(watched)
    try:
        write_json(watched, {"state": "running"})
        started = time.monotonic()
        assert wake.wait(10.0) is True
        assert time.monotonic() - started < 1.0
    finally:
        wake.close()


def test_without_a_directory_to_watch_the_wait_is_a_sleep(tmp_path: Path) -> None:
    wake = StateFileWake(tmp_path / "missing" / "supervisor.json")
    assert not wake.watching
    started = time.monotonic()
    assert wake.wait(0.3) is False
    assert time.monotonic() - started >= 0.3
