"""The asynchronous writer: exact round trips, background persist, reused buffers, failures."""

from __future__ import annotations

import errno
import importlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from harness_helpers import fill_until_free

from trainguard.ckpt import BLAKE3, SHA256, Problem, find_newest_valid, scan
from trainguard.ckpt.layout import O_DIRECT
from trainguard_dev.testing.polling import eventually
from trainguard_harness import writer as writer_module
from trainguard_harness.reader import load_newest
from trainguard_harness.writer import (
    CheckpointEvent,
    CheckpointSaveError,
    CheckpointWriter,
    EventKind,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

# The module, not the `verify` function `trainguard.ckpt` exports under the same name.
verify_module = importlib.import_module("trainguard.ckpt.verify")


def model_state(step: int, numel: int = 4096) -> dict[str, object]:
    generator = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(numel, generator=generator), "b": torch.full((3,), step)},
        "data": {"position": step * 10},
    }


def assert_state_equal(loaded: dict[str, object], expected: dict[str, object]) -> None:
    model, want = loaded["model"], expected["model"]
    assert isinstance(model, dict) and isinstance(want, dict)
    assert set(model) == set(want)
    for name in want:
        assert torch.equal(model[name], want[name])
    assert loaded["data"] == expected["data"]


def test_saves_persist_in_the_background_and_load_back_exactly(tmp_path: Path) -> None:
    events: list[CheckpointEvent] = []
    writer = CheckpointWriter(tmp_path, keep_last=2, on_event=events.append)
    for step in (10, 20, 30):
        stats = writer.save(step, model_state(step))
        assert stats.step == step and stats.nbytes >= 4096 * 4
    writer.close()
    result = scan(tmp_path)
    assert [v.step for v in result.valid] == [20, 30]
    loaded = load_newest(tmp_path).loaded
    assert loaded is not None and loaded.step == 30
    assert_state_equal(loaded.components, model_state(30))
    kinds = [(event.kind, event.step) for event in events]
    assert kinds.count((EventKind.SAVED, 30)) == 1
    assert any(kind == EventKind.PRUNED for kind, _ in kinds)
    assert writer.last_persisted is not None and writer.last_persisted.step == 30


def test_the_loop_only_blocks_for_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = writer_module.CheckpointTransaction

    def slow_transaction(*args: object, **kwargs: object) -> object:
        release.wait(10)  # the disk is "slow" until the test says otherwise
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(writer_module, "CheckpointTransaction", slow_transaction)
    writer = CheckpointWriter(tmp_path)
    state = model_state(1)
    writer.save(1, state)
    assert writer.busy  # save() returned while the persist is still pending
    # The snapshot is a copy: changing the live state now does not change the checkpoint.
    model = state["model"]
    assert isinstance(model, dict)
    model["w"].add_(1000.0)
    release.set()
    writer.close()
    loaded = load_newest(tmp_path).loaded
    assert loaded is not None
    assert_state_equal(loaded.components, model_state(1))


def test_a_new_save_waits_for_the_previous_persist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = writer_module.CheckpointTransaction

    def slow_transaction(*args: object, **kwargs: object) -> object:
        release.wait(10)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(writer_module, "CheckpointTransaction", slow_transaction)
    writer = CheckpointWriter(tmp_path)
    writer.save(1, model_state(1))
    threading.Timer(0.3, release.set).start()
    stats = writer.save(2, model_state(2))
    assert stats.wait_seconds >= 0.25
    writer.close()


def test_host_buffer_is_allocated_once_and_reused(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path, verify_after_write=False)
    writer.prepare(model_state(0))
    writer.wait()
    snapshotter = writer._snapshotter
    buffer = snapshotter._buffer
    assert buffer is not None and snapshotter.capacity >= 4096 * 4
    for step in (1, 2, 3):
        writer.save(step, model_state(step))
        writer.wait()
        assert snapshotter._buffer is buffer
    writer.save(4, model_state(4, numel=100_000))  # larger state: the buffer grows
    writer.close()
    assert snapshotter.capacity >= 100_000 * 4


def test_keep_last_n_does_not_read_back_what_a_writer_without_read_back_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L0's case: hashed as written, its kept checkpoints are not hashed again after each save.

    A checkpoint it did not write (an earlier process's) is still hashed before it is kept.
    """
    earlier = CheckpointWriter(tmp_path, keep_last=2, verify_after_write=False)
    earlier.save(1, model_state(1))
    earlier.close()
    hashed: list[Path] = []

    def counting_hash_file(path: Path, *args: object, **kwargs: object) -> object:
        hashed.append(Path(path))
        return real_hash_file(path, *args, **kwargs)

    real_hash_file = verify_module.hash_file
    monkeypatch.setattr(verify_module, "hash_file", counting_hash_file)
    writer = CheckpointWriter(tmp_path, keep_last=2, verify_after_write=False)
    for step in (2, 3, 4):
        writer.save(step, model_state(step))
        writer.wait()
    writer.close()
    # Step 1's files once, when step 2 was kept beside it; never a file the writer wrote.
    assert hashed and {path.parent.name for path in hashed} == {"step-00000001"}, hashed
    assert [v.step for v in scan(tmp_path).valid] == [3, 4]


@pytest.mark.parametrize("algorithm", [BLAKE3, SHA256])
def test_the_hash_algorithm_is_configurable(tmp_path: Path, algorithm: str) -> None:
    writer = CheckpointWriter(tmp_path, algorithm=algorithm)
    writer.save(1, model_state(1))
    writer.close()
    newest = find_newest_valid(tmp_path).newest
    assert newest is not None and newest.manifest is not None
    assert newest.manifest.hash_algorithm == algorithm


def test_a_full_disk_fails_loudly_and_keeps_the_previous(
    tmpfs: Callable[[int], Path],
) -> None:
    disk = tmpfs(4 << 20)
    events: list[CheckpointEvent] = []
    writer = CheckpointWriter(disk, keep_last=2, on_event=events.append)
    writer.save(1, model_state(1, numel=100_000))  # about 400 kB
    writer.wait()
    fill_until_free(disk, 600_000)  # room for one more partial write, not a whole checkpoint
    writer.save(2, model_state(2, numel=200_000))
    with pytest.raises(CheckpointSaveError) as raised:
        writer.wait()
    assert raised.value.errno == errno.ENOSPC and raised.value.step == 2
    assert [e.kind for e in events if e.step == 2] == [EventKind.FAILED]
    after = scan(disk)
    assert [v.step for v in after.valid] == [1] and after.invalid == () and after.partial == ()
    loaded = load_newest(disk).loaded
    assert loaded is not None
    assert_state_equal(loaded.components, model_state(1, numel=100_000))
    # The writer stays usable: once there is room again, saving works.
    (disk / "filler").unlink()
    writer.save(3, model_state(3))
    writer.close()
    assert [v.step for v in scan(disk).valid] == [1, 3]


def test_errors_surface_at_check_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail = threading.Event()

    def broken(*args: object, **kwargs: object) -> object:
        fail.wait(10)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(writer_module, "CheckpointTransaction", broken)
    writer = CheckpointWriter(tmp_path)
    writer.save(5, model_state(5))
    assert writer.busy
    writer.check()  # the persist is still running: nothing to report yet, and no waiting
    fail.set()
    eventually(lambda: not writer.busy, 30, "the persist to end", 0.01)
    with pytest.raises(CheckpointSaveError, match="Input/output error") as raised:
        writer.check()
    assert raised.value.errno == errno.EIO
    writer.check()  # reported once
    writer.close()


def test_a_checkpoint_that_does_not_read_back_is_an_error_and_is_not_pruned_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = CheckpointWriter(tmp_path, keep_last=1)
    writer.save(1, model_state(1))
    writer.wait()
    real_verify = writer_module.verify

    def flipped_on_disk(path: Path, **kwargs: bool) -> object:
        data = bytearray((path / "model.safetensors").read_bytes())
        data[-1] ^= 0xFF
        (path / "model.safetensors").write_bytes(bytes(data))
        return real_verify(path, **kwargs)

    monkeypatch.setattr(writer_module, "verify", flipped_on_disk)
    writer.save(2, model_state(2))
    with pytest.raises(CheckpointSaveError, match="does not verify after writing"):
        writer.wait()
    writer.close()
    result = scan(tmp_path)
    # keep-last-1 did not run: the previous verified checkpoint is still there.
    assert [v.step for v in result.valid] == [1]
    assert [v.step for v in result.invalid] == [2]


def test_leftovers_of_a_killed_writer_are_removed_and_reported(tmp_path: Path) -> None:
    (tmp_path / ".tmp-step-00000007-1-2").mkdir()
    events: list[CheckpointEvent] = []
    CheckpointWriter(tmp_path, on_event=events.append).close()
    assert [event.kind for event in events] == [EventKind.PARTIAL_REMOVED]
    assert list(tmp_path.iterdir()) == []


def test_the_persist_thread_runs_at_a_lower_priority(tmp_path: Path) -> None:
    loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    writer = CheckpointWriter(tmp_path)
    writer.prepare(model_state(0))  # starts the background thread
    writer.wait()
    (worker,) = writer._executor._threads
    assert worker.native_id is not None
    assert os.getpriority(os.PRIO_PROCESS, worker.native_id) == min(19, loop_nice + 10)
    # Only that thread: the training loop keeps its priority.
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == loop_nice
    writer.close()


def test_tensor_data_goes_to_the_device_with_o_direct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct_fds: set[int] = set()
    direct_bytes = [0]
    real_open, real_pwrite = os.open, os.pwrite

    def recording_open(path: str, flags: int, *args: int, **kwargs: int) -> int:
        fd = real_open(path, flags, *args, **kwargs)
        if flags & O_DIRECT:
            direct_fds.add(fd)
        return fd

    def recording_pwrite(fd: int, data: memoryview, offset: int) -> int:
        if fd in direct_fds:
            direct_bytes[0] += len(data)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(os, "pwrite", recording_pwrite)
    writer = CheckpointWriter(tmp_path)
    writer.save(1, model_state(1, numel=100_000))
    writer.close()
    monkeypatch.undo()
    # All of the 400 kB tensor but its last partial block bypassed the page cache.
    assert direct_bytes[0] >= 100_000 * 4 - 4096
    loaded = load_newest(tmp_path).loaded
    assert loaded is not None
    assert_state_equal(loaded.components, model_state(1, numel=100_000))


def test_bad_configuration_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        CheckpointWriter(tmp_path, keep_last=0)
    with pytest.raises(ValueError):
        CheckpointWriter(tmp_path, algorithm="md5")


def test_an_invalid_checkpoint_in_the_way_of_a_save_is_moved_aside_and_reported(
    tmp_path: Path,
) -> None:
    events: list[CheckpointEvent] = []
    writer = CheckpointWriter(tmp_path, keep_last=2, on_event=events.append)
    writer.save(5, model_state(5))
    writer.wait()
    (tmp_path / "step-00000005" / "MANIFEST.json").unlink()  # a save torn by the storage
    writer.save(5, model_state(5))  # the step again (a restarted trainer): the way is cleared
    writer.close()
    [moved] = [e for e in events if e.kind is EventKind.INVALID]
    assert moved.step == 5 and moved.path is not None and moved.path.name.startswith(".invalid-")
    assert moved.problems == (Problem(None, "missing MANIFEST.json"),)
    assert moved.path.is_dir()  # kept for inspection, never read again
    assert [v.step for v in scan(tmp_path).valid] == [5]
