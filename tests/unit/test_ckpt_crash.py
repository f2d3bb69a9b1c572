"""SIGKILL at random moments of saving and pruning never exposes a partial checkpoint.

A child process saves checkpoints in a loop (each resumes from the newest valid step, as a
restarted trainer would) and applies keep-last-2; the test kills it at seeded random delays and
checks, after every kill, that every visible checkpoint verifies and the newest one advances.
"""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.ckpt import scan

pytestmark = pytest.mark.unit

WRITER = """
import sys
from trainguard.ckpt import CheckpointTransaction, find_newest_valid, prune
root = sys.argv[1]
newest = find_newest_valid(root).newest
step = 0 if newest is None else newest.step
payload = bytes(range(256)) * 2048
while True:
    step += 1
    with CheckpointTransaction(root, step) as txn:
        for name in ("model.bin", "optim.bin", "rng.bin"):
            txn.write_file(name, payload)
        txn.commit()
    prune(root, keep_last=2)
    print(step, flush=True)
"""

KILLS = 25


@pytest.mark.timeout(120)
def test_sigkill_at_random_points_never_exposes_a_partial_checkpoint(tmp_path: Path) -> None:
    rng = random.Random(20240604)
    root = tmp_path / "l1"
    newest_steps = []
    for _ in range(KILLS):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        child.stdout.readline()  # one save committed: now kill somewhere in the next ones
        time.sleep(rng.uniform(0.0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()

        result = scan(root)
        assert result.invalid == (), [v.reasons for v in result.invalid]
        assert result.newest_valid is not None
        assert len(result.valid) <= 3  # keep-last-2, plus one committed before its prune
        newest_steps.append(result.newest_valid.step)
    assert all(later > earlier for earlier, later in itertools.pairwise(newest_steps))
    assert newest_steps[-1] >= KILLS
