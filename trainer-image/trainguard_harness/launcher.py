"""Start several ranks in one pod through PyTorch's elastic launcher, and say which one failed.

    python -m trainguard_harness.launcher --nproc-per-node 2 --result launch.json -- cmd ...

The supervisor runs this instead of the command when a pod has more than one rank
(`PodEnv.procs_per_node`). It is `torch.distributed.run` (torchrun) itself, called with:

- `--standalone --nnodes 1`: the rendezvous is a TCPStore in this process, bound to port 0, so
  the kernel picks a free port at bind time for every launch. Nothing picks a port first and
  binds it later (a race with any other process), and a launch never meets the store of an
  earlier launch on a port it reused: the earlier launcher may still be shutting down when the
  supervisor restarts the ranks. The ranks reach the store through the standard MASTER_ADDR and
  MASTER_PORT, with a rendezvous id of their own per launch.
- `--max-restarts 0`: the launcher never restarts a rank itself. Any rank that dies ends every
  rank (the launcher stops the others) and then the launcher; the supervisor restarts all of
  them together under the run's back-off and restart cap, as it restarts a single process.
- `--no-python`: the command is run as given (any program, not only a Python script).

When a rank fails, torchrun's `ChildFailedError` names the first failure (global rank, local
rank, PID, exit code or signal); the launcher writes it to `--result` (`launch.json` in the
state directory) before it exits, so the supervisor can record it without parsing logs. A
rank that was killed (SIGKILL) leaves no error file of its own; this record is made by the
launcher, which saw it end.

The ranks are started by torchrun in sessions of their own (`start_new_session`), so a signal
to the launcher's process group does not reach them: the supervisor learns their PIDs
(`rank_pids`, children of the launcher with LOCAL_RANK in their environment) and ends each
rank's group itself after the launcher exits. This module imports torch only in `main`.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from trainguard.contract.files import (
    SUPERVISOR_RANK_FAILURE,
    RankFailure,
    read_json,
    write_json,
)

# torchrun's environment of each rank (the standard names every training script reads).
LOCAL_RANK_ENV = "LOCAL_RANK"
EXIT_RANK_FAILED = 1
EXIT_USAGE = 2


def launch_command(command: list[str], procs: int, result_file: Path) -> list[str]:
    """The command line that starts `procs` ranks of `command` (the command itself for one)."""
    if procs == 1:
        return list(command)
    return [
        sys.executable, "-m", "trainguard_harness.launcher",
        "--nproc-per-node", str(procs), "--result", str(result_file), "--", *command,
    ]  # fmt: skip


def torchrun_args(command: list[str], procs: int) -> list[str]:
    """Torchrun's arguments for one pod of `procs` ranks (see the module docstring)."""
    return [
        "--standalone", "--nnodes", "1", "--nproc-per-node", str(procs),
        "--max-restarts", "0", "--no-python", *command,
    ]  # fmt: skip


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The fields after the parenthesised command name: state, ppid, pgrp, ...
    return stat.rsplit(")", 1)[1].split()


def _local_rank(pid: int, proc: Path) -> int | None:
    try:
        environ = (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{LOCAL_RANK_ENV}=".encode()
    for entry in environ:
        if entry.startswith(prefix):
            value = entry[len(prefix) :]
            return int(value) if value.isdigit() else None
    return None


def children(parent: int, proc: Path = Path("/proc")) -> list[int]:
    """The PIDs of the live processes whose parent is `parent`."""
    found = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name), proc)
            if fields is not None and fields[0] != "Z" and int(fields[1]) == parent:
                found.append(int(entry.name))
    return found


def find_ranks(launcher: int, proc: Path = Path("/proc")) -> dict[int, int]:
    """The ranks a launcher runs now: local rank -> PID (its children that have a LOCAL_RANK)."""
    ranks: dict[int, int] = {}
    for pid in children(launcher, proc):
        rank = _local_rank(pid, proc)
        if rank is not None:
            ranks[rank] = pid
    return ranks


def ended(pid: int, proc: Path = Path("/proc")) -> tuple[bool, int | None]:
    """(whether process `pid` has ended, its wait status where a zombie still shows it)."""
    fields = _stat_fields(pid, proc)
    if fields is None:
        return True, None
    if fields[0] != "Z":
        return False, None
    # Field 52 of stat (exit_code, Linux 3.5+) is the wait status, readable until reaped.
    status = fields[49] if len(fields) > 49 else None
    return True, int(status) if status is not None and status.isdigit() else None


def failure_of(rank: int, pid: int | None, wait_status: int | None) -> RankFailure:
    """A rank failure from a wait status (None: only the absence is known)."""
    if wait_status is None:
        return RankFailure(rank, pid)
    if wait_status & 0x7F:
        return RankFailure(rank, pid, signal=signal.Signals(wait_status & 0x7F).name)
    return RankFailure(rank, pid, exit_code=(wait_status >> 8) & 0xFF)


def read_result(path: Path) -> RankFailure | None:
    """The first rank failure a launcher recorded, or None."""
    data = read_json(path)
    return None if data is None else RankFailure.from_dict(data.get(SUPERVISOR_RANK_FAILURE))


def _exit_failure(rank: int, local_rank: int, pid: int, exitcode: int) -> RankFailure:
    del rank  # the global rank equals the local one in a pod of its own
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            return RankFailure(local_rank, pid, signal=signal.Signals(-exitcode).name)
    return RankFailure(local_rank, pid, exit_code=exitcode)


def main(argv: list[str] | None = None) -> int:
    """Run torchrun on the command; record the first failed rank; exit non-zero if one failed."""
    parser = argparse.ArgumentParser(
        prog="python -m trainguard_harness.launcher", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--result", type=Path, required=True, help="where to record a failure")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.nproc_per_node < 1:
        parser.error("a command after -- and --nproc-per-node >= 1")
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    options = get_args_parser().parse_args(torchrun_args(command, args.nproc_per_node))
    try:
        run(options)  # type: ignore[no-untyped-call]
    except SignalException as stopped:  # SIGTERM forwarded by the supervisor: ranks stopped
        return 128 + int(stopped.sigval)
    except ChildFailedError as error:
        rank, first = error.get_first_failure()
        failure = _exit_failure(rank, first.local_rank, first.pid, first.exitcode)
        write_json(args.result, {SUPERVISOR_RANK_FAILURE: failure.to_dict()})
        print(
            f"trainguard launcher: rank {failure.rank} (pid {failure.pid}) {failure.how()}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_RANK_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
