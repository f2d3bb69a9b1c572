"""SIGKILL at every filesystem call of a save: the previous loads, a partial is never used."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from crash_driver import state

from trainguard.ckpt import scan
from trainguard_harness.reader import load_newest
from trainguard_harness.writer import CheckpointWriter

pytestmark = [pytest.mark.unit, pytest.mark.timeout(180)]


def assert_loads_as(root: Path, step: int) -> None:
    loaded = load_newest(root).loaded
    assert loaded is not None and loaded.step == step
    expected = state(step)
    for name in ("model", "optimizer", "data"):
        assert repr(loaded.components[name]) == repr(expected[name])


def test_sigkill_at_every_point_of_a_save(tmp_path: Path) -> None:
    driver = Path(__file__).with_name("crash_driver.py")
    result = subprocess.run(
        [sys.executable, str(driver), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=150,
        check=True,
    )
    report = json.loads(result.stdout)
    calls = report["calls"]
    # Files, fsyncs, manifest, rename, root fsync, keep-last removal: dozens of points.
    assert calls >= 30
    outcomes = {1: 0, 2: 0}
    for n in range(1, calls + 1):
        status = report["status"][str(n)]
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, n
        root = tmp_path / f"kill-{n}"
        found = scan(root)
        # Never a half-written checkpoint: only complete, verifying ones are visible.
        assert found.invalid == (), (n, [v.reasons for v in found.invalid])
        newest = found.newest_valid
        assert newest is not None and newest.step in (1, 2), n
        assert_loads_as(root, newest.step)
        outcomes[newest.step] += 1
        # A restarted writer clears the leftovers and saves normally.
        writer = CheckpointWriter(root, keep_last=1)
        assert scan(root).partial == ()
        writer.save(3, state(3))
        writer.close()
        assert_loads_as(root, 3)
    # Kills before the rename keep step 1, kills after it find step 2: both were exercised.
    assert outcomes[1] > 0 and outcomes[2] > 0
