"""`trainguard supervise` counts deaths without progress and starts its back-off over.

Real processes: each run of the child does what its plan says for that attempt (save a
verified checkpoint in L1, leave a torn one, run a while) and then dies, or completes.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness_helpers import trainer_env

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

# argv: the test's directory, then one plan per attempt, comma-separated; a plan is actions
# joined by "+": save:<step>, torn:<step>, run:<seconds>, done (exit 0). Otherwise exit 1.
PLANNED = """
import os, sys, time
from pathlib import Path
root, plans = Path(sys.argv[1]), sys.argv[2].split(",")
marker = root / "attempts"
attempt = int(marker.read_text()) + 1 if marker.exists() else 1
marker.write_text(str(attempt))
l1 = Path(os.environ["TRAINGUARD_L1_DIR"])
for action in plans[attempt - 1].split("+"):
    kind, _, value = action.partition(":")
    if kind == "save":  # a checkpoint written as the trainer writes it: manifest last
        from trainguard.ckpt import CheckpointTransaction
        with CheckpointTransaction(l1, int(value)) as txn:
            txn.write_file("model.bin", bytes(64))
            txn.commit()
    elif kind == "torn":  # a step directory without a manifest: not a checkpoint
        from trainguard.ckpt import step_dirname
        (l1 / step_dirname(int(value))).mkdir(parents=True)
        (l1 / step_dirname(int(value)) / "model.bin").write_bytes(bytes(64))
    elif kind == "run":
        time.sleep(float(value))
    elif kind == "done":
        sys.exit(0)
sys.exit(1)
"""


def supervise(tmp_path: Path, plans: list[str], *options: str) -> tuple[int, dict[str, Any]]:
    """Run the supervisor over the planned child until it ends; its status and state file."""
    state_file = tmp_path / "state" / "supervisor.json"
    command = [
        sys.executable, "-m", "trainguard.cli.main", "supervise", "--state-file", str(state_file),
        "--no-gpu", *options, "--", sys.executable, "-c", PLANNED, str(tmp_path), ",".join(plans),
    ]  # fmt: skip
    result = subprocess.run(command, env=trainer_env(tmp_path), timeout=50, check=False)
    state: dict[str, Any] = json.loads(state_file.read_text())
    return result.returncode, state


def gaps(state: dict[str, Any]) -> list[float]:
    """Seconds between each death and the next start: the back-off waited."""
    history = state["history"]
    return [b["started_at"] - a["ended_at"] for a, b in itertools.pairwise(history)]


def test_deaths_after_newer_checkpoints_keep_being_restarted(tmp_path: Path) -> None:
    plans = ["save:10", "save:20", "save:30", "save:40", "save:50+done"]
    code, state = supervise(tmp_path, plans, "--max-restarts", "1", "--backoff", "0.05")
    assert code == 0 and state["state"] == "completed"
    # Four restarts with a limit of one: each death came after a newer checkpoint.
    assert (state["restarts"], state["restarts_without_progress"]) == (4, 1)
    assert state["checkpoint_step"] == 40
    assert (tmp_path / "attempts").read_text() == "5"


def test_deaths_without_a_newer_verified_checkpoint_give_up_at_the_limit(tmp_path: Path) -> None:
    # Progress twice, then a death with nothing new and one with only a torn step-30.
    plans = ["save:10", "save:20", "", "torn:30", "", "done"]
    code, state = supervise(tmp_path, plans, "--max-restarts", "2", "--backoff", "0.05")
    assert code == 1 and state["state"] == "gave-up"
    # Restarts 1 and 2 followed progress, 3 did not; the fourth death would be the third
    # restart in a row without progress: the limit is two.
    assert (tmp_path / "attempts").read_text() == "4"
    assert (state["restarts"], state["restarts_without_progress"]) == (3, 2)
    assert state["checkpoint_step"] == 20  # the torn directory is not a checkpoint


def test_the_backoff_starts_over_after_a_process_ran_backoff_reset_seconds(
    tmp_path: Path,
) -> None:
    # Deaths at once, after a short run, at once, after a run past --backoff-reset, at once.
    plans = ["", "run:0.3", "", "run:3", "", "done"]
    options = ["--max-restarts", "10", "--backoff", "0.25", "--backoff-max", "30"]
    code, state = supervise(tmp_path, plans, *options, "--backoff-reset", "2")
    assert code == 0 and state["restarts"] == 5
    waited = gaps(state)
    # Doubling while the processes die young (0.3 s is short of the 2 s): 0.25, 0.5, 1.
    assert waited[0] >= 0.25 and waited[1] >= 0.5 and waited[2] >= 1.0
    # After the process that ran 3 s: the first delay again, then doubling from there
    # (without the reset these would be 2 s and 4 s).
    assert 0.25 <= waited[3] < 1.5
    assert 0.5 <= waited[4] < 3.0
    assert state["backoff_restarts"] == 2
