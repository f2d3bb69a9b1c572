"""`trainguard supervise`: own session, restart in place, give up, forward signals, clean up."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainguard_dev.testing.polling import eventually

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def supervise(tmp_path: Path, script: str, *options: str) -> tuple[subprocess.Popen[str], Path]:
    """Start `trainguard supervise [options] -- python -c script tmp_path` in the background."""
    state_file = tmp_path / "state" / "supervisor.json"
    command = [
        sys.executable, "-m", "trainguard.cli.main", "supervise", "--state-file", str(state_file),
        "--backoff", "0.05", *options, "--", sys.executable, "-c", script, str(tmp_path),
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True), state_file


def read_state(state_file: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(state_file.read_text())
    return state


def wait_for(path: Path, timeout: float = 20) -> str:
    """The file's text once it is written completely (a whole last line)."""

    def written() -> str | None:
        text = path.read_text() if path.exists() else ""
        return text if text.endswith("\n") else None

    return eventually(written, timeout, f"{path} to appear", 0.02)


DIES_ONCE_BY_SIGKILL = """
import os, signal, sys
marker = os.path.join(sys.argv[1], "attempts")
attempts = int(open(marker).read()) + 1 if os.path.exists(marker) else 1
open(marker, "w").write(str(attempts))
if attempts == 1:
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_restarts_after_sigkill_and_exits_0_when_the_child_completes(tmp_path: Path) -> None:
    process, state_file = supervise(tmp_path, DIES_ONCE_BY_SIGKILL, "--max-restarts", "2")
    assert process.wait(timeout=30) == 0
    state = read_state(state_file)
    assert state["state"] == "completed" and state["restarts"] == 1 and state["attempt"] == 2
    first, second = state["history"]
    assert first["signal"] == "SIGKILL" and first["exit_code"] is None
    assert first["reason"] == "killed by SIGKILL"
    assert second["exit_code"] == 0 and second["pid"] != first["pid"]
    assert state["pid"] == process.pid and state["child_pid"] is None


def test_gives_up_after_the_limit_with_backoff_and_a_non_zero_exit(tmp_path: Path) -> None:
    process, state_file = supervise(
        tmp_path, "raise SystemExit(3)", "--max-restarts", "2", "--backoff", "0.2"
    )
    assert process.wait(timeout=30) == 3
    state = read_state(state_file)
    assert state["state"] == "gave-up" and state["restarts"] == 2
    history = state["history"]
    assert [entry["reason"] for entry in history] == ["exited with 3"] * 3
    gaps = [b["started_at"] - a["ended_at"] for a, b in itertools.pairwise(history)]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4  # the backoff doubles


RECORDS_SESSION_THEN_WAITS = """
import json, os, signal, sys, time
def on_term(signum, frame):
    open(os.path.join(sys.argv[1], "terminated"), "w").write("yes\\n")
    sys.exit(7)
signal.signal(signal.SIGTERM, on_term)
ids = {"pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0)}
open(os.path.join(sys.argv[1], "ids"), "w").write(json.dumps(ids) + "\\n")
time.sleep(60)
"""


def test_child_runs_in_its_own_session_and_sigterm_is_forwarded(tmp_path: Path) -> None:
    process, state_file = supervise(tmp_path, RECORDS_SESSION_THEN_WAITS)
    ids = json.loads(wait_for(tmp_path / "ids"))
    # Detached: a new session and process group led by the child, not the supervisor's.
    assert ids["sid"] == ids["pid"] == ids["pgid"]
    assert ids["sid"] != os.getsid(process.pid)
    assert read_state(state_file)["child_pid"] == ids["pid"]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 7  # the child's own status, and no restart
    assert wait_for(tmp_path / "terminated") == "yes\n"
    state = read_state(state_file)
    assert state["state"] == "terminated" and state["restarts"] == 0


IGNORES_SIGTERM = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(sys.argv[1], "ready"), "w").write("ready\\n")
time.sleep(60)
"""


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    process, state_file = supervise(tmp_path, IGNORES_SIGTERM, "--grace-period", "0.5")
    wait_for(tmp_path / "ready")
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 128 + signal.SIGKILL
    assert time.monotonic() - started >= 0.5
    assert read_state(state_file)["history"][-1]["signal"] == "SIGKILL"


LEAVES_A_WORKER_BEHIND = """
import os, subprocess, sys
worker = subprocess.Popen(["sleep", "60"])
open(os.path.join(sys.argv[1], "worker"), "w").write(f"{worker.pid}\\n")
os._exit(1)
"""


def test_leftover_processes_of_a_dead_child_are_killed(tmp_path: Path) -> None:
    process, state_file = supervise(tmp_path, LEAVES_A_WORKER_BEHIND, "--max-restarts", "0")
    assert process.wait(timeout=30) == 1
    worker = int(wait_for(tmp_path / "worker"))

    def worker_dead() -> bool:
        try:
            status = Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True  # gone
        return status == "Z"  # dead, waiting for its parent (init) to reap it

    eventually(worker_dead, 10, "the worker to die with its training process", 0.05)
    assert read_state(state_file)["history"][0]["leftover_processes"] == 1


def test_a_command_is_required() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.cli.main", "supervise", "--max-restarts", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "no command given" in result.stderr


def test_default_state_file_is_next_to_the_heartbeat(tmp_path: Path) -> None:
    environ = dict(os.environ, TRAINGUARD_HEARTBEAT_FILE=str(tmp_path / "hb" / "heartbeat.json"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainguard.cli.main",
            "supervise",
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        env=environ,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0
    assert read_state(tmp_path / "hb" / "supervisor.json")["state"] == "completed"


def test_supervisor_and_heartbeat_never_import_torch() -> None:
    check = (
        "import sys, trainguard.cli.main, trainguard_harness.supervisor;"
        "import trainguard_harness.heartbeat;"
        "from trainguard_harness import HarnessSettings;"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=30)


def test_the_library_surface_is_importable_from_the_package() -> None:
    import trainguard_harness
    from trainguard_harness.session import TrainingSession

    assert trainguard_harness.TrainingSession is TrainingSession
    with pytest.raises(AttributeError):
        _ = trainguard_harness.NoSuchThing  # type: ignore[attr-defined]


def test_private_l0s_of_supervisors_that_are_gone_are_removed(tmp_path: Path) -> None:
    from trainguard_harness.supervisor import L0_PREFIX, remove_orphaned_l0

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dirs = {
            "gone": tmp_path / f"{L0_PREFIX}{ended.pid}-a1",
            "alive": tmp_path / f"{L0_PREFIX}{alive.pid}-b2",
            "own": tmp_path / f"{L0_PREFIX}{os.getpid()}-c3",
            "unnamed": tmp_path / f"{L0_PREFIX}x7y8z9",  # made before names carried a pid
        }
        for path in dirs.values():
            path.mkdir()
            (path / "step-00000001").mkdir()
        assert remove_orphaned_l0(tmp_path) == [dirs["gone"]]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            dirs[k].name for k in ("alive", "own", "unnamed")
        )
    finally:
        alive.kill()
        alive.wait()
