"""Child processes of the tests, benchmarks and demo: the operator, and how any child is stopped.

`OperatorProcess` runs `trainguard operator` from this installation as a local process
watching some namespaces, its output appended to a log file with a header per start, so a
test can restart it, kill it as a node or OOM kill would, and wait for a line it logs.
`stop_process` is the one way a child is stopped: a signal (SIGTERM unless told), then
SIGKILL if it has not exited in time.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainguard_dev.testing.polling import eventually

STOP_SECONDS = 10.0
# kopf logs this once it has configured itself: the operator is up and watching.
STARTED_MARKER = "Activity 'configure' succeeded"


def stop_process(
    proc: subprocess.Popen[Any] | None, grace: float = STOP_SECONDS, sig: int = signal.SIGTERM
) -> None:
    """Send `sig`, then SIGKILL if the process has not exited after `grace` s; reap it.

    Nothing happens to a process that has already exited (or to None).
    """
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)


class OperatorProcess:
    """`trainguard operator --namespace <ns>...` as a local process, restartable.

    `resync_seconds` and `agent_image` are passed when given (the operator's defaults
    otherwise); `extra_args` follow them, and `env`, when given, is the whole environment.
    """

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: Sequence[str],
        log_path: Path,
        *,
        resync_seconds: float | None = None,
        agent_image: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespaces = list(namespaces)
        self.log_path = log_path
        self.resync_seconds = resync_seconds
        self.agent_image = agent_image
        self.extra_args = list(extra_args)
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def argv(self) -> list[str]:
        """The operator's command line."""
        argv = [sys.executable, "-m", "trainguard.cli.main", "operator"]
        argv += ["--kubeconfig", str(self.kubeconfig)]
        for namespace in self.namespaces:
            argv += ["--namespace", namespace]
        if self.resync_seconds is not None:
            argv += ["--resync-seconds", f"{self.resync_seconds:g}"]
        if self.agent_image is not None:
            argv += ["--agent-image", self.agent_image]
        return argv + self.extra_args

    def start(self) -> None:
        """Start the operator (appending to the same log across restarts)."""
        assert not self.alive(), "already running"
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n{self._header()}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, env=self.env
            )

    @property
    def pid(self) -> int:
        """The running operator's PID."""
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the operator process is running."""
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the operator dies wherever it is, as in a node or OOM kill."""
        stop_process(self.proc, sig=signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time (nothing when not running)."""
        stop_process(self.proc)

    def log(self) -> str:
        """Everything the operator printed so far, across its starts."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for(self, marker: str, timeout: float = 30.0) -> None:
        """Wait until the operator, since its latest start, logged a line containing `marker`.

        RuntimeError at once if the operator exits first.
        """

        def logged() -> bool:
            if marker in self.log().rpartition(self._header())[2]:
                return True
            if not self.alive():
                raise RuntimeError(
                    f"the operator exited before logging {marker!r}; see {self.log_path}"
                )
            return False

        eventually(logged, timeout, f"{marker!r} after operator start {self.starts}")

    def wait_started(self, timeout: float = 60.0) -> None:
        """Wait until the operator, since its latest start, is up and watching."""
        self.wait_for(STARTED_MARKER, timeout)

    def _header(self) -> str:
        return f"===== start {self.starts} ====="
