"""The heartbeat file: what the trainer is doing, replaced atomically, at most once a second.

The pod agent reads it to tell a live, advancing trainer from a hung or dead one. Example::

    {"pid": 4242, "step": 1200, "time": 1764720000.52, "phase": "training",
     "tokens_per_s": 23850.0, "loss": 2.31, "slowest_step_s": 0.412,
     "memory_allocated_bytes": 81604378624, "memory_reserved_bytes": 90194313216,
     "memory_by_device": [{"device": 0, "uuid": "5d9c3f4e-...",
                           "allocated_bytes": 81604378624, "reserved_bytes": 90194313216}],
     "last_checkpoint_step": 1200, "checkpoint_error": null, "checkpoint_stall_s": 0.41,
     "invalid_checkpoints": []}

In a pod of several ranks each rank writes its own file, `heartbeat-<local rank>.json` next to
`heartbeat.json`, with `rank` (its global rank) and `local_rank` set; local rank 0 writes the
same record to `heartbeat.json` as well, so a reader of the one heartbeat keeps working
(`trainguard.contract.files`). A single process leaves them null.
`time` is when the training loop last reported (wall clock, seconds since the epoch), not when
the file was written, so a loop that stops reporting looks stopped. Memory is what the
framework holds (CUDA allocator statistics); it is null when no GPU is in use.
`memory_allocated_bytes` and `memory_reserved_bytes` are the current device's (as an older
agent reads them); `memory_by_device` has every device the process holds memory on, by its
CUDA index and, where CUDA reports it, its UUID (NVML's without the ``GPU-`` or ``MIG-``
prefix). The agent judges the memory of each GPU, and a UUID names the GPU however
``CUDA_VISIBLE_DEVICES`` renumbers the devices.
`slowest_step_s` is the longest time between two reported steps among this process's last 100
(null until five are known): the agent's adaptive hang bound (`monitor.hangAfterStepTimes`) is
a multiple of it. `checkpoint_stall_s` is how long the last save blocked the loop: the
measured cost a checkpoint cadence can be derived from (Young: sqrt(2 x cost x MTBF)).
`invalid_checkpoints` lists the newest checkpoints the harness found invalid in L1 (when it
resumed, at keep-last-N, or moved aside by a save of the same step), for the agent to tell
(`trainguard.contract.findings`).
The file is written to a temporary name and renamed, so readers never see a torn write. This
module does not import torch (the agent may import it for the field names).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.contract.files import HEARTBEAT_INTERVAL_S, read_json
from trainguard.contract.findings import HEARTBEAT_FIELD

LOG = logging.getLogger(__name__)

PID = "pid"
STEP = "step"
TIME = "time"
PHASE = "phase"
TOKENS_PER_S = "tokens_per_s"
LOSS = "loss"
MEMORY_ALLOCATED = "memory_allocated_bytes"
MEMORY_RESERVED = "memory_reserved_bytes"
MEMORY_BY_DEVICE = "memory_by_device"
# The keys of one `MEMORY_BY_DEVICE` entry.
DEVICE = "device"
DEVICE_UUID = "uuid"
DEVICE_ALLOCATED = "allocated_bytes"
DEVICE_RESERVED = "reserved_bytes"
LAST_CHECKPOINT_STEP = "last_checkpoint_step"
CHECKPOINT_ERROR = "checkpoint_error"
CHECKPOINT_STALL_S = "checkpoint_stall_s"
SLOWEST_STEP_S = "slowest_step_s"
INVALID_CHECKPOINTS = HEARTBEAT_FIELD
RANK = "rank"
LOCAL_RANK = "local_rank"

PHASE_TRAINING = "training"
PHASE_SAVING = "saving"
PHASE_LOADING = "loading"
# The session is closed (its last checkpoint saved): the process ends on purpose from here on,
# so its absence is no death (the ranks of a launch end one after the other).
PHASE_CLOSED = "closed"
PHASES = (PHASE_TRAINING, PHASE_SAVING, PHASE_LOADING, PHASE_CLOSED)

MIN_INTERVAL_S = HEARTBEAT_INTERVAL_S


def framework_memory() -> tuple[int | None, int | None]:
    """(allocated, reserved) bytes of the CUDA caching allocator, or (None, None) off GPU."""
    torch = sys.modules.get("torch")  # only if the trainer already uses it
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None, None
    return int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved())


def framework_memory_by_device() -> list[dict[str, Any]] | None:
    """The allocator's figures of every device this process holds memory on; None off GPU.

    Every device, not only the current one: a process may use several (one process on all the
    pod's GPUs), and a rank may touch another rank's device.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    devices = []
    for index in range(torch.cuda.device_count()):
        allocated = int(torch.cuda.memory_allocated(index))
        reserved = int(torch.cuda.memory_reserved(index))
        if reserved or allocated:
            uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
            devices.append(
                {
                    DEVICE: index,
                    DEVICE_UUID: None if uuid is None else str(uuid),
                    DEVICE_ALLOCATED: allocated,
                    DEVICE_RESERVED: reserved,
                }
            )
    return devices


class Heartbeat:
    """Keeps the heartbeat file up to date with what the training loop reports.

    `update()` never blocks on the file more than once a second: within the interval it only
    records the values, and a timer writes the latest ones when the interval has passed, so a
    phase change (e.g. into a long `saving`) always reaches the file within a second.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        min_interval: float = MIN_INTERVAL_S,
        memory: Callable[[], tuple[int | None, int | None]] = framework_memory,
        memory_by_device: Callable[[], list[dict[str, Any]] | None] = framework_memory_by_device,
        copies: tuple[Path, ...] = (),
        rank: int | None = None,
        local_rank: int | None = None,
    ) -> None:
        self.path = Path(path)
        # Other files that get the same record (local rank 0's `heartbeat.json`).
        self.copies = tuple(Path(copy) for copy in copies)
        self.min_interval = min_interval
        self._memory = memory
        self._memory_by_device = memory_by_device
        self._lock = threading.Lock()
        self._record: dict[str, Any] = {
            PID: os.getpid(),
            STEP: None,
            TIME: time.time(),
            PHASE: PHASE_TRAINING,
            TOKENS_PER_S: None,
            LOSS: None,
            MEMORY_ALLOCATED: None,
            MEMORY_RESERVED: None,
            MEMORY_BY_DEVICE: None,
            LAST_CHECKPOINT_STEP: None,
            CHECKPOINT_ERROR: None,
            CHECKPOINT_STALL_S: None,
            SLOWEST_STEP_S: None,
            INVALID_CHECKPOINTS: [],
            RANK: rank,
            LOCAL_RANK: local_rank,
        }
        self._last_write = -float("inf")
        self._timer: threading.Timer | None = None
        self._dirty = False
        self.write_error: OSError | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def update(self, **fields: Any) -> None:
        """Merge `fields` (the keys above) into the record; write it now or within the interval.

        A call with loop fields (step, phase, loss, tokens/s) also moves `time` forward.
        """
        unknown = set(fields) - set(self._record)
        if unknown:
            raise KeyError(f"unknown heartbeat fields: {sorted(unknown)}")
        if PHASE in fields and fields[PHASE] not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {fields[PHASE]!r}")
        with self._lock:
            self._record.update(fields)
            if fields.keys() & {STEP, PHASE, LOSS, TOKENS_PER_S}:
                self._record[TIME] = time.time()
            self._dirty = True
            wait = self._last_write + self.min_interval - time.monotonic()
            if wait <= 0:
                self._write_locked()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._flush_from_timer)
                self._timer.daemon = True
                self._timer.start()

    def snapshot(self) -> dict[str, Any]:
        """A copy of the current record (what the next write will contain)."""
        with self._lock:
            return dict(self._record)

    def _flush_from_timer(self) -> None:
        with self._lock:
            self._timer = None
            if self._dirty:
                self._write_locked()

    def _write_locked(self) -> None:
        allocated, reserved = self._memory()
        self._record[MEMORY_ALLOCATED] = allocated
        self._record[MEMORY_RESERVED] = reserved
        self._record[MEMORY_BY_DEVICE] = self._memory_by_device()
        self._last_write = time.monotonic()
        self._dirty = False
        text = json.dumps(self._record) + "\n"
        try:
            for path in (self.path, *self.copies):
                temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                # No fsync: the file describes a live process; after a crash it is stale anyway.
                temporary.write_text(text)
                os.replace(temporary, path)
        except OSError as error:
            # Never stop training over the heartbeat: a stale heartbeat is itself the signal.
            if self.write_error is None:
                LOG.error("cannot write heartbeat %s: %s", self.path, error)
            self.write_error = error
        else:
            self.write_error = None

    def close(self) -> None:
        """Write any pending values now (used at exit)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._dirty:
                self._write_locked()


def read_heartbeat(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The last heartbeat record as written, or None when there is none yet.

    The agent reads it typed (`trainguard.agent.signals.read_heartbeat`); both go through the
    pod contract's one reader of state files.
    """
    return read_json(Path(path))
