"""The rank launcher: torchrun's command line, its record of a failed rank, finding the ranks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.contract import env
from trainguard.contract.env import ContractError, PodEnv
from trainguard.contract.files import SUPERVISOR_RANK_FAILURE, RankFailure
from trainguard_dev.testing.polling import eventually
from trainguard_harness.launcher import (
    Gang,
    ended,
    failure_of,
    find_ranks,
    launch_command,
    read_result,
    torchrun_args,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def test_one_rank_runs_the_command_itself(tmp_path: Path) -> None:
    assert launch_command(["python", "train.py"], 1, tmp_path / "r.json") == ["python", "train.py"]
    several = launch_command(["python", "train.py"], 4, tmp_path / "r.json")
    assert several[1:3] == ["-m", "trainguard_harness.launcher"]
    assert several[-3:] == ["--", "python", "train.py"]


def test_torchrun_never_restarts_and_picks_its_port_at_bind_time() -> None:
    args = torchrun_args(["python", "train.py"], 2)
    assert args[:1] == ["--standalone"]  # rendezvous on port 0, a fresh id per launch
    assert args[args.index("--max-restarts") + 1] == "0"
    assert args[args.index("--nproc-per-node") + 1] == "2"
    assert args[-3:] == ["--no-python", "python", "train.py"]


def test_a_gang_member_joins_member_0s_rendezvous_even_with_one_rank(tmp_path: Path) -> None:
    member = {env.NNODES: "3", env.NODE_RANK: "2", env.MASTER_ADDR: "llm-0.llm"}
    pod = PodEnv.from_env({**member, env.MASTER_PORT: "29500"})
    gang = Gang.of(pod)
    assert gang == Gang(3, 2, "llm-0.llm", 29500)
    # One rank per member still runs under torchrun: WORLD_SIZE and RANK span the gang.
    command = launch_command(["python", "train.py"], 1, tmp_path / "r.json", gang)
    assert command[1:3] == ["-m", "trainguard_harness.launcher"]
    args = torchrun_args(["python", "train.py"], 1, gang)
    assert "--standalone" not in args
    options = dict(zip(args[:8:2], args[1:8:2], strict=True))
    assert options == {
        "--nnodes": "3",
        "--node-rank": "2",
        "--master-addr": "llm-0.llm",
        "--master-port": "29500",
    }
    assert args[args.index("--max-restarts") + 1] == "0"
    assert Gang.of(PodEnv.from_env({})) is None  # one pod: torchrun standalone, if at all


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({env.NNODES: "2"}, env.MASTER_ADDR),
        ({env.NNODES: "2", env.NODE_RANK: "2", env.MASTER_ADDR: "a"}, env.NODE_RANK),
    ],
)
def test_a_member_without_its_place_in_the_gang_is_refused(
    variables: dict[str, str], named: str
) -> None:
    with pytest.raises(ContractError, match=named):
        Gang.of(PodEnv.from_env(variables))


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (signal.SIGKILL, RankFailure(1, 10, signal="SIGKILL")),
        (3 << 8, RankFailure(1, 10, exit_code=3)),
        (None, RankFailure(1, 10)),
    ],
)
def test_a_wait_status_tells_how_a_rank_ended(status: int | None, expected: RankFailure) -> None:
    assert failure_of(1, 10, status) == expected


def test_a_zombie_shows_its_wait_status_until_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        found = eventually(lambda: ended(child.pid)[0] and ended(child.pid), 20, "the exit")
        assert found == (True, 3 << 8)
    finally:
        child.wait()
    assert ended(child.pid) == (True, None)


RANKS_SCRIPT = """
import os, subprocess, sys, time
children = [
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                     env={**os.environ, "LOCAL_RANK": str(r)})
    for r in (0, 1)
]
other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(" ".join(str(p.pid) for p in [*children, other]), flush=True)
time.sleep(60)
"""


def test_the_ranks_are_the_launchers_children_with_a_local_rank() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", RANKS_SCRIPT], stdout=subprocess.PIPE, text=True
    )
    pids: list[int] = []
    try:
        assert parent.stdout is not None
        pids = [int(pid) for pid in parent.stdout.readline().split()]
        assert find_ranks(parent.pid) == {0: pids[0], 1: pids[1]}  # not the third child
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()


def test_the_launcher_records_the_first_failed_rank(tmp_path: Path) -> None:
    result = tmp_path / "launch.json"
    rank_1_fails = "import os, sys; sys.exit(7 if os.environ['LOCAL_RANK'] == '1' else 0)"
    done = subprocess.run(
        [sys.executable, "-m", "trainguard_harness.launcher", "--nproc-per-node", "2",
         "--result", str(result), "--", sys.executable, "-c", rank_1_fails],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    recorded = read_result(result)
    assert recorded is not None and (recorded.rank, recorded.exit_code) == (1, 7)
    assert recorded.signal is None and recorded.pid
    assert json.loads(result.read_text())[SUPERVISOR_RANK_FAILURE]["rank"] == 1
    assert "rank 1 (pid" in done.stderr and "exited with 7" in done.stderr


def test_a_launch_whose_ranks_all_finish_records_nothing(tmp_path: Path) -> None:
    result = tmp_path / "launch.json"
    done = subprocess.run(
        [sys.executable, "-m", "trainguard_harness.launcher", "--nproc-per-node", "2",
         "--result", str(result), "--", sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert not result.exists()
