"""L0, the checkpoint layer in pod memory: a trainer killed in place resumes from it.

The reference trainer runs under `trainguard supervise` with an L0 directory of its own (as the
operator's pod gives it one) and steps slowed to `STEP_S`, so that a SIGKILL sent the moment an
L0 checkpoint appears lands within a step of it. The restarted trainer must resume from that L0
step, losing at most one step; with every L0 checkpoint newer than L1's corrupted (a byte
flipped) it must skip them, report each with its layer, step, file and reason, and resume from
L1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness_helpers import trainer_command, trainer_env

from trainguard.api.constants import L0_LAYER, L1_LAYER
from trainguard.ckpt import MANIFEST_FILENAME, find_newest_valid, verify
from trainguard.ckpt.layout import parse_step_dirname
from trainguard.contract import env
from trainguard.contract.files import (
    RESTORE_FILENAME,
    SUPERVISOR_FILENAME,
    read_json,
    read_restore_report,
    read_supervised_child,
)
from trainguard.contract.findings import HEARTBEAT_FIELD, read_findings
from trainguard_dev.testing.polling import eventually
from trainguard_harness.supervisor import L0_SHM_DIR

pytestmark = [pytest.mark.unit, pytest.mark.timeout(180)]

STEP_S = 0.25  # a step lasts this long: a kill right after an L0 snapshot lands within a step
L1_EVERY = 10


def newest_l0(l0: Path) -> int | None:
    """The newest step in L0 with a manifest (what a reader could resume from)."""
    steps = [
        step
        for entry in (l0.iterdir() if l0.is_dir() else ())
        if (step := parse_step_dirname(entry.name)) is not None
        and (entry / MANIFEST_FILENAME).exists()
    ]
    return max(steps, default=None)


def logged_steps(loss_log: Path) -> list[int]:
    """The steps the trainer finished, in order (a line each, written before `end_step`)."""
    lines = loss_log.read_text().splitlines() if loss_log.exists() else []
    return [json.loads(line)["step"] for line in lines if line.endswith("}")]


class Supervised:
    """The reference trainer under `trainguard supervise`, its paths under `root`."""

    def __init__(self, root: Path, data_dir: Path, backoff: float) -> None:
        self.root, self.l0, self.l1 = root, root / "l0", root / "l1"
        self.state = root / "state"
        self.loss_log = root / "loss.jsonl"
        environ = trainer_env(root)
        environ[env.L0_DIR] = str(self.l0)
        command = [
            sys.executable, "-m", "trainguard.cli.main", "supervise", "--no-gpu", "--no-standby",
            "--backoff", str(backoff), "--backoff-max", str(backoff), "--",
            *trainer_command(data_dir, "--steps", "100000", "--ckpt-every-steps", str(L1_EVERY),
                             "--min-step-seconds", str(STEP_S), "--loss-log", str(self.loss_log)),
        ]  # fmt: skip
        self.output = (root / "supervisor.log").open("w")
        self.process = subprocess.Popen(
            command, env=environ, stdout=self.output, stderr=self.output
        )

    def child(self) -> int:
        """The running trainer's PID."""
        found = eventually(
            lambda: read_supervised_child(self.state / SUPERVISOR_FILENAME), 60, "a trainer", 0.02
        )
        assert isinstance(found, int)
        return found

    def kill_after_l0_snapshot(self, after: int) -> tuple[int, int, int]:
        """SIGKILL the trainer the moment an L0 checkpoint newer than `after` appears.

        Returns (its PID, the L0 step, the step the trainer had finished at the kill).
        """
        pid = self.child()
        seen = eventually(
            lambda: s if (s := newest_l0(self.l0)) is not None and s > after else None,
            60,
            f"an L0 checkpoint after step {after}",
            0.002,
        )
        os.kill(pid, signal.SIGKILL)
        reached = max(logged_steps(self.loss_log))
        return pid, seen, reached

    def restart_of(self, pid: int) -> int:
        """The restarted trainer's PID, once it has finished a step."""
        finished = len(logged_steps(self.loss_log))

        def restarted() -> int | None:
            child = read_supervised_child(self.state / SUPERVISOR_FILENAME)
            fresh = child is not None and child != pid
            return child if fresh and len(logged_steps(self.loss_log)) > finished else None

        found = eventually(restarted, 90, "the restarted trainer's first step", 0.05)
        assert isinstance(found, int)
        return found

    def heartbeat(self) -> dict[str, Any]:
        """The harness's heartbeat."""
        return read_json(self.state / env.HEARTBEAT_FILENAME) or {}

    def stop(self) -> None:
        """End supervision (SIGTERM, as at a pod's deletion)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.output.close()


def test_a_trainer_killed_right_after_an_l0_snapshot_resumes_from_it(
    tmp_path: Path, data_dir: Path
) -> None:
    run = Supervised(tmp_path, data_dir, backoff=0.05)
    try:
        # Past the first L1 checkpoint, and not at one: L0 must be newer than L1.
        pid, l0_step, reached = run.kill_after_l0_snapshot(after=L1_EVERY + 2)
        run.restart_of(pid)
        report = read_restore_report(run.state / RESTORE_FILENAME)
        assert report is not None
        assert report.from_layer == L0_LAYER, report
        assert report.step is not None and report.step >= l0_step
        assert report.line() == f"restored step {report.step} from layer l0"
        newest_l1 = find_newest_valid(run.l1).newest
        assert newest_l1 is not None and newest_l1.step < report.step  # L1 alone loses more
        assert reached - report.step <= 1, (reached, report.step)
        # The restarted trainer goes on from the step after the L0 checkpoint.
        steps = logged_steps(run.loss_log)
        assert steps[steps.index(reached) + 1] == report.step + 1

        # and saves to L0 again, which keeps its last two checkpoints, each verified.
        def two_newer_kept(after: int = report.step) -> list[Path] | None:
            kept = sorted(p for p in run.l0.iterdir() if parse_step_dirname(p.name) is not None)
            newer = len(kept) == 2 and parse_step_dirname(kept[0].name) > after  # type: ignore[operator]
            return kept if newer else None

        kept = eventually(two_newer_kept, 60, "two newer L0 checkpoints kept", 0.05)
        assert all(verify(p).ok for p in kept)
    finally:
        run.stop()


def flip_a_byte(checkpoint: Path) -> str:
    """Flip one byte in the middle of the checkpoint's largest file; return its name."""
    target = max((p for p in checkpoint.iterdir() if p.name != MANIFEST_FILENAME),
                 key=lambda p: p.stat().st_size)  # fmt: skip
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return target.name


def test_a_corrupt_l0_checkpoint_is_skipped_reported_and_l1_resumed_from(
    tmp_path: Path, data_dir: Path
) -> None:
    # A back-off long enough to corrupt L0 between the death and the restart.
    run = Supervised(tmp_path, data_dir, backoff=4.0)
    try:
        pid, _, _ = run.kill_after_l0_snapshot(after=L1_EVERY + 2)
        newest_l1 = find_newest_valid(run.l1).newest
        assert newest_l1 is not None
        corrupted = {
            step: flip_a_byte(path)
            for path in run.l0.iterdir()
            if (step := parse_step_dirname(path.name)) is not None and step >= newest_l1.step
        }
        assert corrupted
        run.restart_of(pid)
        report = read_restore_report(run.state / RESTORE_FILENAME)
        assert report is not None
        assert (report.from_layer, report.step) == (L1_LAYER, newest_l1.step), report
        for step, file in corrupted.items():
            assert any(
                line.startswith(f"l0 step-{step:08d}: {file}") and "hash mismatch" in line
                for line in report.skipped
            ), (step, report.skipped)
        # Each is told to the agent as other invalid checkpoints are: layer, step, file, reason
        # (the heartbeat is written at most once a second).
        expected = {
            (L0_LAYER, step, file, "xxh3-128 hash mismatch") for step, file in corrupted.items()
        }

        def told() -> bool:
            findings = read_findings(run.heartbeat().get(HEARTBEAT_FIELD))
            return expected <= {(f.layer, f.step, f.file, f.reason) for f in findings}

        eventually(told, 30, "the L0 findings in the heartbeat", 0.1)
        # Skipped, never deleted: L0's keep-last-2 leaves the invalid ones in place.
        eventually(lambda: (newest_l0(run.l0) or 0) > max(corrupted) + 2, 60, "new L0 saves", 0.1)
    finally:
        run.stop()
    for step in corrupted:
        assert not verify(run.l0 / f"step-{step:08d}").ok


def test_without_an_l0_the_supervisor_gives_its_trainers_one_in_memory(tmp_path: Path) -> None:
    script = f"import os, sys; open(sys.argv[1], 'w').write(os.environ['{env.L0_DIR}'] + '\\n')"
    out = tmp_path / "l0-of-child"
    environ = {k: v for k, v in os.environ.items() if k != env.L0_DIR}
    command = [
        sys.executable, "-m", "trainguard.cli.main", "supervise", "--no-gpu", "--no-standby",
        "--state-file", str(tmp_path / "supervisor.json"), "--",
        sys.executable, "-c", script, str(out),
    ]  # fmt: skip
    assert subprocess.run(command, env=environ, timeout=60).returncode == 0
    given = Path(out.read_text().strip())
    assert given.parent == L0_SHM_DIR and given.name.startswith("trainguard-l0-")
    assert not given.exists()  # removed when supervision ended
