"""Local disk sizing of a training pod, so the scheduler only picks a node that fits.

ephemeral-storage request = staged data + L1 + margin, where L1 on an emptyDir holds
keepLast + 1 checkpoints (the kept ones and the one being written) plus, with remote layers,
one per checkpoint the agent ships at once (at most `MAX_PINNED`: a checkpoint pinned for its
upload outlives its removal by keep-last-N until the upload ends, `trainguard.ckpt.pin`), and
the margin covers the logs volume, the containers' writable layers and a fixed slack plus a
fraction of the rest. A checkpoint's size comes from `spec.checkpoints.size`, else from the model's
parameter count (full checkpoints: about 16 bytes per parameter).

L0, the checkpoint layer in pod memory, is a memory-backed emptyDir: it holds `L0_KEEP_LAST`
checkpoints plus the one being written, and counts against the trainer's memory, not the disk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainguard.api import TrainingRunSpec
from trainguard.api.quantity import quantity_bytes
from trainguard.ckpt import room_in_checkpoints
from trainguard.contract.env import L0_KEEP_LAST
from trainguard.operator.build.constants import (
    BYTES_PER_PARAMETER_FULL,
    LOG_VOLUME_BYTES,
    MARGIN_FIXED_BYTES,
    MARGIN_FRACTION,
)

MIB = 2**20


@dataclass(frozen=True)
class DiskSizes:
    """Bytes of each local volume (None: unknown, left unbounded) and the request."""

    checkpoint: int | None
    l1: int | None
    data: int | None
    ephemeral_request: int


def checkpoint_bytes(spec: TrainingRunSpec) -> int | None:
    """One full checkpoint: as declared, else estimated from the parameter count."""
    if spec.checkpoints.size is not None:
        return quantity_bytes(spec.checkpoints.size)
    if spec.model is not None and spec.model.parameters is not None:
        return spec.model.parameters * BYTES_PER_PARAMETER_FULL
    return None


def _l1_bytes(spec: TrainingRunSpec, checkpoint: int | None) -> int | None:
    storage = spec.checkpoints.l1.storage
    if storage.local_volume is not None:
        return quantity_bytes(storage.local_volume.size)
    if storage.empty_dir is not None and storage.empty_dir.size_limit is not None:
        return quantity_bytes(storage.empty_dir.size_limit)
    if checkpoint is None:
        return None
    l1 = spec.checkpoints.l1
    return room_in_checkpoints(l1.keep_last, len(spec.checkpoints.remote)) * checkpoint


def _staged_data_bytes(spec: TrainingRunSpec) -> int | None:
    if spec.data is None or not spec.data.stage or spec.data.size is None:
        return None
    return quantity_bytes(spec.data.size)


def disk_sizes(spec: TrainingRunSpec) -> DiskSizes:
    """The sizes of the data and L1 volumes and the pod's ephemeral-storage request."""
    checkpoint = checkpoint_bytes(spec)
    l1 = _l1_bytes(spec, checkpoint)
    data = _staged_data_bytes(spec)
    # A local PersistentVolume holds L1 outside the node's ephemeral storage.
    l1_ephemeral = l1 if spec.checkpoints.l1.storage.local_volume is None else None
    local = (data or 0) + (l1_ephemeral or 0)
    margin = LOG_VOLUME_BYTES + MARGIN_FIXED_BYTES + math.ceil(local * MARGIN_FRACTION)
    return DiskSizes(checkpoint=checkpoint, l1=l1, data=data, ephemeral_request=local + margin)


def mebibytes(size: int) -> str:
    """A byte count as a quantity in whole MiB, rounded up (a volume must hold `size`)."""
    return f"{math.ceil(size / MIB)}Mi"


def l0_bytes(checkpoint: int | None) -> int | None:
    """The L0 volume (pod memory): its kept checkpoints plus the one being written."""
    return None if checkpoint is None else (L0_KEEP_LAST + 1) * checkpoint
