"""A warm standby: the next trainer's interpreter, started ahead of a restart with torch imported.

Most of an in-place restart of a Python trainer is the new interpreter's start-up: importing
torch alone takes about 3 s on a 2-core machine. The supervisor keeps one standby ready while
the trainer runs: `python -m trainguard_harness.standby`, started with the command's
environment and working directory, imports the heavy modules (`PRELOAD`) and then blocks on
its standard input. At a restart the supervisor sends it the command's arguments
(`Standby.take`) and it runs the training script as `python <script> args` or
`python -m <module> args` would (`runpy`, as `__main__`, with `sys.argv` set), so the death ->
next step time loses the import.

Only a command of the supervisor's own interpreter running a script or a module with no
interpreter options qualifies (`order_for`); anything else is started afresh, as before. A
standby holds no GPU memory (importing torch creates no CUDA context) and is never the
supervisor's child as far as the agent knows until it is taken; it is killed with its session
when supervision ends. A standby whose start failed, or that died, is replaced by a plain start.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# The modules a standby imports before it waits: what every PyTorch trainer imports first, and
# the harness's API (a script that does not use it pays a fifth of a second of the standby's
# time, not of its own). `torch._dynamo` is imported lazily by the first optimizer a trainer
# builds (`torch.optim.Optimizer.__init__` is wrapped by `torch._compile`): 2.7 of the 3.2 s
# from a standby's order to a resumed reference trainer's first step, without it here.
PRELOAD = ("torch", "torch._dynamo", "trainguard_harness.session")
# Where the order goes: one JSON line on the standby's standard input.
ORDER_ENCODING = "utf-8"


@dataclass(frozen=True)
class Order:
    """What a standby runs: a script's path or a module's name, and `sys.argv`."""

    argv: tuple[str, ...]
    module: str | None = None
    script: str | None = None

    def line(self) -> bytes:
        """The order as the standby reads it."""
        data = {"argv": list(self.argv), "module": self.module, "script": self.script}
        return (json.dumps(data) + "\n").encode(ORDER_ENCODING)


def _same_interpreter(program: str) -> bool:
    """Whether `program` is the interpreter this process runs (the standby's)."""
    if os.sep not in program:
        found = [Path(d, program) for d in os.environ.get("PATH", "").split(os.pathsep) if d]
        candidates = [p for p in found if p.is_file() and os.access(p, os.X_OK)]
        if not candidates:
            return False
        program = str(candidates[0])
    with contextlib.suppress(OSError):
        return os.path.samefile(program, sys.executable)
    return False


def order_for(command: list[str]) -> Order | None:
    """The standby order that runs `command`, or None when a standby cannot run it."""
    if len(command) < 2 or not _same_interpreter(command[0]):
        return None
    if command[1] == "-m" and len(command) >= 3:
        # `python -m pkg args`: sys.argv[0] becomes the module's file, as runpy sets it.
        return Order(argv=(command[2], *command[3:]), module=command[2])
    if command[1].startswith("-"):
        return None  # interpreter options (-u, -X ..., -c) change how it starts: start afresh
    return Order(argv=tuple(command[1:]), script=command[1])


class Standby:
    """One standby process, started now, taken at most once (see the module docstring).

    `serial` numbers the standbys of one supervisor and is on the standby's command line: the
    agent counts processes with the trainer's command line as duplicate trainers
    (`agent.signals.count_like`), and a trainer a standby became must not share its command
    line with the next standby, waiting beside it.
    """

    def __init__(self, serial: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainguard_harness.standby", str(serial)],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        """The standby's PID (the trainer's, once taken)."""
        return self.process.pid

    def alive(self) -> bool:
        """Whether it still waits (it may have died while importing)."""
        return self.process.poll() is None

    def take(self, order: Order) -> subprocess.Popen[bytes] | None:
        """Give it the command: it becomes the trainer. None if it died meanwhile."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(order.line())
            self.process.stdin.close()
        except (BrokenPipeError, OSError):
            self.discard()
            return None
        return self.process

    def discard(self) -> None:
        """End it and its session (supervision ended, or it is not wanted)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def main() -> int:
    """The standby program: import, wait for the order, run it as `__main__`."""
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    line = sys.stdin.buffer.readline()
    if not line:
        return 0  # discarded before it was needed
    data = json.loads(line.decode(ORDER_ENCODING))
    # The trainer must not keep the supervisor's pipe as its standard input.
    with open(os.devnull, "rb") as null:
        os.dup2(null.fileno(), 0)
    sys.argv = list(data["argv"])
    if data.get("module"):
        runpy.run_module(data["module"], run_name="__main__", alter_sys=True)
    else:
        script = data["script"]
        # As `python script.py` starts: the script's directory first on the path, not ours.
        sys.path[0] = str(Path(script).resolve().parent)
        runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
