"""Kill a checkpoint save at its N-th filesystem call, for every N (run by test_crash_points).

Usage: python crash_driver.py OUT_DIR

For N = 0 (count only), then 1..count: fork a child that saves step 1 into OUT_DIR/kill-N,
then saves step 2 with keep-last-1 while the os functions in WRAPPED SIGKILL the process at
call N (from the background writer thread, as a real crash would). Prints a JSON object,
{"calls": count, "status": {N: wait status}}; the test then inspects every OUT_DIR/kill-N.
The driver itself never starts threads before forking.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainguard_harness.writer import CheckpointWriter

WRAPPED = ("write", "pwrite", "fsync", "close", "open", "rename", "mkdir", "unlink", "rmdir")


def state(step: int) -> dict[str, object]:
    """The state saved at `step` (the test rebuilds it to compare)."""
    return {
        "model": {"w": torch.full((64, 64), float(step)), "b": torch.arange(8) * step},
        "optimizer": {"state": {0: {"exp_avg": torch.full((64,), -float(step))}}},
        "data": {"position": step * 100},
    }


def kill_at(target: int, counter: list[int]) -> None:
    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counter[0] += 1
            if counter[0] == target:
                os.kill(os.getpid(), signal.SIGKILL)
            return function(*args, **kwargs)

        return wrapper

    for name in WRAPPED:
        setattr(os, name, wrap(getattr(os, name)))


def child(root: Path, target: int, count_file: Path) -> None:
    torch.set_num_threads(1)
    writer = CheckpointWriter(root, keep_last=1)
    writer.save(1, state(1))
    writer.wait()
    counter = [0]
    kill_at(target, counter)
    writer.save(2, state(2))
    writer.close()
    count_file.write_text(str(counter[0]))


def run(root: Path, target: int, count_file: Path) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            child(root, target, count_file)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status


def main() -> None:
    out = Path(sys.argv[1])
    count_file = out / "calls"
    run(out / "kill-0", 0, count_file)
    calls = int(count_file.read_text())
    statuses = {n: run(out / f"kill-{n}", n, out / "ignored") for n in range(1, calls + 1)}
    print(json.dumps({"calls": calls, "status": statuses}))


if __name__ == "__main__":
    main()
