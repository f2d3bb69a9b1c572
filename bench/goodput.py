"""Goodput benchmark: a run of fixed length under a fixed failure schedule, trainguard vs the seed.

The run is the reference trainer (tiny preset, one thread) for a fixed number of steps, each
lasting `--step-seconds` (its `--min-step-seconds`), checkpointing to local disk every
`--every-steps` steps (50: the seed's cadence, and trainguard's default). Counted from the
first step, a failure is due every `--failure-every` seconds of wall time, `--failures` in all,
cycling through four kinds:

- `death`: the training process is SIGKILLed (a silent death, step 322);
- `hang`: the training process is SIGSTOPped (alive, frozen: a stuck read, a deadlock);
- `ghost`: the node's GPU keeps memory no live process holds, left by a death: the trainer is
  SIGKILLed and the node's simulated GPU reports `GHOST_MIB` held by nobody (the seed's ghost);
- `node-loss`: the run's node vanishes: heartbeats stop and every process of the run's pod
  is SIGKILLed at once (also those in sessions of their own, as on a machine that is gone).

A failure is caused at its due time, or, when the side has not yet trained past the step the
previous failure interrupted, as soon as it has (one failure at a time; the delay is in the
raw figures). Both sides run the same schedule, one after the other:

trainguard: a local control plane of its own (or `--cluster NAME`) with process-backed nodes,
so the run's pod is real local processes (agent sidecar, supervisor, trainer); the CRD, the
operator as a local process (`trainguard operator`), and one TrainingRun with a remote layer
(a volume every node reaches) so a run that moves restores there. One process-backed node more
than the schedule has ghosts and node losses: each of those excludes the node it happened on
from the run, so the run always has a fresh node to move to. The spec's choices are in
`trainguard_spec()` and in the JSON.

baseline: the seed's practice as plain processes on this machine: the same trainer command,
writing a disk checkpoint every 50 steps, and a log-age watchdog polling every
`--watchdog-poll` s that, once the trainer's output file has not changed for
`--watchdog-threshold` s (the seed's 20 minutes by default), SIGKILLs the trainer and relaunches
it at once; the relaunched trainer resumes from the newest disk checkpoint that verifies. A
trainer that exits by itself is not noticed sooner: the watchdog knows only log age. After a
launch the watchdog waits for the new trainer's first write before it judges again (in the
baseline's favour: a threshold shorter than the trainer's start-up never kills it in a loop).
Where the baseline cannot meet a failure as trainguard does, it is modelled in its favour:
- `ghost`: the trainer is SIGKILLed as in trainguard's case, and the baseline relaunches on
  the same machine at full speed: in the seed the relaunched run was slow until the VM was
  restarted; here the ghost costs the baseline nothing beyond the death;
- `node-loss`: the trainer is SIGKILLed, and the relaunch after the watchdog fires is
  immediate, on the same disk with its checkpoints: no new machine to find, no data to stage,
  no checkpoint lost with the node's disk.

Measured per side (from the steps the trainers log, `--loss-log`, each line stamped when this
benchmark first sees it): wall time from the first step to the final one, useful time (final
step x step time), goodput = useful / wall, steps recomputed (steps executed - final step), and
per failure the time lost: from the failure to the first step past the furthest one reached
before training restarted, less one step time (`trainguard_dev.testing.goodput` holds the
arithmetic).

Prints ONE JSON object on stdout (goodput of each side, the ratio of median time lost per
failure baseline / trainguard, per-kind medians, the raw failures); progress goes to stderr.
Targets: goodput >= 0.95 with a failure every 5 minutes, and >= 10x less time lost
per failure than the baseline.

    python bench/goodput.py                                   # 300 s apart, the seed's 1200 s
    python bench/goodput.py --failure-every 60 --failures 4 --watchdog-threshold 30
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import yaml

from trainguard.api.constants import LABEL_RUN
from trainguard.api.spec import DEFAULT_EVERY_STEPS
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.procnode import DOWN_FILENAME, GPU_SIM_FILENAME, pod_processes
from trainguard_dev.demo.env import create_claim, ensure_namespace, install_crd
from trainguard_dev.testing import pods
from trainguard_dev.testing.goodput import (
    Failure,
    StepRecord,
    loss_ratio,
    side_figures,
)
from trainguard_dev.testing.polling import eventually, seconds_left
from trainguard_dev.testing.processes import OperatorProcess, stop_process
from trainguard_dev.testing.runs import make_shards, reference_command, reference_run

KINDS = ("death", "hang", "ghost", "node-loss")
# Failures after which the run must leave its node: each excludes that node from the run.
MOVING_KINDS = ("ghost", "node-loss")
RUN = "goodput"
# The seed's log-age watchdog fired after 20 minutes without a log update (step 322).
SEED_WATCHDOG_S = 1200.0
GHOST_MIB = 8192  # far above the ghost threshold (2 GiB), as in the demo
SETTLE_S = 1.0  # after a failure, the old trainer's last steps are in (no restart is faster)
POLL_S = 0.05  # the step log and the readiness checks
BACKUP_CLAIM = "goodput-backup"
READY_TIMEOUT_S = 600.0


def log(message: str) -> None:
    """Progress, on stderr (stdout carries only the JSON report)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failure-every", type=float, default=300.0, help="seconds apart")
    parser.add_argument("--failures", type=int, default=4, help="failures in the schedule")
    parser.add_argument(
        "--steps", type=int, help="run length (default: one interval past the last failure)"
    )
    parser.add_argument("--step-seconds", type=float, default=0.1, help="each step's time")
    parser.add_argument(
        "--every-steps", type=int, default=DEFAULT_EVERY_STEPS, help="disk checkpoint cadence"
    )
    parser.add_argument(
        "--watchdog-threshold",
        type=float,
        default=SEED_WATCHDOG_S,
        help="the baseline watchdog's log age (s); the seed's is 1200",
    )
    parser.add_argument("--watchdog-poll", type=float, default=1.0, help="its poll (s)")
    parser.add_argument(
        "--hang-after", type=int, default=30, help="trainguard's monitor.hangAfterSeconds"
    )
    parser.add_argument(
        "--hang-after-step-times",
        type=float,
        default=10.0,
        help="trainguard's monitor.hangAfterStepTimes (0: unset, hangAfterSeconds alone)",
    )
    parser.add_argument("--only", choices=("trainguard", "baseline"), help="run one side")
    parser.add_argument("--cluster", help="use this running dev cluster instead of a new one")
    parser.add_argument("--timeout", type=float, default=7200.0, help="give up after (seconds)")
    args = parser.parse_args(argv)
    if min(args.failure_every, args.step_seconds, args.watchdog_poll) <= 0 or args.failures < 0:
        parser.error("--failure-every, --step-seconds, --watchdog-poll > 0; --failures >= 0")
    if args.steps is None:
        args.steps = math.ceil((args.failures + 1) * args.failure_every / args.step_seconds)
    return args


def schedule(failures: int) -> list[str]:
    """The failure kinds in order: the four kinds, cycled."""
    return [KINDS[i % len(KINDS)] for i in range(failures)]


class StepLog:
    """The trainers' `--loss-log` (a JSON line per step executed), followed as it grows.

    Every line is stamped with the monotonic time it is first read (every `POLL_S`), so the
    times are late by at most a poll, alike for both sides.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[StepRecord] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        offset, partial = 0, ""
        while not self._stop.is_set():
            try:
                with self.path.open() as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                    offset = handle.tell()
            except FileNotFoundError:
                chunk = ""
            if chunk:
                now = time.monotonic()
                *lines, partial = (partial + chunk).split("\n")
                with self.lock:
                    self.records += [
                        StepRecord(int(json.loads(line)["step"]), now) for line in lines if line
                    ]
            self._stop.wait(POLL_S)

    def snapshot(self) -> list[StepRecord]:
        """The steps seen so far."""
        with self.lock:
            return list(self.records)

    def highest(self) -> int:
        """The highest step seen so far (0 before the first)."""
        with self.lock:
            return max((r.step for r in self.records), default=0)

    def stop(self) -> None:
        """Stop following (one last read first)."""
        time.sleep(2 * POLL_S)
        self._stop.set()
        self.thread.join()


class Side(Protocol):
    """One side of the comparison: started, failed on schedule, stopped."""

    name: str
    steps: StepLog

    def start(self) -> None:
        """Start training."""

    def ready(self) -> bool:
        """Whether a failure can be caused now (a live trainer to cause it to)."""

    def inject(self, kind: str) -> str:
        """Cause a failure of `kind`; return what was done, for the progress line."""

    def stop(self) -> None:
        """Stop everything the side started."""

    def extras(self) -> dict[str, Any]:
        """Figures of the side beyond the common ones."""


class Baseline:
    """The seed's practice: the trainer as a plain process, a log-age watchdog, a relaunch."""

    name = "baseline"

    def __init__(self, work: Path, shards: Path, args: argparse.Namespace) -> None:
        self.dir = work / self.name
        self.dir.mkdir(parents=True)
        self.args = args
        self.output = self.dir / "trainer.log"
        self.steps = StepLog(self.dir / "steps.jsonl")
        command = reference_command(args.steps, args.step_seconds)
        self.argv = [sys.executable, *command[1:]]
        self.argv += ["--data-dir", str(shards), "--l1-dir", str(self.dir / "l1"),
                      "--state-dir", str(self.dir / "state"),
                      "--ckpt-every-steps", str(args.every_steps), "--ckpt-every-seconds", "0",
                      "--loss-log", str(self.steps.path)]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.launched = 0.0  # wall time of the newest launch: the watchdog waits for a write
        self.lock = threading.Lock()
        self.alarms: list[float] = []
        self.launches = 0
        self._stop = threading.Event()
        self.watchdog = threading.Thread(target=self._watch, daemon=True)

    def _launch(self) -> None:
        with self.output.open("ab") as out:
            # Detached from this process's session, as the seed learned to launch it.
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.launched = time.time()
        self.launches += 1

    def start(self) -> None:
        """Launch the trainer and start the watchdog."""
        self._launch()
        self.watchdog.start()

    def _log_age(self) -> float | None:
        """The log's age, or None until the newest trainer has written to it (not armed)."""
        try:
            written = self.output.stat().st_mtime
        except OSError:
            return None
        return None if written < self.launched else time.time() - written

    def _watch(self) -> None:
        # The seed's watchdog: log age alone; past the threshold, kill and relaunch at once.
        while not self._stop.wait(self.args.watchdog_poll):
            with self.lock:
                assert self.proc is not None
                if self.proc.poll() == 0:
                    return  # the run is complete
                age = self._log_age()
                if age is not None and age > self.args.watchdog_threshold:
                    self.alarms.append(time.monotonic())
                    log(f"{self.name}: watchdog fired (log age > "
                        f"{self.args.watchdog_threshold:g} s); relaunching")  # fmt: skip
                    stop_process(self.proc, sig=signal.SIGKILL)
                    self._launch()

    def ready(self) -> bool:
        """A trainer process is running."""
        with self.lock:
            return self.proc is not None and self.proc.poll() is None

    def inject(self, kind: str) -> str:
        """SIGSTOP for a hang; SIGKILL for every other kind (see the module docstring)."""
        with self.lock:
            assert self.proc is not None
            sig = signal.SIGSTOP if kind == "hang" else signal.SIGKILL
            os.kill(self.proc.pid, sig)
            return f"{signal.Signals(sig).name} to pid {self.proc.pid}"

    def stop(self) -> None:
        """Stop the watchdog and the trainer."""
        self._stop.set()
        if self.watchdog.is_alive():
            self.watchdog.join()
        stop_process(self.proc, sig=signal.SIGKILL)
        self.steps.stop()

    def extras(self) -> dict[str, Any]:
        """The watchdog's settings and what it did."""
        return {
            "watchdog_threshold_s": self.args.watchdog_threshold,
            "watchdog_threshold_is_seeds": self.args.watchdog_threshold == SEED_WATCHDOG_S,
            "watchdog_poll_s": self.args.watchdog_poll,
            "watchdog_alarms": len(self.alarms),
            "launches": self.launches,
            "checkpoint_every_steps": self.args.every_steps,
            "modelled_in_its_favour": {
                "ghost": "SIGKILL as for trainguard; relaunched on the same machine at full "
                "speed (the seed's relaunch was slow until a VM restart)",
                "node-loss": "SIGKILL; relaunched at once when the watchdog fires, on the same "
                "disk with its checkpoints (no new machine, no staging, no lost disk)",
            },
        }


def trainguard_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The run's spec beyond the reference run: what a user of this tiny model would set.

    Checkpoints every `--every-steps` to L1, each verified one shipped to the remote layer
    `backup` (a volume every node reaches) so a moved run restores there. Monitoring at the
    default 1 s; Hung after `--hang-after` s without a step (the default, 300 s, is for big
    models), or sooner after `--hang-after-step-times` x the trainer's slowest recent step
    (at least 3 s), and Slow after half of `--hang-after` (it must come first); 5 s of
    start-up grace (the
    default, 900 s, covers compilation, which the tiny model has none of). Recovery: every
    failure of the schedule restarts (in place up to the default 3 times, then elsewhere); a
    constant 1 s back-off (the default doubles from 5 s and starts over only after 10 minutes
    of training, longer than the failures are apart here). The repeated-failure rule is off
    (`sameStepWindow: 0`): the schedule's failures are independent by construction, and a
    failure due while a side has not yet passed the previous one's step comes at that step.
    """
    restarts = args.failures + 5
    monitor: dict[str, Any] = {
        "hangAfterSeconds": args.hang_after,
        "slowAfterSeconds": max(1, args.hang_after // 2),
        "startupGraceSeconds": 5,
    }
    if args.hang_after_step_times:
        monitor["hangAfterStepTimes"] = args.hang_after_step_times
    return {
        "checkpoints": {
            "everySteps": args.every_steps,
            "remote": [
                {
                    "name": "backup",
                    "uri": "file:///backup/goodput",
                    "claimName": BACKUP_CLAIM,
                    "contents": "full",
                    "keep": 3,
                }
            ],
        },
        "monitor": monitor,
        "recovery": {
            "maxRestarts": restarts,
            "sameStepWindow": 0,
            "backoff": {"initialSeconds": 1, "maxSeconds": 1},
        },
    }


class Trainguard:
    """The operator and the run's pod on process-backed nodes, as users run them."""

    name = "trainguard"

    def __init__(
        self, cluster: Cluster, work: Path, shards: Path, args: argparse.Namespace
    ) -> None:
        self.cluster = cluster
        self.args = args
        self.dir = work / self.name
        self.dir.mkdir(parents=True)
        self.shards = shards
        self.namespace = f"goodput-{uuid.uuid4().hex[:6]}"
        self.steps = StepLog(self.dir / "steps.jsonl")
        self.operator = OperatorProcess(
            cluster.kubeconfig,
            [self.namespace],
            self.dir / "operator.log",
            extra_args=[f"--node-check-namespace={self.namespace}"],
        )
        self.spec = trainguard_spec(args)
        self.nodes_failed: list[str] = []

    def manifest(self) -> dict[str, Any]:
        """The reference run with the spec above, logging its steps to this side's step log."""
        command = reference_command(self.args.steps, self.args.step_seconds)
        command += ["--loss-log", str(self.steps.path)]
        spec = {**self.spec, "trainer": {"command": command}}
        return reference_run(RUN, self.shards, self.args.every_steps, spec)

    def start(self) -> None:
        """CRD, namespace, the remote layer's claim, the operator, the run."""
        install_crd(self.cluster)
        ensure_namespace(self.cluster, self.namespace)
        create_claim(self.cluster, self.namespace, BACKUP_CLAIM)
        self.operator.start()
        self.operator.wait_started()
        log(f"{self.name}: operator up (pid {self.operator.pid}, log {self.operator.log_path})")
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", "-",
                             input=yaml.safe_dump(self.manifest()))  # fmt: skip

    def _trainer(self) -> tuple[dict[str, Any], int] | None:
        """The run's live pod and its trainer's PID (from a heartbeat of a live process)."""
        found = json.loads(
            self.cluster.kubectl(
                "get", "pods", "-n", self.namespace, "-l", f"{LABEL_RUN}={RUN}", "-o", "json"
            ).stdout
        )["items"]
        for pod in found:
            if not pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            beat = pods.heartbeat(pods.state_dir(self.cluster.root, pod)) or {}
            pid = beat.get("pid")
            if pid is not None and _alive(int(pid)):
                return pod, int(pid)
        return None

    def ready(self) -> bool:
        """The run's pod has a live trainer."""
        return self._trainer() is not None

    def inject(self, kind: str) -> str:
        """Signal the trainer, ghost its node's GPU, or take its node down."""
        found = self._trainer()
        assert found is not None, "no live trainer"
        pod, pid = found
        node = str(pod["spec"]["nodeName"])
        control = self.cluster.root / "procnodes" / node
        if kind == "node-loss":
            (control / DOWN_FILENAME).touch()
            self.nodes_failed.append(node)
            # The node's runtime kills every process of its pods, also those in sessions of
            # their own (the trainer, the warm standby), as a vanished machine takes them all.
            uid = str(pod["metadata"]["uid"])
            eventually(lambda: not pod_processes(uid), 10, f"the processes of {node}'s pod gone")
            return f"node {node} down; every process of its pod gone"
        if kind == "ghost":
            (control / GPU_SIM_FILENAME).write_text(json.dumps({"ghost_mib": GHOST_MIB}))
            self.nodes_failed.append(node)
        sig = signal.SIGSTOP if kind == "hang" else signal.SIGKILL
        os.kill(pid, sig)
        ghost = f"{GHOST_MIB} MiB ghost on {node}, " if kind == "ghost" else ""
        return f"{ghost}{signal.Signals(sig).name} to trainer pid {pid} on {node}"

    def stop(self) -> None:
        """The operator stopped, the namespace deleted, failed nodes given back."""
        self.steps.stop()
        self.operator.stop()
        self.cluster.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)
        for node in self.nodes_failed:
            control = self.cluster.root / "procnodes" / node
            (control / DOWN_FILENAME).unlink(missing_ok=True)
            (control / GPU_SIM_FILENAME).unlink(missing_ok=True)

    def extras(self) -> dict[str, Any]:
        """The run's spec choices and its final status."""
        run = json.loads(
            self.cluster.kubectl(
                "get", "trainingrun", RUN, "-n", self.namespace, "-o", "json"
            ).stdout
        )
        status = run.get("status") or {}
        return {
            "spec": self.spec,
            "restarts_in_status": status.get("restarts"),
            "attempt": status.get("attempt"),
            "excluded_nodes": [
                (e.get("node"), e.get("reason")) for e in status.get("excludedNodes") or []
            ],
            "phase": status.get("phase"),
            "operator_log": str(self.operator.log_path),
        }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def drive(side: Side, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """Start the side, cause the schedule's failures, wait for the final step; its figures."""
    side.start()
    first = eventually(
        lambda: side.steps.snapshot()[:1], seconds_left(deadline), f"{side.name}: a first step",
        POLL_S,
    )  # fmt: skip
    t0 = first[0].seen
    log(f"{side.name}: training (first step {first[0].step}); {args.steps} steps to go")
    failures: list[Failure] = []
    delays: list[float] = []
    for number, kind in enumerate(schedule(args.failures), start=1):
        due = t0 + number * args.failure_every
        previous = failures[-1].reached if failures else 0

        def due_now(due: float = due, previous: int = previous) -> bool | str:
            if side.steps.highest() >= args.steps:
                return "done"
            ready = time.monotonic() >= due and side.steps.highest() > previous
            return ready and side.ready()

        if eventually(due_now, seconds_left(deadline), f"{side.name}: failure {number}",
                      POLL_S) == "done":  # fmt: skip
            log(f"{side.name}: the run ended before failure {number}")
            break
        at = time.monotonic()
        done = side.inject(kind)
        time.sleep(SETTLE_S)
        failures.append(Failure(kind, at, side.steps.highest()))
        delays.append(round(at - due, 3))
        log(f"{side.name}: failure {number}/{args.failures} ({kind}) at step "
            f"{failures[-1].reached}, {at - t0:.1f} s in: {done}")  # fmt: skip

    final: int = args.steps

    def finished() -> bool:
        return side.steps.highest() >= final

    eventually(finished, seconds_left(deadline), f"{side.name}: step {final}", POLL_S)
    records = side.steps.snapshot()
    figures = side_figures(records, failures, args.steps, args.step_seconds)
    figures["raw"]["failure_delays_s"] = delays
    log(f"{side.name}: done: goodput {figures['goodput']}, wall {figures['wall_s']} s, "
        f"lost per failure {figures['time_lost_median_by_kind_s']}")  # fmt: skip
    return figures


def run_side(make: Callable[[], Side], args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """One side, from start to its figures, stopped whatever happens."""
    side = make()
    try:
        figures = drive(side, args, deadline)
        figures.update(side.extras())
        return figures
    finally:
        side.stop()


def report(args: argparse.Namespace, sides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The JSON report: goodput of each side, the time-lost ratio, per kind, raw figures."""
    ours, theirs = sides.get("trainguard"), sides.get("baseline")
    out: dict[str, Any] = {
        "schedule": {
            "failure_every_s": args.failure_every,
            "failures": args.failures,
            "kinds": schedule(args.failures),
            "steps": args.steps,
            "step_seconds": args.step_seconds,
            "checkpoint_every_steps": args.every_steps,
        },
        "goodput": {name: figures["goodput"] for name, figures in sides.items()},
        "targets": {"goodput": 0.95, "time_lost_ratio": 10.0, "at_failure_every_s": 300.0},
    }
    if ours is not None and theirs is not None:
        out["time_lost_ratio_baseline_over_trainguard"] = loss_ratio(theirs, ours)
        kinds = {*ours["time_lost_median_by_kind_s"], *theirs["time_lost_median_by_kind_s"]}
        out["per_kind_time_lost_median_s"] = {
            kind: {
                "trainguard": ours["time_lost_median_by_kind_s"].get(kind),
                "baseline": theirs["time_lost_median_by_kind_s"].get(kind),
            }
            for kind in sorted(kinds)
        }
    out.update(sides)
    out["cpus"] = os.cpu_count()
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON report."""
    args = parse_args(argv)
    # A SIGTERM unwinds like Ctrl-C, so the trainers, the operator and an own cluster stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    deadline = time.monotonic() + args.timeout
    work = Path(tempfile.mkdtemp(prefix="bench-goodput-"))
    shards = make_shards(work / "shards")
    log(f"{args.steps} steps of {args.step_seconds:g} s; failures {schedule(args.failures)} "
        f"every {args.failure_every:g} s; work in {work}")  # fmt: skip
    sides: dict[str, dict[str, Any]] = {}
    if args.only in (None, "trainguard"):
        own = args.cluster is None
        cluster = Cluster(args.cluster or f"bench-{uuid.uuid4().hex[:6]}")
        nodes = 1 + sum(kind in MOVING_KINDS for kind in schedule(args.failures))
        if own:
            log(f"starting cluster {cluster.name} with {nodes} process-backed nodes")
            cluster.up(nodes=0, process_nodes=nodes)
        elif not cluster.is_up():
            log(f"cluster {cluster.name} is not up; start it with `trainguard dev cluster up`")
            return 2
        try:
            sides["trainguard"] = run_side(
                lambda: Trainguard(cluster, work, shards, args), args, deadline
            )
        finally:
            if own:
                cluster.down(purge=True)
    if args.only in (None, "baseline"):
        sides["baseline"] = run_side(lambda: Baseline(work, shards, args), args, deadline)
    print(json.dumps(report(args, sides)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
