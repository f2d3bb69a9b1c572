"""TrainingSession: resume, cadence, RNG restore, save-error policy, SIGTERM, heartbeat fields."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from harness_helpers import fill_until_free

from trainguard.agent.signals import read_heartbeat
from trainguard.api.spec import STEP_TIME_WINDOW
from trainguard.ckpt import Contents, copy_checkpoint, scan
from trainguard.contract.files import (
    RESTORE_FILENAME,
    RestoreReport,
    read_restore_report,
    write_restore_report,
)
from trainguard_dev.testing.polling import eventually
from trainguard_harness import heartbeat as hb
from trainguard_harness import session as session_module
from trainguard_harness.session import MissingComponentError, TrainingSession
from trainguard_harness.settings import HarnessSettings, OnSaveError
from trainguard_harness.writer import CheckpointSaveError, CheckpointWriter, SaveStats

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Counter:
    """A minimal stateful component: a data position."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state["position"]


def settings_for(root: Path, **overrides: Any) -> HarnessSettings:
    paths = {
        "l1_dir": root / "l1",
        "state_dir": root / "state",
        "heartbeat_file": root / "state" / "heartbeat.json",
    }
    return HarnessSettings.from_env({}, **{**paths, **overrides})


def make_session(root: Path, **overrides: Any) -> tuple[TrainingSession, torch.nn.Module, Counter]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    counter = Counter()
    session = TrainingSession(
        {"model": model, "optimizer": optimizer, "data": counter},
        settings_for(root, **overrides),
        handle_sigterm=False,
    )
    session._optimizer = optimizer  # type: ignore[attr-defined]
    return session, model, counter


def train_step(session: TrainingSession, model: torch.nn.Module, counter: Counter) -> float:
    optimizer = session._optimizer  # type: ignore[attr-defined]
    x = torch.randn(4, 8)
    noise = random.random() + float(np.random.rand())
    loss = (torch.nn.functional.dropout(model(x), 0.5) ** 2).mean() + noise
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    counter.position += 4
    return loss.item()


def test_resume_continues_exactly_including_every_rng(tmp_path: Path) -> None:
    session, model, counter = make_session(tmp_path / "a", every_steps=5)
    random.seed(1)
    np.random.seed(1)
    assert session.resume() == 0
    reference = []
    for step in range(1, 11):
        reference.append(train_step(session, model, counter))
        session.end_step(step, loss=reference[-1], tokens=4)
    session.close(10)

    # A second process would start here: fresh objects, different seeds, same L1.
    resumed, model2, counter2 = make_session(tmp_path / "a", every_steps=5)
    torch.manual_seed(999)
    random.seed(999)
    np.random.seed(999)
    # Pretend the first run died after step 5: drop the later checkpoint.
    for checkpoint in scan(tmp_path / "a" / "l1").valid:
        if checkpoint.step == 10:
            os.rename(checkpoint.path, tmp_path / "gone")
    assert resumed.resume() == 5
    assert counter2.position == 20
    again = [train_step(resumed, model2, counter2) for _ in range(5)]
    assert again == reference[5:]
    resumed.close()


def test_cadence_by_steps_and_by_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session, model, counter = make_session(tmp_path / "s", every_steps=3)
    session.resume()
    saved = []
    for step in range(1, 8):
        train_step(session, model, counter)
        session.end_step(step)
        saved.append(session.last_saved_step)
    assert saved == [None, None, 3, 3, 3, 6, 6]
    session.close()

    clock = [1000.0]
    monkeypatch.setattr(session_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    timed, model, counter = make_session(tmp_path / "t", every_steps=0, every_seconds=60)
    timed.resume()
    for step, elapsed in enumerate([10, 30, 61, 62, 130], start=1):
        clock[0] = 1000.0 + elapsed
        train_step(timed, model, counter)
        timed.end_step(step)
        saved.append(timed.last_saved_step)
    assert saved[-5:] == [None, None, 3, 3, 5]
    timed.close()


def test_heartbeat_reports_steps_loss_phase_and_checkpoints(tmp_path: Path) -> None:
    session, _, _ = make_session(tmp_path, every_steps=2)
    session.resume()
    for step in (1, 2):
        session.end_step(step, loss=0.5, tokens=100)
    session.close()
    record = json.loads((tmp_path / "state" / "heartbeat.json").read_text())
    assert record[hb.PID] == os.getpid()
    assert record[hb.STEP] == 2 and record[hb.LOSS] == 0.5
    # Closed: its last checkpoint saved, the process ends on purpose (no death to its agent).
    assert record[hb.PHASE] == hb.PHASE_CLOSED
    assert record[hb.LAST_CHECKPOINT_STEP] == 2 and record[hb.CHECKPOINT_ERROR] is None
    assert 0 < record[hb.CHECKPOINT_STALL_S] < 5
    # No GPU here: framework memory is unknown, not zero.
    assert record[hb.MEMORY_ALLOCATED] is None and record[hb.MEMORY_RESERVED] is None
    assert record[hb.MEMORY_BY_DEVICE] is None


def test_heartbeat_reports_the_slowest_recent_step_once_five_are_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(session_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    session, _, _ = make_session(tmp_path, every_steps=0)
    session.resume()
    seen = []
    # Steps 0.1 s apart, one of 0.7 s (step 4), then STEP_TIME_WINDOW more of 0.2 s.
    gaps = [0.1, 0.1, 0.1, 0.7, 0.1, 0.1] + [0.2] * STEP_TIME_WINDOW
    for step, gap in enumerate(gaps, start=1):
        clock[0] += gap
        session.report_step(step)
        seen.append(session.heartbeat.snapshot()[hb.SLOWEST_STEP_S])
    # The first step has no time before it; five step times are needed for a figure.
    assert seen[:5] == [None] * 5
    assert seen[5] == pytest.approx(0.7)
    # The 0.7 s step leaves the window of the last STEP_TIME_WINDOW step times.
    assert seen[-1] == pytest.approx(0.2)
    session.close()
    # The agent reads it from the file.
    beat = read_heartbeat(tmp_path / "state" / "heartbeat.json")
    assert beat is not None and beat.slowest_step_s == pytest.approx(0.2)


@pytest.mark.parametrize("policy", [OnSaveError.CONTINUE, OnSaveError.STOP])
def test_full_disk_policy(
    tmp_path: Path, tmpfs: Callable[[int], Path], policy: OnSaveError
) -> None:
    disk = tmpfs(2 << 20)
    session, model, counter = make_session(
        tmp_path, l1_dir=disk / "l1", every_steps=1, on_save_error=policy
    )
    session.resume()
    train_step(session, model, counter)
    session.end_step(1)
    session.writer.wait()
    fill_until_free(disk, 2_000)
    train_step(session, model, counter)
    session.end_step(2)  # the save of step 2 is handed to the background and fails there
    eventually(lambda: not session.writer.busy, 30, "the background save to end", 0.01)
    train_step(session, model, counter)
    if policy is OnSaveError.STOP:
        with pytest.raises(CheckpointSaveError, match="No space left"):
            session.end_step(3)
        session.close()
    else:
        for step in (3, 4):
            session.end_step(step)  # reported, and training goes on
            train_step(session, model, counter)
        session.close(4)
    assert "No space left" in str(session.heartbeat.snapshot()[hb.CHECKPOINT_ERROR])
    result = scan(disk / "l1")
    assert [v.step for v in result.valid] == [1]
    assert result.invalid == () and result.partial == ()


def test_sigterm_requests_a_graceful_stop(tmp_path: Path) -> None:
    session = TrainingSession({"data": Counter()}, settings_for(tmp_path))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert not session.stop_requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert session.stop_requested
    finally:
        signal.signal(signal.SIGTERM, previous)
        session.close()


def test_weights_only_checkpoints_restore_the_model_and_nothing_else(tmp_path: Path) -> None:
    session, model, counter = make_session(tmp_path / "full", every_steps=1)
    session.resume()
    train_step(session, model, counter)
    session.end_step(1)
    session.close()
    full = scan(tmp_path / "full" / "l1").valid[0].path
    copy_checkpoint(
        full, tmp_path / "w" / "l1", paths=["model.safetensors"], contents=Contents.WEIGHTS
    )
    fresh, model2, counter2 = make_session(tmp_path / "w")
    assert fresh.resume() == 1
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters(), strict=True)
    )
    assert counter2.position == 0
    fresh.close()


def test_a_full_checkpoint_missing_a_component_is_refused(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path / "l1")
    writer.save(3, {"other": {"x": 1}})
    writer.close()
    session, _, _ = make_session(tmp_path)
    with pytest.raises(MissingComponentError):
        session.resume()
    session.close()


def test_component_names_must_be_file_names(tmp_path: Path) -> None:
    for name in ("rng", "../x", "", "a b"):
        with pytest.raises(ValueError):
            TrainingSession({name: Counter()}, settings_for(tmp_path), handle_sigterm=False)


def _findings(root: Path) -> list[dict[str, Any]]:
    """The invalid checkpoints the heartbeat lists, as the agent reads them."""
    beat = read_heartbeat(root / "state" / "heartbeat.json")
    assert beat is not None
    return [finding.to_dict() for finding in beat.invalid_checkpoints]


def test_keep_last_n_keeps_an_invalid_checkpoint_and_the_heartbeat_tells_it_once(
    tmp_path: Path,
) -> None:
    session, model, counter = make_session(tmp_path, every_steps=1, keep_last=1)
    session.resume()
    session.end_step(1)
    session.writer.wait()
    first = tmp_path / "l1" / "step-00000001"
    (first / "model.safetensors").write_bytes(b"torn")
    for step in (2, 3):
        train_step(session, model, counter)
        session.end_step(step)
    session.close()
    # Keep-last-1 removed 2 when 3 verified, never the invalid 1: kept, and reported.
    assert [v.step for v in scan(tmp_path / "l1").valid] == [3]
    assert first.is_dir()
    [finding] = _findings(tmp_path)
    assert (finding["layer"], finding["step"], finding["file"], finding["found"]) == (
        "l1",
        1,
        "model.safetensors",
        "Scan",
    )
    assert finding["reason"].startswith("size 4 != ")


def test_a_checkpoint_skipped_at_resume_is_told_with_its_file_and_reason(tmp_path: Path) -> None:
    session, model, counter = make_session(tmp_path, every_steps=1, keep_last=2)
    session.resume()
    for step in (1, 2):
        train_step(session, model, counter)
        session.end_step(step)
    session.close()
    newest = tmp_path / "l1" / "step-00000002" / "optimizer.safetensors"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0x01
    newest.write_bytes(bytes(data))
    resumed, _, _ = make_session(tmp_path, every_steps=1, keep_last=2)
    assert resumed.resume() == 1
    resumed.heartbeat.close()
    [finding] = _findings(tmp_path)
    assert (finding["layer"], finding["step"], finding["file"], finding["reason"]) == (
        "l1",
        2,
        "optimizer.safetensors",
        "xxh3-128 hash mismatch",
    )
    assert newest.exists()  # skipped, never deleted


def test_a_checkpoint_found_invalid_at_resume_outlives_keep_last_n(tmp_path: Path) -> None:
    """Its sizes match (a flipped byte): only the resume's hashes could tell, so it is named."""
    session, model, counter = make_session(tmp_path, every_steps=1, keep_last=2)
    session.resume()
    for step in (1, 2):
        train_step(session, model, counter)
        session.end_step(step)
    session.close()
    corrupt = tmp_path / "l1" / "step-00000002"
    data = bytearray((corrupt / "model.safetensors").read_bytes())
    data[-1] ^= 0x01
    (corrupt / "model.safetensors").write_bytes(bytes(data))
    resumed, model2, counter2 = make_session(tmp_path, every_steps=1, keep_last=1)
    assert resumed.resume() == 1
    for step in (3, 4):  # skipping 2: its step is never saved again here
        train_step(resumed, model2, counter2)
        resumed.end_step(step)
    resumed.close()
    assert [v.step for v in scan(tmp_path / "l1").valid] == [4]
    assert corrupt.is_dir()  # older than the one kept, still there
    [finding] = _findings(tmp_path)
    assert (finding["step"], finding["reason"]) == (2, "xxh3-128 hash mismatch")


def test_l0_snapshots_every_step_of_a_small_state_and_a_resume_takes_the_newest(
    tmp_path: Path,
) -> None:
    """A small state's snapshot stalls far below 1 % of a step: L0 keeps up with every step."""
    l0 = tmp_path / "l0"
    session, model, counter = make_session(tmp_path, every_steps=10, l0_dir=l0)
    assert session.resume() == 0
    for step in range(1, 14):
        train_step(session, model, counter)
        time.sleep(0.1)  # a step of 100 ms: 1 ms of stall budget
        session.end_step(step)
        if step > 1:  # the first step allocates the buffers in the background
            assert session.l0_writer is not None
            session.l0_writer.wait()
            assert session.last_l0_step == step
    # Killed here (no close): L1 holds step 10, L0 the last two steps, verified.
    assert [v.step for v in scan(l0).valid] == [12, 13]
    assert [v.step for v in scan(tmp_path / "l1").valid] == [10]
    # A fresh start recorded nothing; the resume from L0 is recorded for the agent.
    assert read_restore_report(tmp_path / "state" / RESTORE_FILENAME) is None
    resumed, model2, counter2 = make_session(tmp_path, every_steps=10, l0_dir=l0)
    assert resumed.resume() == 13
    assert resumed.resumed is not None and resumed.resumed.layer == "l0"
    assert counter2.position == counter.position
    assert torch.equal(model2.weight, model.weight)
    report = read_restore_report(tmp_path / "state" / RESTORE_FILENAME)
    assert report is not None and (report.step, report.from_layer) == (13, "l0")
    assert report.time is not None
    resumed.close()


def test_l0_snapshots_a_small_state_every_other_fast_step_and_every_slow_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 4 ms snapshot (the reference trainer's) is 4 % of a 100 ms step: every other step.

    A death then loses at most the one step since the last snapshot, at half the cost. Where
    1 % of the loop covers the stall (a 0.5 s step), every step.
    """
    session, model, counter = make_session(tmp_path, every_steps=100, l0_dir=tmp_path / "l0")
    writer = session.l0_writer
    assert writer is not None and session.resume() == 0
    real_save = writer.save

    def save_stalling_4_ms(step: int, state: Any) -> SaveStats:
        stats = real_save(step, state)
        return dataclasses.replace(stats, wait_seconds=0.0, snapshot_seconds=0.004)

    monkeypatch.setattr(writer, "save", save_stalling_4_ms)
    snapshots = []
    for step, seconds in enumerate([0.1] * 7 + [0.5] * 3, start=1):
        train_step(session, model, counter)
        time.sleep(seconds)
        session.end_step(step)
        writer.wait()
        snapshots.append(session.last_l0_step)
    session.close()
    # Step 1 is skipped: the first step allocates the buffers in the background.
    assert snapshots == [None, 2, 2, 4, 4, 6, 6, 8, 9, 10]


def test_a_resume_from_the_checkpoint_the_restore_step_reported_keeps_its_report(
    tmp_path: Path,
) -> None:
    session, model, counter = make_session(tmp_path, every_steps=2)
    session.resume()
    for step in (1, 2):
        train_step(session, model, counter)
        session.end_step(step)
    session.close()
    # The restore step brought step 2 into L1 from a remote layer (its origin is its own).
    path = tmp_path / "state" / RESTORE_FILENAME
    write_restore_report(path, RestoreReport(step=2, from_layer="s3", origin="attempt 1"))
    before = path.read_bytes()
    resumed, _, _ = make_session(tmp_path, every_steps=2, l0_dir=tmp_path / "l0")
    assert resumed.resume() == 2
    resumed.close()
    assert path.read_bytes() == before
