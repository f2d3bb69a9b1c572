"""Start several ranks in one pod through PyTorch's elastic launcher, and say which one failed.

    python -m trainguard_harness.launcher --nproc-per-node 2 --result launch.json -- cmd ...

The supervisor runs this instead of the command when a pod has more than one rank
(`PodEnv.procs_per_node`) or is a member of a gang (`PodEnv.nnodes`). It is
`torch.distributed.run` (torchrun) itself, called with:

- a one-pod run, `--standalone --nnodes 1`: the rendezvous is a TCPStore in this process,
  bound to port 0, so the kernel picks a free port at bind time for every launch. Nothing
  picks a port first and binds it later (a race with any other process), and a launch never
  meets the store of an earlier launch on a port it reused: the earlier launcher may still be
  shutting down when the supervisor restarts the ranks. The ranks reach the store through the
  standard MASTER_ADDR and MASTER_PORT, with a rendezvous id of their own per launch.
- a member of a gang of `nnodes` pods (`Gang`), `--nnodes N --node-rank K --master-addr A
  --master-port P`: torchrun's static rendezvous, hosted by member 0's launcher at its stable
  name (the gang's headless Service) on the contract's port, so every member's ranks form one
  world of N x nproc ranks, global ranks numbered member by member. When any rank of the gang
  dies, the other members' ranks fail at their next collective (the peer is gone), so every
  member's launcher ends and every member's supervisor restarts its ranks; the restarted
  launchers meet again at member 0's new rendezvous (a member that comes back first waits for
  it there).
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
from dataclasses import dataclass
from pathlib import Path

from trainguard.contract import env
from trainguard.contract.env import ContractError, PodEnv
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


@dataclass(frozen=True)
class Gang:
    """A pod's place in a gang of member pods (`PodEnv` nnodes, node_rank, master_*)."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def of(cls, pod: PodEnv) -> Gang | None:
        """The pod's gang; None for a one-pod run."""
        if pod.nnodes == 1:
            return None
        if not pod.master_addr:
            raise ContractError(
                f"{env.MASTER_ADDR}: a member of {pod.nnodes} needs member 0's name"
            )
        if pod.node_rank >= pod.nnodes:
            raise ContractError(
                f"{env.NODE_RANK}={pod.node_rank}: a gang of {pod.nnodes} has members 0 to"
                f" {pod.nnodes - 1}"
            )
        return cls(pod.nnodes, pod.node_rank, pod.master_addr, pod.master_port)

    def args(self) -> list[str]:
        """Torchrun's options for this member."""
        return [
            "--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
            "--master-addr", self.master_addr, "--master-port", str(self.master_port),
        ]  # fmt: skip


def through_torchrun(procs: int, gang: Gang | None) -> bool:
    """Whether the command runs under torchrun: several ranks here, or a member of a gang."""
    return procs > 1 or gang is not None


def launch_command(
    command: list[str], procs: int, result_file: Path, gang: Gang | None = None
) -> list[str]:
    """The command line that starts `procs` ranks of `command` (the command itself for one)."""
    if not through_torchrun(procs, gang):
        return list(command)
    return [
        sys.executable, "-m", "trainguard_harness.launcher",
        "--nproc-per-node", str(procs), "--result", str(result_file),
        *(gang.args() if gang is not None else []), "--", *command,
    ]  # fmt: skip


def torchrun_args(command: list[str], procs: int, gang: Gang | None = None) -> list[str]:
    """Torchrun's arguments for one pod of `procs` ranks (see the module docstring)."""
    where = ["--standalone", "--nnodes", "1"] if gang is None else gang.args()
    return [
        *where, "--nproc-per-node", str(procs), "--max-restarts", "0", "--no-python", *command,
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
    gang = parser.add_argument_group("a member of a gang (all four, or none: one pod)")
    gang.add_argument("--nnodes", type=int)
    gang.add_argument("--node-rank", type=int)
    gang.add_argument("--master-addr")
    gang.add_argument("--master-port", type=int)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.nproc_per_node < 1:
        parser.error("a command after -- and --nproc-per-node >= 1")
    member = (args.nnodes, args.node_rank, args.master_addr, args.master_port)
    if any(value is not None for value in member) and None in member:
        parser.error("a gang member needs --nnodes, --node-rank, --master-addr and --master-port")
    where = None if args.nnodes is None else Gang(*member)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    options = get_args_parser().parse_args(torchrun_args(command, args.nproc_per_node, where))
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
