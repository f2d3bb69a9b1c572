"""A gang member's supervisor follows the gang's restart generation (`gang.json`).

Each test runs a real `Supervisor` as a gang member in a process of its own, with its ranks
started by the real launcher (torchrun) and a small rank script that imports no torch. The
member is the only one of its gang (`Gang(1, 0, ...)`: torchrun's static rendezvous, hosted by
its own launcher), so a launch starts without a peer; the supervisor's gang rules depend only
on its being a member, not on how many there are (`test_gang_members.py` runs two).
The order is written as the pod's agent writes it (`write_gang_order`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainguard.contract.files import (
    GANG_FILENAME,
    SUPERVISOR_FAILED_GENERATION,
    SUPERVISOR_GANG_GENERATION,
    read_gang_generations,
    read_json,
    read_rank_pids,
    write_gang_order,
)
from trainguard_dev.testing.polling import eventually, holds
from trainguard_harness.launcher import ended

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

# Generous for two cores under load: every launch imports torch in the launcher.
START_S = 60

# The supervisor of a one-member gang: argv[1] is a JSON object of its settings.
MEMBER = """
import json, sys
from pathlib import Path
from trainguard_harness.launcher import Gang
from trainguard_harness.supervisor import Supervisor
o = json.loads(sys.argv[1])
supervisor = Supervisor(
    o["command"], Path(o["state_file"]), max_restarts=3, backoff=o["backoff"],
    backoff_max=o["backoff"], backoff_reset=600.0, l1_dir=Path(o["l1"]),
    grace_period=o["grace"], gang=Gang(1, 0, "127.0.0.1", o["port"]),
)
sys.exit(supervisor.run())
"""

# The rank: argv[1] its directory, argv[2] what each launch's rank does, comma-separated:
# "fail" exits 3, "wait" waits for the file `finish` and exits 0, "ignore-term" waits
# ignoring SIGTERM. Each launch's rank writes its PID to rank-<launch>.
RANK = """
import os, signal, sys, time
out, plan = sys.argv[1], sys.argv[2].split(",")
marker = os.path.join(out, "launches")
launch = int(open(marker).read()) + 1 if os.path.exists(marker) else 1
open(marker, "w").write(str(launch))
what = plan[launch - 1]
if what == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(out, f"rank-{launch}"), "w").write(f"{os.getpid()}\\n")
if what == "fail":
    sys.exit(3)
while not os.path.exists(os.path.join(out, "finish")):
    time.sleep(0.05)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Member:
    """A gang member's supervisor in a process of its own, and its state directory."""

    def __init__(
        self, root: Path, plan: str, *, order: int | None, backoff: float, grace: float = 30.0
    ) -> None:
        self.root = root
        self.state_file = root / "state" / "supervisor.json"
        self.gang_file = self.state_file.with_name(GANG_FILENAME)
        self.state_file.parent.mkdir(parents=True)
        if order is not None:  # the agent wrote it before the supervisor started
            write_gang_order(self.gang_file, order)
        settings = {
            "command": [sys.executable, "-c", RANK, str(root), plan],
            "state_file": str(self.state_file),
            "backoff": backoff,
            "grace": grace,
            "l1": str(root / "l1"),
            "port": free_port(),
        }
        self.log = (root / "output.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", MEMBER, json.dumps(settings)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return (self.root / "output.log").read_text()[-4000:]

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.state_file.read_text())
        return data

    def running(self, launch: int) -> int:
        """Wait until launch `launch`'s rank runs and is published; its PID."""

        def published() -> int | None:
            assert self.process.poll() is None, self.output()
            path = self.root / f"rank-{launch}"
            text = path.read_text() if path.exists() else ""
            if not text.endswith("\n"):
                return None
            pid = int(text)
            return pid if read_rank_pids(self.state_file) == {0: pid} else None

        return eventually(published, START_S, f"launch {launch}'s rank running", 0.05)

    def finish(self) -> int:
        (self.root / "finish").write_text("")
        return self.process.wait(timeout=START_S)

    def kill(self) -> None:
        """End the supervisor, and the launcher and rank it may leave (sessions of their own)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        kill_launch(self.state_file)
        self.log.close()


def kill_launch(state_file: Path) -> None:
    """SIGKILL the groups of the launcher and ranks a supervisor last published."""
    state = read_json(state_file) or {}
    for pid in [state.get("child_pid"), *(state.get("rank_pids") or {}).values()]:
        if isinstance(pid, int) and pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def members() -> Any:
    started: list[Member] = []
    yield started
    for member in started:
        member.kill()


def test_after_its_own_failure_a_member_relaunches_on_the_next_generation(
    tmp_path: Path, members: list[Member]
) -> None:
    member = Member(tmp_path, "fail,wait", order=0, backoff=0.05)
    members.append(member)
    second = member.running(2)
    state = member.state()
    assert state[SUPERVISOR_GANG_GENERATION] == 1 and state[SUPERVISOR_FAILED_GENERATION] == 0
    assert read_gang_generations(member.state_file) == (1, 0)
    assert state["restarts"] == 1 and state["restarts_without_progress"] == 1
    assert state["rank_failure"]["exit_code"] == 3
    # The operator, told of the failure, orders generation 1: the member follows it already.
    write_gang_order(member.gang_file, 1)
    holds(
        lambda: read_rank_pids(member.state_file) == {0: second} and member.state()["attempt"] == 2,
        2.0,
        "the relaunch to run on, not restarted a second time",
    )
    assert member.finish() == 0
    state = member.state()
    assert state["state"] == "completed" and len(state["history"]) == 2
    assert (state["gang_generation"], state["failed_generation"]) == (1, 0)
    assert state["last_gang_restart"] is None


def test_a_newer_order_ends_the_launch_at_once_and_relaunches_without_back_off(
    tmp_path: Path, members: list[Member]
) -> None:
    member = Member(tmp_path, "wait,wait", order=0, backoff=30.0)  # a back-off would show
    members.append(member)
    first = member.running(1)
    assert member.state()[SUPERVISOR_GANG_GENERATION] == 0
    ordered_at = time.time()
    write_gang_order(member.gang_file, 1)
    second = member.running(2)
    assert ended(first)[0]  # the rank of the stopped launch is gone
    state = member.state()
    restart = state["last_gang_restart"]
    assert (restart["generation"], restart["from"]) == (1, 0)
    assert 0 <= restart["killed_at"] - ordered_at < 5
    assert (state["gang_generation"], state["failed_generation"]) == (1, 0)
    # Not this member's failure: counted as a restart, but neither against progress nor in
    # the back-off, and no rank failure recorded.
    assert state["restarts"] == 1
    assert state["restarts_without_progress"] == 0 and state["backoff_restarts"] == 0
    assert state["rank_failure"] is None
    stopped, relaunched = state["history"]
    assert stopped["signal"] == "SIGKILL" and "generation 1" in stopped["reason"]
    assert relaunched["started_at"] - stopped["ended_at"] < 5  # no 30 s back-off
    assert relaunched["attempt"] == 2 and read_rank_pids(member.state_file) == {0: second}
    assert member.finish() == 0
    assert member.state()["state"] == "completed"


def test_a_members_first_order_adopts_the_gangs_generation_without_a_restart(
    tmp_path: Path, members: list[Member]
) -> None:
    # A member created after the gang restarted: its agent writes the first order only after
    # the supervisor started. It learns where the gang is; a later order restarts it.
    member = Member(tmp_path, "wait,wait", order=None, backoff=30.0)
    members.append(member)
    first = member.running(1)
    assert member.state()[SUPERVISOR_GANG_GENERATION] == 0
    write_gang_order(member.gang_file, 3)
    eventually(
        lambda: member.state()[SUPERVISOR_GANG_GENERATION] == 3, 10, "generation 3 adopted", 0.05
    )
    state = member.state()
    assert state["attempt"] == 1 and state["restarts"] == 0 and state["last_gang_restart"] is None
    assert read_rank_pids(member.state_file) == {0: first}
    assert state[SUPERVISOR_FAILED_GENERATION] is None
    write_gang_order(member.gang_file, 4)
    member.running(2)
    state = member.state()
    assert state["gang_generation"] == 4 and state["failed_generation"] == 3
    assert (state["last_gang_restart"]["generation"], state["last_gang_restart"]["from"]) == (4, 3)
    assert member.finish() == 0


def test_a_terminating_member_ignores_orders(tmp_path: Path, members: list[Member]) -> None:
    grace = 3.0
    member = Member(tmp_path, "ignore-term", order=0, backoff=0.05, grace=grace)
    members.append(member)
    member.running(1)
    terminated_at = time.time()
    member.process.send_signal(signal.SIGTERM)
    write_gang_order(member.gang_file, 1)
    # The rank ignores SIGTERM: the launch ends when the grace period is over, not at the order.
    assert member.process.wait(timeout=START_S) == 128 + signal.SIGKILL
    state = member.state()
    assert state["state"] == "terminated" and len(state["history"]) == 1
    assert state["history"][0]["ended_at"] - terminated_at >= grace - 0.5
    assert state["last_gang_restart"] is None and state["gang_generation"] == 0


FAILS_ONCE = """
import os, sys
marker = os.path.join(sys.argv[1], "failed")
if not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(3)
"""


def test_a_one_pod_run_has_no_generation_and_ignores_gang_json(tmp_path: Path) -> None:
    state_file = tmp_path / "state" / "supervisor.json"
    state_file.parent.mkdir()
    write_gang_order(state_file.with_name(GANG_FILENAME), 5)
    command = [
        sys.executable, "-m", "trainguard.cli.main", "supervise", "--state-file", str(state_file),
        "--no-gpu", "--backoff", "0.05", "--", sys.executable, "-c", FAILS_ONCE, str(tmp_path),
    ]  # fmt: skip
    assert subprocess.run(command, timeout=30, check=False).returncode == 0
    state = json.loads(state_file.read_text())
    assert state["state"] == "completed" and state["restarts"] == 1
    assert state["gang_generation"] is None and state["failed_generation"] is None
    assert state["last_gang_restart"] is None


# Two ranks per launch (LOCAL_RANK): in the first launch rank 0 exits 3 after 2 s while rank 1
# ignores the SIGTERM the launcher sends the others, so the launcher takes its time to end the
# launch; later launches wait for `finish`.
TWO_RANKS = """
import os, signal, sys, time
out, rank = sys.argv[1], os.environ["LOCAL_RANK"]
marker = os.path.join(out, f"launches-{rank}")
launch = int(open(marker).read()) + 1 if os.path.exists(marker) else 1
open(marker, "w").write(str(launch))
open(os.path.join(out, f"rank-{rank}-{launch}"), "w").write(f"{os.getpid()}\\n")
if launch == 1 and rank == "0":
    time.sleep(2)  # seen running first, then gone alone
    sys.exit(3)
if launch == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while not os.path.exists(os.path.join(out, "finish")):
    time.sleep(0.05)
"""


def test_an_order_while_a_failed_launch_winds_down_keeps_the_members_own_failure(
    tmp_path: Path, members: list[Member]
) -> None:
    # The operator, told of this member's failure, orders the next generation while the
    # launcher is still ending the launch's other rank: the failure stays this member's.
    member = Member(tmp_path, "", order=0, backoff=0.05)
    member.kill()
    settings = {
        "command": [sys.executable, "-c", TWO_RANKS, str(tmp_path)],
        "state_file": str(member.state_file),
        "backoff": 0.05,
        "grace": 30.0,
        "l1": str(tmp_path / "l1"),
        "port": free_port(),
    }
    script = MEMBER.replace("gang=Gang(", "procs_per_node=2, gang=Gang(")
    member.log = (tmp_path / "output.log").open("w")
    member.process = subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(settings)],
        stdout=member.log,
        stderr=subprocess.STDOUT,
    )
    members.append(member)
    eventually(
        lambda: (tmp_path / "rank-0-1").exists() and (tmp_path / "rank-1-1").exists(),
        START_S,
        "the first launch's two ranks",
        0.05,
    )
    eventually(
        lambda: (
            (state := member.state())["state"] == "running"
            and (state.get("rank_failure") or {}).get("exit_code") == 3
        ),
        START_S,
        "rank 0's failure seen while rank 1 lingers",
        0.05,
    )
    write_gang_order(member.gang_file, 1)
    eventually(
        lambda: (tmp_path / "rank-0-2").exists() and (tmp_path / "rank-1-2").exists(),
        START_S + 30,
        "the relaunch",
        0.1,
    )
    eventually(lambda: member.state()["attempt"] == 2, 10, "the relaunch published", 0.05)
    state = member.state()
    assert state["last_gang_restart"] is None, state  # no ordered stop: its own failure
    assert (state["rank_failure"]["rank"], state["rank_failure"]["exit_code"]) == (0, 3)
    assert (state["gang_generation"], state["failed_generation"]) == (1, 0)
    assert state["restarts"] == 1 and state["restarts_without_progress"] == 1
    assert member.finish() == 0
