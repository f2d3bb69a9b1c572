"""The supervisor's restart cap and back-off come from the run's `spec.recovery` (env contract)."""

from __future__ import annotations

import json

import pytest

from trainguard.contract import env
from trainguard_harness.supervisor import (
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_BACKOFF_RESET_S,
    DEFAULT_BACKOFF_S,
    DEFAULT_MAX_RESTARTS,
    parse_args,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def recovery(**fields: object) -> dict[str, str]:
    return {env.RECOVERY: json.dumps(fields)}


@pytest.mark.parametrize(
    ("environ", "argv", "expected"),
    [
        (
            {},
            [],
            (
                DEFAULT_MAX_RESTARTS,
                DEFAULT_BACKOFF_S,
                DEFAULT_BACKOFF_MAX_S,
                DEFAULT_BACKOFF_RESET_S,
            ),
        ),
        (
            recovery(
                maxRestarts=25,
                backoff={"initialSeconds": 2, "maxSeconds": 16, "resetAfterSeconds": 90},
            ),
            [],
            (25, 2.0, 16.0, 90.0),
        ),
        # The API's defaults fill what the JSON leaves out (maxRestarts 10, 5 s up to 300 s,
        # over again after 600 s).
        (recovery(), [], (10, 5.0, 300.0, 600.0)),
        # The command line wins over the env.
        (
            recovery(maxRestarts=25),
            ["--max-restarts", "1", "--backoff", "0", "--backoff-reset", "0.5"],
            (1, 0.0, 300.0, 0.5),
        ),
    ],
)
def test_restart_cap_and_backoff_follow_the_runs_recovery(
    environ: dict[str, str], argv: list[str], expected: tuple[int, float, float, float]
) -> None:
    args = parse_args([*argv, "--", "python", "-c", "pass"], environ)
    assert (args.max_restarts, args.backoff, args.backoff_max, args.backoff_reset) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        json.dumps({"maxRestarts": -1}),
        json.dumps({"backoff": {"resetAfterSeconds": 0}}),  # at least a second, as at admission
    ],
)
def test_an_invalid_recovery_is_a_usage_error(raw: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--", "true"], {env.RECOVERY: raw})
    assert exit_.value.code == 2
    assert env.RECOVERY in capsys.readouterr().err
