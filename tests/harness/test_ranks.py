"""Two ranks in one pod: DDP on CPU (gloo) under the real supervisor and PyTorch's launcher.

SIGKILL of rank 1: the launcher ends rank 0, the supervisor records rank 1's failure, leaves no
rank of the old launch alive, and restarts both together; both resume from the same verified
step, and every loss logged (before the kill, replayed, after) is the uninterrupted run's.

The output of the supervisor and its ranks goes to a file, never to a pipe nobody reads while
they run: a full pipe blocks the rank that writes to it, and with it every rank waiting in a
collective.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness_helpers import trainer_command, trainer_env

from trainguard.contract import env
from trainguard.contract.env import PodEnv
from trainguard.contract.files import (
    RankFailure,
    read_json,
    read_rank_failure,
    read_rank_pids,
)
from trainguard_dev.testing.polling import eventually
from trainguard_harness import heartbeat as hb
from trainguard_harness.launcher import ended

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]

STEPS = 60
EVERY = 5
# Generous for two cores under load: each start imports torch in the launcher and both ranks.
START_S = 120


def losses(path: Path) -> list[tuple[int, float]]:
    return [
        (record["step"], record["loss"])
        for record in map(json.loads, path.read_text().splitlines())
    ]


def supervise(root: Path, data_dir: Path, loss_log: Path, *options: str) -> subprocess.Popen[str]:
    """`trainguard supervise` of the tiny trainer on 2 ranks; output to `root/output.log`."""
    environ = {**trainer_env(root), env.PROCS_PER_NODE: "2", "PYTHONUNBUFFERED": "1"}
    (root / "state").mkdir(parents=True)
    common = (
        "--steps", str(STEPS), "--ckpt-every-steps", str(EVERY), "--keep-last", "3",
        "--min-step-seconds", "0.05", "--loss-log", str(loss_log),
    )  # fmt: skip
    output = (root / "output.log").open("w")
    command = [
        sys.executable, "-m", "trainguard.cli.main", "supervise", "--no-gpu", *options, "--",
        *trainer_command(data_dir, *common),
    ]  # fmt: skip
    return subprocess.Popen(
        command, env=environ, stdout=output, stderr=subprocess.STDOUT, text=True
    )


def finish(process: subprocess.Popen[str], root: Path) -> None:
    try:
        process.wait(timeout=2 * START_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert process.returncode == 0, (root / "output.log").read_text()[-4000:]


def rank_beat(pod: PodEnv, rank: int) -> dict[str, Any] | None:
    return read_json(pod.rank_heartbeat(rank))


def test_two_ranks_restart_together_from_the_same_step_after_one_is_killed(
    data_dir: Path, tmp_path: Path
) -> None:
    reference_log = tmp_path / "a" / "loss.jsonl"
    finish(supervise(tmp_path / "a", data_dir, reference_log), tmp_path / "a")
    reference = dict(losses(reference_log))
    assert sorted(reference) == list(range(1, STEPS + 1))

    root = tmp_path / "b"
    resumed_log = root / "loss.jsonl"
    supervisor = supervise(root, data_dir, resumed_log, "--backoff", "0.2")
    pod = PodEnv.from_env({env.STATE_DIR: str(root / "state"), env.PROCS_PER_NODE: "2"})
    try:

        def past_a_checkpoint() -> dict[int, int] | None:
            assert supervisor.poll() is None, (root / "output.log").read_text()[-4000:]
            ranks = read_rank_pids(pod.supervisor_file)
            beats = [rank_beat(pod, rank) for rank in (0, 1)]
            if len(ranks) != 2 or any(beat is None for beat in beats):
                return None
            # Each rank's heartbeat is its own process's; rank 0 has saved (and verified) the
            # checkpoint of step 2 * EVERY, and both ranks are past it.
            mine = all(beat[hb.PID] == ranks[rank] for rank, beat in enumerate(beats) if beat)
            steps = [beat[hb.STEP] or 0 for beat in beats if beat]
            saved = beats[0][hb.LAST_CHECKPOINT_STEP] if beats[0] else None
            past = saved is not None and saved >= 2 * EVERY and min(steps) > saved + 2
            return ranks if mine and past else None

        first = eventually(past_a_checkpoint, START_S, "both ranks past a checkpoint", 0.05)
        os.kill(first[1], signal.SIGKILL)

        def restarted() -> dict[int, int] | None:
            assert supervisor.poll() is None, (root / "output.log").read_text()[-4000:]
            ranks = read_rank_pids(pod.supervisor_file)
            new = len(ranks) == 2 and not set(ranks.values()) & set(first.values())
            return ranks if new else None

        second = eventually(restarted, START_S, "both ranks restarted", 0.05)
        # No rank of the first launch is left: rank 0 was ended with it.
        assert all(ended(pid)[0] for pid in first.values())
        failure = read_rank_failure(pod.supervisor_file)
        assert failure == RankFailure(rank=1, pid=first[1], signal="SIGKILL")

        def advancing() -> bool:
            beats = [rank_beat(pod, rank) for rank in (0, 1)]
            return all(
                beat is not None and beat[hb.PID] == second[rank] and beat[hb.STEP]
                for rank, beat in enumerate(beats)
            )

        eventually(advancing, START_S, "both restarted ranks training", 0.05)
        finish(supervisor, root)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(10)

    output = (root / "output.log").read_text()
    state = json.loads(pod.supervisor_file.read_text())
    assert [entry["signal"] for entry in state["history"]] == [None, None]
    assert state["history"][0]["exit_code"] == 1  # the launcher: a rank failed
    assert state["rank_failure"] == {"rank": 1, "pid": first[1], "exit_code": None,
                                     "signal": "SIGKILL"}  # fmt: skip
    # Both ranks of the second launch resumed from one step: L0's newest (the supervisor's own
    # L0 in memory, about every step), at least the newest verified L1 checkpoint at the death
    # (the supervisor's record, a multiple of the cadence).
    resumed = dict(re.findall(r"rank (\d) resumed from \S*step-(\d{8})", output))
    assert set(resumed) == {"0", "1"}, output[-4000:]
    assert resumed["0"] == resumed["1"]
    step = int(resumed["0"])
    saved = state["checkpoint_step"]
    assert step >= saved >= 2 * EVERY and saved % EVERY == 0, (step, saved)
    logged = losses(resumed_log)
    # Every loss logged matches the uninterrupted 2-rank run's exactly, the replayed steps
    # after the resume included.
    assert all(loss == reference[s] for s, loss in logged)
    steps = [s for s, _ in logged]
    # Steps 1..k before the kill (k at least the checkpoint's step), then step + 1 to the end
    # (k equals the checkpoint's step when the kill came before the next step was logged).
    k = next((i for i in range(1, len(steps)) if steps[i] != steps[i - 1] + 1), step)
    assert steps[:k] == list(range(1, k + 1)) and k >= step
    assert steps[k:] == list(range(step + 1, STEPS + 1))
