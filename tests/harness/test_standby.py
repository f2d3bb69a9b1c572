"""The warm standby: a restarted Python trainer starts in an interpreter with torch imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainguard_harness.standby import Order, order_for

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

# Records how it was started, then: the first attempt waits for the standby of its restart to
# be there and dies (exit 1); the second exits 0.
RECORDING_TRAINER = """
import json, os, sys
preloaded = "torch" in sys.modules
out = sys.argv[1]
attempt = len([n for n in os.listdir(out) if n.startswith("attempt-")]) + 1
record = {
    "pid": os.getpid(), "argv": sys.argv, "name": __name__, "preloaded": preloaded,
    "path0": sys.path[0], "stdin": os.readlink("/proc/self/fd/0"),
    "marker": os.environ.get("MARKER"),
}
if attempt == 1:
    import time
    def standby():
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
                except OSError:
                    continue
                if b"trainguard_harness.standby" in cmdline and int(entry) != os.getpid():
                    return int(entry)
    deadline = time.monotonic() + 60
    while (found := standby()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    record["standby"] = found
with open(os.path.join(out, f"attempt-{attempt}.json"), "w") as handle:
    json.dump(record, handle)
sys.exit(1 if attempt == 1 else 0)
"""


Records = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]


def _supervise(tmp_path: Path, *options: str, trainer: str = RECORDING_TRAINER) -> Records:
    """Run the trainer under `trainguard supervise`; its two attempts' records and the state."""
    script = tmp_path / "scripts" / "trainer.py"
    script.parent.mkdir()
    script.write_text(trainer)
    out = tmp_path / "out"
    out.mkdir()
    state_file = tmp_path / "state" / "supervisor.json"
    command = [
        sys.executable, "-m", "trainguard.cli.main", "supervise", "--state-file", str(state_file),
        "--backoff", "0.1", "--no-gpu", *options, "--", sys.executable, str(script), str(out),
    ]  # fmt: skip
    environ = {**os.environ, "MARKER": "from-the-pod"}
    process = subprocess.Popen(command, env=environ, stdin=subprocess.DEVNULL)
    assert process.wait(timeout=100) == 0
    first, second = (json.loads((out / f"attempt-{n}.json").read_text()) for n in (1, 2))
    return first, second, json.loads(state_file.read_text())


def test_a_restarted_script_runs_in_the_standby_started_before_the_death(tmp_path: Path) -> None:
    first, second, state = _supervise(tmp_path, "--standby-delay", "0.2")
    assert not first["preloaded"]  # the first start is a plain one
    assert first["standby"] is not None, "no standby was started while the trainer ran"
    assert second["pid"] == first["standby"]  # the restart took the waiting interpreter
    assert second["preloaded"]  # torch was imported before the script began
    script = str(tmp_path / "scripts" / "trainer.py")
    # As `python trainer.py <out>` would run it: argv, __main__, the script's directory first,
    # the pod's environment, and no pipe from the supervisor on its standard input.
    assert second["argv"] == first["argv"] == [script, str(tmp_path / "out")]
    assert second["name"] == "__main__"
    assert second["path0"] == first["path0"] == str(tmp_path / "scripts")
    assert second["marker"] == "from-the-pod" and second["stdin"] == os.devnull
    assert state["state"] == "completed" and state["restarts"] == 1
    assert [h["pid"] for h in state["history"]] == [first["pid"], second["pid"]]
    assert [h["exit_code"] for h in state["history"]] == [1, 0]


def test_without_the_standby_every_start_is_a_plain_one(tmp_path: Path) -> None:
    # The first attempt does not wait for a standby: none comes.
    trainer = RECORDING_TRAINER.replace("time.monotonic() + 60", "0")
    first, second, _ = _supervise(tmp_path, "--no-standby", "--standby-delay", "0", trainer=trainer)
    assert first["standby"] is None
    assert not second["preloaded"]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            [sys.executable, "train.py", "--lr", "3"],
            Order(("train.py", "--lr", "3"), script="train.py"),
        ),
        ([sys.executable, "-m", "pkg.train", "x"], Order(("pkg.train", "x"), module="pkg.train")),
        ([sys.executable, "-u", "train.py"], None),
        ([sys.executable, "-c", "print(1)"], None),
        ([sys.executable], None),
        (["/bin/sh", "train.sh"], None),
        (["/nonexistent/python", "train.py"], None),
    ],
)
def test_which_commands_a_standby_runs(command: list[str], expected: Order | None) -> None:
    assert order_for(command) == expected
