"""Checkpoints and transfer probes shared by the remote-layer tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from trainguard.ckpt import CheckpointTransaction, Contents, verify

MIB = 2**20


def save(root: Path, step: int, model_bytes: int = 12 * MIB) -> Path:
    """A full checkpoint: a ~12 MiB model (several S3 parts) and a small optimizer file."""
    with CheckpointTransaction(root, step, contents=Contents.FULL) as txn:
        txn.write_file("model.safetensors", os.urandom(model_bytes))
        txn.write_file("optimizer.safetensors", os.urandom(64 * 1024) + step.to_bytes(4, "little"))
        txn.write_file("trainer_state.json", b'{"step": %d}' % step)
        return Path(txn.commit().path)


def assert_same_checkpoint(original: Path, fetched: Path) -> None:
    """`fetched` verifies and has the same manifest entries as `original`."""
    got, want = verify(fetched), verify(original)
    assert got.ok, got.reasons
    assert got.manifest is not None and want.manifest is not None
    assert got.manifest.files == want.manifest.files
    assert got.manifest.time == want.manifest.time


class Counting:
    """A `Transfer` that counts sent and resumed bytes and can act after N bytes were sent."""

    def __init__(self, after: int | None = None, action: Callable[[], None] | None = None) -> None:
        self.total = 0
        self.sent = 0
        self.resumed = 0
        self._after = after
        self._action = action

    def begin(self, total_bytes: int) -> None:
        self.total = total_bytes

    def advance(self, nbytes: int, *, sent: bool = True) -> None:
        if sent:
            self.sent += nbytes
        else:
            self.resumed += nbytes
        if self._action is not None and self._after is not None and self.sent >= self._after:
            action, self._action = self._action, None
            action()
