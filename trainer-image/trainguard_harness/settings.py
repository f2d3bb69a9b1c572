"""Where the harness reads and writes, and how often it checkpoints.

Values come from the pod contract (`trainguard.contract.env.PodEnv`, set by the operator on
every training container), fall back to its defaults (the API's) when a trainer is run by
hand, and are overridden by explicit arguments.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.api.spec import DEFAULT_DATA_DIR
from trainguard.ckpt import DEFAULT_ALGORITHM
from trainguard.contract.env import PodEnv

_POD_DEFAULTS = PodEnv()
# Keep-last 2 full checkpoints and save every 50 steps: the figures the incidents settled on.
DEFAULT_KEEP_LAST = _POD_DEFAULTS.keep_last
DEFAULT_EVERY_STEPS = _POD_DEFAULTS.every_steps
DEFAULT_EVERY_SECONDS = _POD_DEFAULTS.every_seconds


class OnSaveError(enum.StrEnum):
    """What the training loop does when a checkpoint cannot be persisted."""

    CONTINUE = "continue"  # report loudly (stderr, heartbeat) and keep training
    STOP = "stop"  # raise in the training loop: the process exits non-zero


@dataclass(frozen=True)
class HarnessSettings:
    """Paths and cadence of one trainer process."""

    l1_dir: Path = _POD_DEFAULTS.l1_dir
    # L0 in pod memory (`trainguard_harness.session`); None: off.
    l0_dir: Path | None = _POD_DEFAULTS.l0_dir
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    state_dir: Path = _POD_DEFAULTS.state_dir
    heartbeat_file: Path = _POD_DEFAULTS.heartbeat
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
    def pod(self) -> PodEnv:
        """These paths as the pod contract: where its state files lie."""
        return PodEnv(state_dir=self.state_dir, heartbeat_file=self.heartbeat_file)

    @property
    def supervisor_state_file(self) -> Path:
        """The supervisor's state file: next to the heartbeat."""
        return self.pod.supervisor_file

    def stacks_file(self, pid: int) -> Path:
        """Where SIGUSR1 stack dumps of process `pid` go (in the state dir)."""
        return self.pod.stacks_file(pid)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: object
    ) -> HarnessSettings:
        """Settings from `environ` (default: os.environ); keyword overrides that are not None win.

        The heartbeat defaults to `heartbeat.json` in the state directory, wherever that is.
        """
        pod = PodEnv.from_env(os.environ if environ is None else environ)
        values: dict[str, Any] = {
            "l1_dir": pod.l1_dir,
            "l0_dir": pod.l0_dir,
            "state_dir": pod.state_dir,
            "heartbeat_file": pod.heartbeat,
            "keep_last": pod.keep_last,
            "every_steps": pod.every_steps,
            "every_seconds": pod.every_seconds,
        }
        if pod.data_dir is not None:
            values["data_dir"] = pod.data_dir
        if pod.hash_algorithm:
            values["hash_algorithm"] = pod.hash_algorithm
        explicit = {key: value for key, value in overrides.items() if value is not None}
        if "state_dir" in explicit and "heartbeat_file" not in explicit and not pod.heartbeat_file:
            # The heartbeat follows the state directory unless a heartbeat file was named.
            values["heartbeat_file"] = PodEnv(state_dir=Path(str(explicit["state_dir"]))).heartbeat
        values.update(explicit)
        # replace() validates the names (TypeError on an unknown one) and runs __post_init__.
        return dataclasses.replace(cls(), **values)
