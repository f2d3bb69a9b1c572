"""Helpers shared by the harness tests: trainer command lines, environments, disk filling."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trainguard.contract import env

TINY_TRAINER_ARGS = [
    "--preset", "tiny", "--block-size", "32", "--batch-size", "4", "--threads", "1",
]  # fmt: skip


def fill_until_free(directory: Path, free_bytes: int) -> None:
    """Write a filler file so that only about `free_bytes` remain free in `directory`'s disk."""
    stat = os.statvfs(directory)
    available = stat.f_bavail * stat.f_frsize
    (directory / "filler").write_bytes(b"\0" * max(0, available - free_bytes))


def trainer_env(root: Path) -> dict[str, str]:
    """Environment for a trainer process whose harness paths all live under `root`."""
    environ = dict(os.environ)
    environ.update(
        {
            env.L1_DIR: str(root / "l1"),
            env.STATE_DIR: str(root / "state"),
            env.HEARTBEAT_FILE: str(root / "state" / env.HEARTBEAT_FILENAME),
        }
    )
    return environ


def trainer_command(data_dir: Path, *extra: str) -> list[str]:
    """The reference trainer's command line with the tiny CPU configuration."""
    return [
        sys.executable, "-m", "trainguard_harness.train", "--data-dir", str(data_dir),
        *TINY_TRAINER_ARGS, *extra,
    ]  # fmt: skip
