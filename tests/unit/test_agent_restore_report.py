"""The agent tells every restore record once: the restore step's and each later resume.

The restore step reports after the agent started; a trainer restarted in place that resumed
from L0 leaves a record of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.agent.main import ANNOTATION_LAYERS, ANNOTATION_RESTORED, Agent
from trainguard.api.constants import L0_LAYER
from trainguard.ckpt import CheckpointTransaction
from trainguard.contract import env
from trainguard.contract.files import RESTORE_FILENAME, RestoreReport, write_restore_report
from trainguard_dev.testing.agent_api import AgentApiRecorder

pytestmark = pytest.mark.unit


def test_a_restore_that_ends_after_the_agent_started_is_told_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    environ = {env.STATE_DIR: str(state), env.L1_DIR: str(tmp_path / "l1")}
    client = AgentApiRecorder()
    agent = Agent(environ, client)
    agent.step()
    assert not [e for e in client.events if e[0] == "Restored"]
    assert ANNOTATION_RESTORED not in client.annotations
    (state / RESTORE_FILENAME).write_text(json.dumps({"step": 40, "from_layer": "s3"}))
    agent.step()
    agent.step()
    restored = [e for e in client.events if e[0] == "Restored"]
    assert restored == [("Restored", "restored step 40 from layer s3", False)]
    assert json.loads(client.annotations[ANNOTATION_RESTORED]) == {
        "step": 40,
        "layer": "s3",
        "message": "restored step 40 from layer s3",
    }


def test_each_resume_the_harness_records_is_told_once(tmp_path: Path) -> None:
    state, l0 = tmp_path / "state", tmp_path / "l0"
    state.mkdir()
    environ = {env.STATE_DIR: str(state), env.L1_DIR: str(tmp_path / "l1"), env.L0_DIR: str(l0)}
    report = state / RESTORE_FILENAME
    report.write_text(json.dumps({"step": 40, "from_layer": "s3"}))
    client = AgentApiRecorder()
    agent = Agent(environ, client)
    agent.step()
    # A trainer restarted in place resumed from L0: a record of its own, with its time.
    write_restore_report(report, RestoreReport(step=57, from_layer=L0_LAYER, time=1796380000.5))
    agent.step()
    agent.step()
    restored = [e for e in client.events if e[0] == "Restored"]
    assert restored == [
        ("Restored", "restored step 40 from layer s3", False),
        ("Restored", "restored step 57 from layer l0", False),
    ]
    assert json.loads(client.annotations[ANNOTATION_RESTORED]) == {
        "step": 57,
        "layer": "l0",
        "time": 1796380000.5,
        "message": "restored step 57 from layer l0",
    }


def test_the_lease_carries_l0s_newest_checkpoint(tmp_path: Path) -> None:
    state, l0 = tmp_path / "state", tmp_path / "l0"
    state.mkdir()
    environ = {env.STATE_DIR: str(state), env.L1_DIR: str(tmp_path / "l1"), env.L0_DIR: str(l0)}
    client = AgentApiRecorder()
    agent = Agent(environ, client)
    agent.step()
    assert json.loads(client.annotations[ANNOTATION_LAYERS]) == {"l0": {}}
    for step in (6, 7):
        with CheckpointTransaction(l0, step) as txn:
            txn.write_file("model.bin", b"weights")
            txn.commit()
    agent.step()
    assert json.loads(client.annotations[ANNOTATION_LAYERS]) == {"l0": {"step": 7}}
