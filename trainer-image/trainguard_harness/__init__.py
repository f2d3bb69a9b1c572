"""The trainer harness: verified asynchronous checkpoints, heartbeat, supervisor, reference trainer.

A training script adopts it through `TrainingSession` (see `trainguard_harness.session`). The
names below are imported lazily so that `trainguard supervise` (which imports this package)
never pays for importing torch.

| module | role |
|---|---|
| session | `TrainingSession`: resume, per-step heartbeat, checkpoint cadence, graceful stop |
| writer | `CheckpointWriter`: host snapshot in the loop, persist in a background thread |
| reader | `load_newest`: the newest checkpoint that verifies, invalid ones reported |
| snapshot, tensorfile | reused host buffers; component files (safetensors + JSON skeleton) |
| rng | RNG states of Python, numpy, torch CPU and CUDA |
| heartbeat | the heartbeat file (torch-free) |
| supervisor | `trainguard supervise -- <command>` (torch-free) |
| stackdump | SIGUSR1 stack dumps into the state dir |
| settings | paths and cadence from the TRAINGUARD_* environment |
| shards, model, train | the reference trainer: token shards, GPT model, `python -m ...train` |
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard_harness.reader import load_newest
    from trainguard_harness.session import TrainingSession
    from trainguard_harness.settings import HarnessSettings, OnSaveError
    from trainguard_harness.writer import CheckpointSaveError, CheckpointWriter

_EXPORTS = {
    "CheckpointSaveError": "trainguard_harness.writer",
    "CheckpointWriter": "trainguard_harness.writer",
    "HarnessSettings": "trainguard_harness.settings",
    "OnSaveError": "trainguard_harness.settings",
    "TrainingSession": "trainguard_harness.session",
    "load_newest": "trainguard_harness.reader",
}
__all__ = [
    "CheckpointSaveError",
    "CheckpointWriter",
    "HarnessSettings",
    "OnSaveError",
    "TrainingSession",
    "load_newest",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainguard_harness' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
