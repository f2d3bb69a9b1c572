"""The heartbeat file: fields, atomic replacement, at most one write per second, phases."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainguard_harness import heartbeat as hb
from trainguard_harness.heartbeat import Heartbeat, read_heartbeat

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def watch_writes(path: Path, seconds: float) -> list[dict[str, object]]:
    """Every distinct content of `path` seen while polling it for `seconds`."""
    seen: list[dict[str, object]] = []
    last_inode = None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if (stat.st_ino, stat.st_mtime_ns) != last_inode:
            last_inode = (stat.st_ino, stat.st_mtime_ns)
            seen.append(json.loads(path.read_text()))  # never torn: it is renamed into place
        time.sleep(0.005)
    return seen


def test_fields_and_first_write(tmp_path: Path) -> None:
    path = tmp_path / "state" / "heartbeat.json"
    devices = [
        {hb.DEVICE: 0, hb.DEVICE_UUID: "aa", hb.DEVICE_ALLOCATED: 1024, hb.DEVICE_RESERVED: 4096},
        {hb.DEVICE: 1, hb.DEVICE_UUID: "bb", hb.DEVICE_ALLOCATED: 512, hb.DEVICE_RESERVED: 2048},
    ]
    beat = Heartbeat(path, memory=lambda: (1024, 4096), memory_by_device=lambda: devices)
    before = time.time()
    beat.update(step=7, loss=1.25, tokens_per_s=1000.0, phase=hb.PHASE_TRAINING)
    record = read_heartbeat(path)
    assert record is not None
    assert set(record) == {
        hb.PID, hb.STEP, hb.TIME, hb.PHASE, hb.TOKENS_PER_S, hb.LOSS, hb.MEMORY_ALLOCATED,
        hb.MEMORY_RESERVED, hb.MEMORY_BY_DEVICE, hb.LAST_CHECKPOINT_STEP, hb.CHECKPOINT_ERROR,
        hb.CHECKPOINT_STALL_S, hb.SLOWEST_STEP_S, hb.INVALID_CHECKPOINTS, hb.RANK, hb.LOCAL_RANK,
    }  # fmt: skip
    assert record[hb.RANK] is None and record[hb.LOCAL_RANK] is None  # one process: no ranks
    assert record[hb.PID] == os.getpid() and record[hb.STEP] == 7
    assert record[hb.MEMORY_ALLOCATED] == 1024 and record[hb.MEMORY_RESERVED] == 4096
    # Every device the process holds memory on, not only the current one.
    assert record[hb.MEMORY_BY_DEVICE] == devices
    assert before <= record[hb.TIME] <= time.time()
    assert read_heartbeat(tmp_path / "none.json") is None
    beat.close()


def test_a_rank_writes_its_own_file_and_local_rank_0_the_shared_one_too(tmp_path: Path) -> None:
    shared = tmp_path / "heartbeat.json"
    zero = Heartbeat(tmp_path / "heartbeat-0.json", copies=(shared,), rank=4, local_rank=0)
    one = Heartbeat(tmp_path / "heartbeat-1.json", rank=5, local_rank=1)
    zero.update(step=3)
    one.update(step=3)
    own = read_heartbeat(tmp_path / "heartbeat-0.json")
    assert own is not None and own == read_heartbeat(shared)
    assert (own[hb.RANK], own[hb.LOCAL_RANK], own[hb.STEP]) == (4, 0, 3)
    other = read_heartbeat(tmp_path / "heartbeat-1.json")
    assert other is not None and (other[hb.RANK], other[hb.LOCAL_RANK]) == (5, 1)
    zero.close()
    one.close()


class FakeCuda:
    """torch.cuda on a process that holds memory on devices 0 and 2 of 4 (its current: 0)."""

    def __init__(self) -> None:
        self.reserved = {0: 6 << 30, 2: 3 << 30}

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return 4

    def memory_allocated(self, device: int = 0) -> int:
        return self.reserved.get(device, 0) // 2

    def memory_reserved(self, device: int = 0) -> int:
        return self.reserved.get(device, 0)

    def get_device_properties(self, device: int) -> SimpleNamespace:
        return SimpleNamespace(uuid=f"uuid-of-{device}")


def test_framework_memory_is_reported_for_every_device_the_process_holds_memory_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=FakeCuda()))
    assert hb.framework_memory() == (3 << 30, 6 << 30)  # the current device's, as before
    assert hb.framework_memory_by_device() == [
        {hb.DEVICE: 0, hb.DEVICE_UUID: "uuid-of-0", hb.DEVICE_ALLOCATED: 3 << 30,
         hb.DEVICE_RESERVED: 6 << 30},
        {hb.DEVICE: 2, hb.DEVICE_UUID: "uuid-of-2", hb.DEVICE_ALLOCATED: 3 << 29,
         hb.DEVICE_RESERVED: 3 << 30},
    ]  # fmt: skip


def test_at_most_one_write_per_second_and_the_latest_values_arrive(tmp_path: Path) -> None:
    path = tmp_path / "heartbeat.json"
    beat = Heartbeat(path)
    beat.update(step=0)
    started = time.monotonic()
    for step in range(1, 200):
        beat.update(step=step)
        time.sleep(0.01)  # about 2 s of steps
    beat.update(phase=hb.PHASE_SAVING)  # entering a long save: must reach the file
    seen = watch_writes(path, 2.5)
    writes = [record[hb.STEP] for record in seen]
    elapsed = time.monotonic() - started
    # One write at the start plus at most one per second since.
    assert len(os.listdir(tmp_path)) == 1  # no temporary files left behind
    assert seen[-1][hb.PHASE] == hb.PHASE_SAVING and seen[-1][hb.STEP] == 199
    assert len(writes) <= 1 + elapsed
    beat.close()


def test_rate_limit_counted_directly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "heartbeat.json"
    beat = Heartbeat(path)
    replaced: list[float] = []
    real_replace = os.replace

    def counting(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        replaced.append(time.monotonic())
        real_replace(src, dst)

    monkeypatch.setattr(hb.os, "replace", counting)
    for step in range(150):
        beat.update(step=step)
        time.sleep(0.01)
    time.sleep(1.1)
    gaps = [later - earlier for earlier, later in itertools.pairwise(replaced)]
    assert len(replaced) >= 2 and min(gaps) >= 0.99
    assert json.loads(path.read_text())[hb.STEP] == 149
    beat.close()


def test_bad_fields_are_refused(tmp_path: Path) -> None:
    beat = Heartbeat(tmp_path / "h.json")
    with pytest.raises(KeyError):
        beat.update(stepp=1)
    with pytest.raises(ValueError):
        beat.update(phase="sleeping")
    beat.close()


def test_a_heartbeat_that_cannot_be_written_never_stops_training(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    beat = Heartbeat(directory / "heartbeat.json")
    directory.rmdir()  # the volume went away
    beat.update(step=1)
    assert isinstance(beat.write_error, FileNotFoundError)
    directory.mkdir()
    time.sleep(1.05)
    beat.update(step=2)
    assert beat.write_error is None
    assert json.loads((directory / "heartbeat.json").read_text())[hb.STEP] == 2
    beat.close()
