"""Where the harness reads and writes, and how often it checkpoints.

Values come from the environment contract (`trainguard.api.env`, set by the operator on every
training container), fall back to the defaults below when a trainer is run by hand, and are
overridden by explicit arguments.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.api import env
from trainguard.ckpt import DEFAULT_ALGORITHM

# Keep-last 2 full checkpoints and save every 50 steps: the figures the incidents settled on.
DEFAULT_KEEP_LAST = 2
DEFAULT_EVERY_STEPS = 50
DEFAULT_EVERY_SECONDS = 0.0
SUPERVISOR_STATE_FILENAME = "supervisor.json"
STACKS_FILENAME_PATTERN = env.STACKS_FILENAME_PATTERN


class OnSaveError(enum.StrEnum):
    """What the training loop does when a checkpoint cannot be persisted."""

    CONTINUE = "continue"  # report loudly (stderr, heartbeat) and keep training
    STOP = "stop"  # raise in the training loop: the process exits non-zero


@dataclass(frozen=True)
class HarnessSettings:
    """Paths and cadence of one trainer process."""

    l1_dir: Path = Path(env.DEFAULT_L1_DIR)
    data_dir: Path = Path(env.DEFAULT_DATA_DIR)
    state_dir: Path = Path(env.DEFAULT_STATE_DIR)
    heartbeat_file: Path = Path(env.DEFAULT_STATE_DIR) / env.HEARTBEAT_FILENAME
    keep_last: int = DEFAULT_KEEP_LAST
    every_steps: int = DEFAULT_EVERY_STEPS
    every_seconds: float = DEFAULT_EVERY_SECONDS
    hash_algorithm: str = DEFAULT_ALGORITHM
    on_save_error: OnSaveError = OnSaveError.CONTINUE

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {self.keep_last}")
        if self.every_steps < 0 or self.every_seconds < 0:
            raise ValueError("checkpoint cadences must be >= 0 (0 turns one off)")

    @property
    def supervisor_state_file(self) -> Path:
        """The supervisor's state file: next to the heartbeat."""
        return self.heartbeat_file.parent / SUPERVISOR_STATE_FILENAME

    def stacks_file(self, pid: int) -> Path:
        """Where SIGUSR1 stack dumps of process `pid` go (in the state dir)."""
        return self.state_dir / STACKS_FILENAME_PATTERN.format(pid=pid)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: object
    ) -> HarnessSettings:
        """Settings from `environ` (default: os.environ); keyword overrides that are not None win.

        The heartbeat defaults to `heartbeat.json` in the state directory, wherever that is.
        """
        source = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field, variable, convert in _ENV_FIELDS:
            raw = source.get(variable)
            if raw:
                values[field] = convert(raw)
        values.update({key: value for key, value in overrides.items() if value is not None})
        if "heartbeat_file" not in values:
            state_dir = Path(str(values.get("state_dir", env.DEFAULT_STATE_DIR)))
            values["heartbeat_file"] = state_dir / env.HEARTBEAT_FILENAME
        # replace() validates the names (TypeError on an unknown one) and runs __post_init__.
        return dataclasses.replace(cls(), **values)


_ENV_FIELDS: tuple[tuple[str, str, type], ...] = (
    ("l1_dir", env.L1_DIR, Path),
    ("state_dir", env.STATE_DIR, Path),
    ("data_dir", env.DATA_DIR, Path),
    ("heartbeat_file", env.HEARTBEAT_FILE, Path),
    ("keep_last", env.KEEP_LAST, int),
    ("every_steps", env.CKPT_EVERY_STEPS, int),
    ("every_seconds", env.CKPT_EVERY_SECONDS, float),
    ("hash_algorithm", env.HASH, str),
)
