"""The agent tells what the restore step did, though it starts before that step runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.agent.main import ANNOTATION_RESTORED, Agent
from trainguard.contract import env
from trainguard.contract.files import RESTORE_FILENAME

pytestmark = pytest.mark.unit


class Recorder:
    """Where the agent's renewals and Events go in this test (the API's stand-in)."""

    def __init__(self) -> None:
        self.annotations: dict[str, str] = {}
        self.events: list[tuple[str, str, bool]] = []

    def renew(self, duration: int, annotations: dict[str, str]) -> None:
        self.annotations = annotations

    def event(self, reason: str, message: str, warning: bool) -> None:
        self.events.append((reason, message, warning))


def test_a_restore_that_ends_after_the_agent_started_is_told_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    environ = {env.STATE_DIR: str(state), env.L1_DIR: str(tmp_path / "l1")}
    client = Recorder()
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
