"""The reference trainer end to end: kill and resume, full disk, graceful stop."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from harness_helpers import fill_until_free, trainer_command, trainer_env

from trainguard.ckpt import scan
from trainguard.contract import env
from trainguard_dev.testing.polling import eventually
from trainguard_harness.heartbeat import PID, read_heartbeat

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

STEPS = 150


def losses(path: Path) -> list[tuple[int, float]]:
    return [
        (record["step"], record["loss"])
        for record in map(json.loads, path.read_text().splitlines())
    ]


def wait_for_lines(path: Path, count: int, process: subprocess.Popen[str]) -> None:
    def logged() -> bool:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return True
        assert process.poll() is None, "the trainer ended early"
        return False

    eventually(logged, 60, f"{count} lines from the trainer", 0.01)


def test_kill_and_resume_gives_the_same_loss_curve(data_dir: Path, tmp_path: Path) -> None:
    common = ("--steps", str(STEPS), "--ckpt-every-steps", "7", "--keep-last", "2")
    reference_log = tmp_path / "a" / "loss.jsonl"
    subprocess.run(
        trainer_command(data_dir, *common, "--loss-log", str(reference_log)),
        env=trainer_env(tmp_path / "a"),
        check=True,
        timeout=90,
    )
    reference = dict(losses(reference_log))
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert reference[STEPS] < reference[1]  # it learns

    # The same run under the supervisor, killed with SIGKILL partway through.
    root = tmp_path / "b"
    resumed_log = root / "loss.jsonl"
    supervise = [sys.executable, "-m", "trainguard.cli.main", "supervise", "--backoff", "0.1", "--"]
    supervisor = subprocess.Popen(
        supervise + trainer_command(data_dir, *common, "--loss-log", str(resumed_log)),
        env=trainer_env(root),
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_lines(resumed_log, 20, supervisor)
    heartbeat = read_heartbeat(root / "state" / env.HEARTBEAT_FILENAME)
    assert heartbeat is not None
    os.kill(heartbeat[PID], signal.SIGKILL)
    _, stderr = supervisor.communicate(timeout=90)
    assert supervisor.returncode == 0, stderr[-3000:]

    state = json.loads((root / "state" / "supervisor.json").read_text())
    assert [entry["signal"] for entry in state["history"]] == ["SIGKILL", None]
    # The second attempt resumed from a checkpoint, not from scratch: from L0 (the supervisor's
    # own in memory, a snapshot about every step) or from L1 (a multiple of 7).
    resumed_from = re.findall(r"resumed from \S*step-(\d{8}) \(layer (l0|l1)\)", stderr)
    assert len(resumed_from) == 1, stderr[-3000:]
    [(step, layer)] = resumed_from
    assert int(step) > 0 and (layer == "l0" or int(step) % 7 == 0), (step, layer)
    logged = losses(resumed_log)
    # Every loss ever logged (before the kill, replayed, after) matches the reference exactly.
    assert all(loss == reference[step] for step, loss in logged)
    assert {step for step, _ in logged} == set(reference)


@pytest.mark.parametrize(("policy", "exit_code"), [("continue", 0), ("stop", 1)])
def test_full_disk_fails_loudly_and_keeps_the_previous_checkpoint(
    data_dir: Path, tmp_path: Path, tmpfs: Callable[[int], Path], policy: str, exit_code: int
) -> None:
    disk = tmpfs(8 << 20)
    fill_until_free(disk, 2_200_000)  # one checkpoint (about 1.5 MB) fits, a second does not
    environ = trainer_env(tmp_path)
    environ[env.L1_DIR] = str(disk / "l1")
    result = subprocess.run(
        trainer_command(
            data_dir, "--steps", "30", "--ckpt-every-steps", "10", "--on-save-error", policy
        ),
        env=environ,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == exit_code, result.stderr[-3000:]
    assert "No space left on device" in result.stderr
    if policy == "continue":
        assert "step 30 loss" in result.stderr  # training went on to the end
    else:
        assert "step 30 loss" not in result.stderr
    found = scan(disk / "l1")
    assert [v.step for v in found.valid] == [10]
    assert found.invalid == () and found.partial == ()


# Sharded without a launcher: one rank holding the whole state, saved through DCP.
@pytest.mark.parametrize("mode", [(), ("--sharded",)], ids=["replicated", "sharded"])
def test_sigterm_saves_the_current_step_and_exits_143(
    data_dir: Path, tmp_path: Path, mode: tuple[str, ...]
) -> None:
    loss_log = tmp_path / "loss.jsonl"
    process = subprocess.Popen(
        trainer_command(
            data_dir,
            *("--steps", "100000", "--ckpt-every-steps", "0", "--loss-log", str(loss_log)),
            *mode,
        ),
        env=trainer_env(tmp_path),
        text=True,
    )
    wait_for_lines(loss_log, 5, process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    last_step = losses(loss_log)[-1][0]
    newest = scan(tmp_path / "l1").newest_valid
    assert newest is not None and newest.step == last_step
    assert newest.manifest is not None
    # A sharded checkpoint records its world (here of one rank); a replicated one none.
    assert newest.manifest.world_size == (1 if mode else None)


def test_a_step_time_floor_paces_training(data_dir: Path, tmp_path: Path) -> None:
    steps, floor = 12, 0.15
    log = tmp_path / "loss.jsonl"
    started = time.monotonic()
    subprocess.run(
        trainer_command(
            data_dir, "--steps", str(steps), "--ckpt-every-steps", "4",
            "--min-step-seconds", str(floor), "--loss-log", str(log),
        ),
        env=trainer_env(tmp_path),
        check=True,
        timeout=90,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert [step for step, _ in losses(log)] == list(range(1, steps + 1))
    assert elapsed >= steps * floor, elapsed
