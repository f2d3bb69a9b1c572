"""Harness settings: the environment contract, its defaults, explicit overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.api.spec import DEFAULT_DATA_DIR, DEFAULT_L1_DIR
from trainguard.contract import env
from trainguard.contract.files import HEARTBEAT_FILENAME
from trainguard_harness.settings import HarnessSettings, OnSaveError

pytestmark = pytest.mark.unit


def test_defaults_are_the_pod_paths() -> None:
    settings = HarnessSettings.from_env({})
    assert settings.l1_dir == Path(DEFAULT_L1_DIR)
    assert settings.data_dir == Path(DEFAULT_DATA_DIR)
    assert settings.heartbeat_file == Path(env.DEFAULT_STATE_DIR) / HEARTBEAT_FILENAME
    assert settings.supervisor_state_file == Path(env.DEFAULT_STATE_DIR) / "supervisor.json"
    assert (settings.keep_last, settings.every_steps, settings.every_seconds) == (2, 50, 0.0)
    assert settings.hash_algorithm == "xxh3-128"
    assert settings.on_save_error is OnSaveError.CONTINUE


def test_environment_then_explicit_arguments() -> None:
    environ = {
        env.L1_DIR: "/l1",
        env.DATA_DIR: "/data",
        env.STATE_DIR: "/state",
        env.KEEP_LAST: "3",
        env.CKPT_EVERY_STEPS: "0",
        env.CKPT_EVERY_SECONDS: "120",
        env.HASH: "blake3",
    }
    settings = HarnessSettings.from_env(environ, keep_last=5, data_dir=None)
    assert settings.l1_dir == Path("/l1") and settings.data_dir == Path("/data")
    assert settings.heartbeat_file == Path("/state/heartbeat.json")  # follows the state dir
    assert settings.stacks_file(42) == Path("/state/stacks-42.txt")
    assert settings.keep_last == 5  # the argument wins; None means "not given"
    assert (settings.every_steps, settings.every_seconds) == (0, 120.0)
    assert settings.hash_algorithm == "blake3"
    explicit = HarnessSettings.from_env({**environ, env.HEARTBEAT_FILE: "/hb/h.json"})
    assert explicit.supervisor_state_file == Path("/hb/supervisor.json")


@pytest.mark.parametrize(
    "overrides", [{"keep_last": 0}, {"every_steps": -1}, {"every_seconds": -1.0}]
)
def test_invalid_values_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        HarnessSettings.from_env({}, **overrides)


def test_unknown_settings_are_refused() -> None:
    with pytest.raises(TypeError):
        HarnessSettings.from_env({}, l2_dir="/x")
