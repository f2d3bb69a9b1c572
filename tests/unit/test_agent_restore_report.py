"""The agent tells what the restore step did, though it starts before that step runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.agent.main import ANNOTATION_RESTORED, Agent
from trainguard.contract import env
from trainguard.contract.files import RESTORE_FILENAME
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
    assert client.annotations[ANNOTATION_RESTORED] == "restored step 40 from layer s3"
