"""Two ranks in one pod on CPU (gloo) under the real supervisor and PyTorch's launcher.

The reference trainer runs replicated (DDP: rank 0 saves) or sharded (`--sharded`: FSDP2, every
rank saves its shard of each global checkpoint). SIGKILL of rank 1: the launcher ends rank 0,
the supervisor records rank 1's failure, leaves no rank of the old launch alive, and restarts
both together; both resume from the same verified step, and every loss logged (before the
kill, replayed, after) is the uninterrupted run's. Sharded, a checkpoint whose shard on rank 1
is corrupt is skipped as a whole (reported, kept): both ranks resume from the one before, with
the uninterrupted run's losses.

The output of the supervisor and its ranks goes to a file, never to a pipe nobody reads while
they run: a full pipe blocks the rank that writes to it, and with it every rank waiting in a
collective.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness_helpers import trainer_command, trainer_env

from trainguard.api.constants import L1_LAYER
from trainguard.ckpt import rank_dirname, scan, step_dirname, verify
from trainguard.contract import env
from trainguard.contract.env import PodEnv
from trainguard.contract.files import (
    HEARTBEAT_FILENAME,
    RESTORE_FILENAME,
    RankFailure,
    read_json,
    read_rank_failure,
    read_rank_pids,
    read_restore_report,
)
from trainguard.contract.findings import read_findings
from trainguard_dev.testing.polling import eventually
from trainguard_harness import heartbeat as hb
from trainguard_harness.dcp import DCP_METADATA_FILENAME
from trainguard_harness.launcher import ended

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]

STEPS = 80
EVERY = 5
# Generous for two cores under load: each start imports torch in the launcher and both ranks.
START_S = 120
SHARDED = ("--sharded",)


def losses(path: Path) -> list[tuple[int, float]]:
    return [
        (record["step"], record["loss"])
        for record in map(json.loads, path.read_text().splitlines())
    ]


def supervise(
    root: Path, data_dir: Path, loss_log: Path, *options: str, trainer: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    """`trainguard supervise` of the tiny trainer on 2 ranks; output to `root/output.log`.

    `options` are the supervisor's, `trainer` more of the trainer's own arguments.
    """
    environ = {**trainer_env(root), env.PROCS_PER_NODE: "2", "PYTHONUNBUFFERED": "1"}
    (root / "state").mkdir(parents=True, exist_ok=True)
    common = (
        "--steps", str(STEPS), "--ckpt-every-steps", str(EVERY), "--keep-last", "3",
        "--min-step-seconds", "0.05", "--loss-log", str(loss_log), *trainer,
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


Uninterrupted = Callable[[tuple[str, ...]], tuple[Path, dict[int, float]]]


@pytest.fixture(scope="module")
def uninterrupted(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Uninterrupted:
    """The uninterrupted 2-rank run with these trainer arguments: (its root, its losses).

    Run once per module and arguments: the reference the interrupted runs are compared with.
    """
    runs: dict[tuple[str, ...], tuple[Path, dict[int, float]]] = {}

    def run(trainer: tuple[str, ...]) -> tuple[Path, dict[int, float]]:
        if trainer not in runs:
            root = tmp_path_factory.mktemp("uninterrupted")
            finish(supervise(root, data_dir, root / "loss.jsonl", trainer=trainer), root)
            reference = dict(losses(root / "loss.jsonl"))
            assert sorted(reference) == list(range(1, STEPS + 1))
            runs[trainer] = (root, reference)
        return runs[trainer]

    return run


def resumed_steps(output: str) -> list[tuple[str, int, str]]:
    """(rank, step, layer) of every resume the ranks logged."""
    found = re.findall(r"rank (\d) resumed from \S*step-(\d{8}) \(layer (l0|l1)\)", output)
    return sorted((rank, int(step), layer) for rank, step, layer in found)


def assert_sharded(l1: Path) -> None:
    """Every checkpoint in `l1` is one global checkpoint holding both ranks' shards."""
    checkpoints = scan(l1).valid
    assert checkpoints
    for checkpoint in checkpoints:
        manifest = checkpoint.manifest
        assert manifest is not None and manifest.world_size == 2, checkpoint.path
        by_rank: dict[int | None, list[str]] = {}
        for entry in manifest.files:
            by_rank.setdefault(entry.rank, []).append(entry.path)
        assert by_rank[None] == [DCP_METADATA_FILENAME], checkpoint.path
        for rank in (0, 1):
            assert by_rank[rank], (checkpoint.path, rank)
            assert all(path.startswith(rank_dirname(rank) + "/") for path in by_rank[rank])


@pytest.mark.parametrize("trainer", [(), SHARDED], ids=["replicated", "sharded"])
def test_two_ranks_restart_together_from_the_same_step_after_one_is_killed(
    data_dir: Path, tmp_path: Path, uninterrupted: Uninterrupted, trainer: tuple[str, ...]
) -> None:
    _, reference = uninterrupted(trainer)

    root = tmp_path / "b"
    resumed_log = root / "loss.jsonl"
    supervisor = supervise(root, data_dir, resumed_log, "--backoff", "0.2", trainer=trainer)
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
            # Past it by a step: the heartbeat is written at most once a second, and a
            # narrower window (two steps of 0.05 s between saves) can be missed to the end.
            past = saved is not None and saved >= 2 * EVERY and min(steps) > saved
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
    resumed = resumed_steps(output)
    assert [rank for rank, _, _ in resumed] == ["0", "1"], output[-4000:]
    [step] = {step for _, step, _ in resumed}
    saved = state["checkpoint_step"]
    assert step >= saved >= 2 * EVERY and saved % EVERY == 0, (step, saved)
    if trainer == SHARDED:
        # Every rank saved its shard of each checkpoint; without L0 both resumed from L1.
        assert_sharded(root / "l1")
        assert {layer for _, _, layer in resumed} == {L1_LAYER}
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


def test_a_sharded_checkpoint_with_one_corrupt_rank_shard_is_skipped_as_a_whole(
    data_dir: Path, tmp_path: Path, uninterrupted: Uninterrupted
) -> None:
    done, reference = uninterrupted(SHARDED)
    root = tmp_path / "b"
    shutil.copytree(done / "l1", root / "l1")
    *_, previous, newest = scan(root / "l1").valid
    assert (previous.step, newest.step) == (STEPS - EVERY, STEPS)
    assert newest.manifest is not None
    # One byte of rank 1's shard of the newest checkpoint, its size unchanged.
    victim = next(entry for entry in newest.manifest.files if entry.rank == 1)
    data = bytearray((newest.path / victim.path).read_bytes())
    data[len(data) // 2] ^= 0x01
    (newest.path / victim.path).write_bytes(bytes(data))

    resumed_log = root / "loss.jsonl"
    finish(supervise(root, data_dir, resumed_log, trainer=SHARDED), root)

    # Skipped as a whole: rank 0's intact shard of it was not read either; both ranks resumed
    # from the previous global checkpoint and trained the last steps again, exactly as before.
    output = (root / "output.log").read_text()
    pod = PodEnv.from_env({env.STATE_DIR: str(root / "state"), env.PROCS_PER_NODE: "2"})
    launches = json.loads(pod.supervisor_file.read_text())["history"]
    assert resumed_steps(output) == [
        ("0", STEPS - EVERY, L1_LAYER),
        ("1", STEPS - EVERY, L1_LAYER),
    ], (launches, output[-6000:])
    assert losses(resumed_log) == [(s, reference[s]) for s in range(STEPS - EVERY + 1, STEPS + 1)]
    # Reported like any invalid checkpoint, naming the file and its rank.
    problem = f"{victim.path}: xxh3-128 hash mismatch (rank 1 of 2)"
    report = read_restore_report(pod.report_file(RESTORE_FILENAME))
    assert report is not None and report.step == STEPS - EVERY
    assert [line for line in report.skipped if problem in line], report.skipped
    beat = read_json(root / "state" / HEARTBEAT_FILENAME)
    assert beat is not None
    [finding] = read_findings(beat[hb.INVALID_CHECKPOINTS])
    assert (finding.layer, finding.step, finding.file) == (L1_LAYER, STEPS, victim.path)
    assert finding.reason == "xxh3-128 hash mismatch (rank 1 of 2)"
    # Kept: moved aside, whole, when step STEPS was saved again.
    [aside] = (root / "l1").glob(f".invalid-{step_dirname(STEPS)}-*")
    assert [f"{p.file}: {p.reason}" for p in verify(aside).problems] == [problem]
    assert_sharded(root / "l1")
