"""Detection benchmark: N silent deaths of a trainer, how fast trainguard sees each and resumes.

Starts a local control plane of its own (or uses `--cluster NAME`, started with
`trainguard dev cluster up --name NAME --process-nodes 1`) with a process-backed node, so the
run's pod is real local processes: the agent sidecar, the supervisor and the reference
trainer. Installs the CRD, starts `trainguard operator` (a local process, default settings)
on a fresh namespace and creates one TrainingRun with `monitor.intervalSeconds: 1`. Then:

1. a normal stretch (`--normal-seconds`, with checkpoint saves in it): the largest gap
   between two writes of the trainer's log, sampled every `LOG_SAMPLE_S`. The log-age
   watchdog's threshold T is that gap rounded up to a whole second: the smallest that
   raises no false alarm over a normal run. A watchdog polling every `--watchdog-poll`
   seconds runs over the same stretch and must raise none.
2. `--deaths` silent deaths: SIGKILL of the training process (pid from the heartbeat file),
   each at a random moment of steady training, at least `--steady-seconds` after the
   previous restart (by then the supervisor's warm standby for the next restart is ready;
   `--steady-seconds 0` kills back to back, which measures restarts without one). For each
   it measures
   - death -> `Dead` visible in the run's status, as delivered by a WATCH
     (`kubectl get -w -o json`, read as it streams; no polling);
   - death -> next training step (the heartbeat of the restarted process shows a step);
   - the steps lost: the step the killed process had finished (the last line of its loss log,
     written every step) - the step the restarted process resumed from, and the layer it
     resumed from: L0 (pod memory, a snapshot every step or two) or L1 (every
     `EVERY_STEPS` steps on disk);
   - the log-age baseline on the same death: the first watchdog poll at which the log's age,
     counted from its last write before the death, reaches T.
     The supervisor restarts the trainer in place within seconds, and a restarted trainer
     writes the log again, so a log-age watchdog never fires here at all; its detection
     time is taken from the write the death left behind, on the watchdog's own poll ticks.
   The step resumed from, and its layer, is what the restarted process logs.

Prints ONE JSON object on stdout; progress goes to stderr. Targets: `detect_p50_s` <= 2 and
`detect_p99_s` <= 5 with a 1 s interval; with L0, `steps_lost_median` <= 1 for these software
deaths.

    python bench/detect.py --deaths 20
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from trainguard.api.constants import CRD_NAME
from trainguard.operator.build.constants import LOG_DIR, Volume
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing import pods
from trainguard_dev.testing.polling import eventually, seconds_left
from trainguard_dev.testing.processes import OperatorProcess, stop_process
from trainguard_dev.testing.runs import make_shards, reference_run

REPO = Path(__file__).resolve().parents[1]
RUN = "detect"
# More steps than the benchmark lasts: it stops the run, not the trainer.
TRAINER_STEPS = 100_000_000
EVERY_STEPS = 20
INTERVAL_S = 1
BACKOFF_S = 1
POLL_S = 0.02  # heartbeat file reads (the trainer side has no watch)
LOG_SAMPLE_S = 0.02
RESUMED_FROM = re.compile(r"resumed from \S*step-(\d+) \(layer (\w+)\)")
# The trainer's loss log, a line per finished step: the exact step a death interrupted.
LOSS_LOG = "loss.jsonl"
LOGS_VOLUME = Volume.LOGS
STEADY_STEPS = 5  # steps a restarted trainer makes before the next death


def log(message: str) -> None:
    """Progress, on stderr (stdout carries only the JSON report)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deaths", type=int, default=20, help="silent deaths to cause")
    parser.add_argument("--cluster", help="use this running dev cluster instead of a new one")
    parser.add_argument(
        "--normal-seconds", type=float, default=60.0, help="normal stretch for the baseline"
    )
    parser.add_argument(
        "--watchdog-poll", type=float, default=1.0, help="the log-age watchdog's poll (s)"
    )
    parser.add_argument(
        "--steady-seconds",
        type=float,
        default=20.0,
        help="training after a restart before the next death (0: as soon as it is steady)",
    )
    parser.add_argument("--timeout", type=float, default=1200.0, help="give up after (seconds)")
    args = parser.parse_args(argv)
    if args.deaths < 1 or args.normal_seconds <= 0 or args.watchdog_poll <= 0:
        parser.error("--deaths must be >= 1; --normal-seconds and --watchdog-poll > 0")
    if args.steady_seconds < 0:
        parser.error("--steady-seconds must be >= 0")
    return args


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the nearest ranks."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def run_manifest(shards: Path, deaths: int) -> dict[str, Any]:
    """The run: the reference trainer on the process-backed node, watched every second.

    The tiny model steps as fast as it can. Every death is restarted in place
    (inPlaceRestarts and maxRestarts above the deaths), with a constant 1 s back-off, and the
    repeated-failure rule off (`sameStepWindow: 0`): the benchmark measures detection and
    resume, not the ladder's later rungs.
    """
    restarts = deaths + 5
    spec = {
        "monitor": {"intervalSeconds": INTERVAL_S, "startupGraceSeconds": 5},
        "recovery": {
            "inPlaceRestarts": restarts,
            "maxRestarts": restarts,
            "sameStepWindow": 0,
            "backoff": {"initialSeconds": BACKOFF_S, "maxSeconds": BACKOFF_S},
        },
    }
    run = reference_run(RUN, shards, EVERY_STEPS, spec, steps=TRAINER_STEPS, min_step_seconds=None)
    run["spec"]["trainer"]["command"] += ["--loss-log", f"{LOG_DIR}/{LOSS_LOG}"]
    return run


class StatusWatch:
    """`kubectl get tr -w -o json`, read as it streams: each status with its arrival time."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.argv = [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig),
                     "get", "trainingrun", RUN, "-n", namespace, "-w", "-o", "json"]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.seen: list[tuple[float, dict[str, Any]]] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        # A watch ends (server timeout, a hiccup under load): it is started again at once.
        while not self.stopping:
            self.proc = subprocess.Popen(
                self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            self._read(self.proc)
            self.proc.wait()
            if not self.stopping:
                time.sleep(0.2)

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        decoder = json.JSONDecoder()
        buffer = ""
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            buffer += raw.decode()
            while buffer.strip():
                try:
                    obj, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break  # an object still arriving
                buffer = buffer.lstrip()[end:]
                with self.changed:
                    self.seen.append((time.monotonic(), obj.get("status") or {}))
                    self.changed.notify_all()

    def wait(self, check: Any, after: float, deadline: float, what: str) -> tuple[float, Any]:
        """The first status delivered at or after `after` for which `check` holds."""
        with self.changed:
            while True:
                for at, status in self.seen:
                    if at >= after and check(status):
                        return at, status
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out waiting for {what}")
                self.changed.wait(min(left, 1.0))

    def latest(self) -> dict[str, Any]:
        """The status last delivered."""
        with self.changed:
            return self.seen[-1][1] if self.seen else {}

    def stop(self) -> None:
        """End the watch."""
        self.stopping = True
        stop_process(self.proc)


class LogWrites:
    """The trainer's log, sampled: the time of every write seen (mtime changes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writes: list[float] = []  # wall-clock mtimes, in order
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        last = None
        while not self._stop.is_set():
            try:
                mtime = self.path.stat().st_mtime
            except OSError:
                mtime = None
            if mtime is not None and mtime != last:
                self.writes.append(mtime)
                last = mtime
            time.sleep(LOG_SAMPLE_S)

    def last_before(self, wall: float) -> float:
        """The last write at or before `wall`."""
        return max(w for w in self.writes if w <= wall)

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self.thread.join()


def finished_step(path: Path) -> int:
    """The last step the loss log records (a whole line), else 0."""
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    whole = [line for line in lines if line.endswith("}")]
    return int(json.loads(whole[-1])["step"]) if whole else 0


def largest_gap(writes: list[float], start: float, end: float) -> float:
    """The longest time without a write in [start, end]."""
    inside = [start, *(w for w in writes if start <= w <= end), end]
    return max(b - a for a, b in itertools.pairwise(inside))


def watchdog_alarms(
    writes: list[float], threshold: float, poll: float, start: float, end: float
) -> list[float]:
    """The alarms of a log-age watchdog polling every `poll` s from `start` over the writes."""
    alarms = []
    tick = start
    while tick <= end:
        seen = [w for w in writes if w <= tick]
        if seen and tick - seen[-1] > threshold:
            alarms.append(tick)
        tick += poll
    return alarms


def logage_detection(
    last_write: float, died: float, threshold: float, poll: float, t0: float
) -> float:
    """Seconds from the death to the watchdog's first poll at which the log is older than T."""
    due = last_write + threshold
    ticks = math.floor((due - t0) / poll) + 1
    return t0 + ticks * poll - died


def measure(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    """Set up, run the normal stretch and the deaths; clean up what it created."""
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds" / f"{CRD_NAME}.yaml")
    )
    cluster.wait_established(CRD_NAME, 90)
    namespace = f"detect-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    work = Path(tempfile.mkdtemp(prefix="bench-detect-"))
    shards = make_shards(work / "shards")
    operator = OperatorProcess(cluster.kubeconfig, [namespace], work / "operator.log")
    operator.start()
    watch: StatusWatch | None = None
    writes: LogWrites | None = None
    try:
        deadline = time.monotonic() + args.timeout
        operator.wait_started(seconds_left(deadline))
        log(f"operator up (pid {operator.pid}, log {operator.log_path})")
        cluster.kubectl("apply", "-n", namespace, "-f", "-",
                        input=yaml.safe_dump(run_manifest(shards, args.deaths)))  # fmt: skip
        watch = StatusWatch(cluster, namespace)

        def pod() -> dict[str, Any] | None:
            found = json.loads(
                cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout
            )["items"]
            return next((p for p in found if p["spec"].get("nodeName")), None)

        bound = eventually(pod, seconds_left(deadline), "the pod on its node", 0.5)
        pod_dir = pods.pod_directory(cluster.root, bound)
        state = pods.state_dir(cluster.root, bound)
        log(f"pod {bound['metadata']['name']} on {bound['spec']['nodeName']}; waiting for training")
        eventually(
            lambda: pods.checkpointed(state, EVERY_STEPS),
            seconds_left(deadline),
            "the first checkpoint",
            POLL_S,
        )
        watch.wait(lambda s: s.get("verdict") == "Healthy", 0, deadline, "Healthy")

        # 1. The normal stretch: the log's largest gap, with checkpoint saves in it.
        writes = LogWrites(pod_dir / "trainer.log")
        start_beat = pods.heartbeat(state) or {}
        normal_start = time.time()
        log(f"normal stretch of {args.normal_seconds:.0f} s for the log-age threshold")
        time.sleep(args.normal_seconds)
        normal_end = time.time()
        end_beat = pods.heartbeat(state) or {}
        gap = largest_gap(writes.writes, normal_start, normal_end)
        threshold = float(math.ceil(gap))
        false_alarms = watchdog_alarms(
            writes.writes, threshold, args.watchdog_poll, normal_start, normal_end
        )
        saves = (
            (end_beat.get("last_checkpoint_step") or 0)
            - (start_beat.get("last_checkpoint_step") or 0)
        ) // EVERY_STEPS
        log(f"largest log gap {gap:.2f} s -> T = {threshold:.0f} s; {len(false_alarms)} alarms")
        if false_alarms:
            raise RuntimeError(f"the watchdog with T={threshold} alarmed on a normal run")

        # 2. The deaths.
        detects, resumes, lost, baseline = [], [], [], []
        layers: list[str] = []  # the layer each restarted process resumed from
        logs = pod_dir / "volumes" / LOGS_VOLUME
        rng = random.Random(1)
        for number in range(1, args.deaths + 1):
            before = eventually(
                lambda: pods.heartbeat(state), seconds_left(deadline), "a heartbeat", POLL_S
            )
            restarts = int(watch.latest().get("restarts") or 0)
            time.sleep(rng.uniform(0.0, 2.0))  # a random moment relative to the agent's looks
            beat = pods.heartbeat(state) or before
            pid = int(beat["pid"])
            died_wall, died = time.time(), time.monotonic()
            os.kill(pid, signal.SIGKILL)
            reached = finished_step(logs / LOSS_LOG)

            def dead(status: dict[str, Any], known: int = restarts) -> bool:
                return status.get("verdict") == "Dead" and int(status.get("restarts") or 0) > known

            seen_at, _ = watch.wait(dead, died, deadline, f"death {number}: Dead in the status")

            log_size = (pod_dir / "trainer.log").stat().st_size

            def restored(size: int = log_size) -> tuple[int, str] | None:
                # The restarted process logs the checkpoint it resumed from, and its layer.
                with (pod_dir / "trainer.log").open("rb") as handle:
                    handle.seek(size)
                    found = RESUMED_FROM.findall(handle.read().decode(errors="replace"))
                return (int(found[-1][0]), found[-1][1]) if found else None

            saved, layer = eventually(
                restored, seconds_left(deadline), f"death {number}: the restore", POLL_S
            )
            layers.append(layer)

            def resumed(old: int = pid, saved: int = saved) -> dict[str, Any] | None:
                # A step of the restarted process past the checkpoint it resumed from.
                now_beat = pods.heartbeat(state)
                fresh = now_beat and now_beat["pid"] != old and (now_beat.get("step") or 0) > saved
                return now_beat if fresh else None

            first = eventually(
                resumed, seconds_left(deadline), f"death {number}: the next step", POLL_S
            )
            resumed_at = time.monotonic()
            detects.append(seen_at - died)
            resumes.append(resumed_at - died)
            lost.append(reached - saved)
            baseline.append(
                logage_detection(writes.last_before(died_wall), died_wall, threshold,
                                 args.watchdog_poll, normal_start)
            )  # fmt: skip
            log(
                f"death {number}/{args.deaths} at step {reached}: Dead seen after "
                f"{detects[-1]:.2f} s, resumed from {layer} step {saved} ({lost[-1]} lost), "
                f"next step {first['step']} after {resumes[-1]:.2f} s; "
                f"log-age watchdog would alarm after {baseline[-1]:.2f} s"
            )

            # Steady training again before the next death: a few steps by the new process
            # and the status Healthy again.
            def steady(start: int = int(first["step"])) -> bool:
                return int((pods.heartbeat(state) or {}).get("step") or 0) >= start + STEADY_STEPS

            eventually(steady, seconds_left(deadline), f"death {number}: steady training", POLL_S)
            watch.wait(lambda s: s.get("verdict") == "Healthy", resumed_at, deadline, "Healthy")
            # A death after a stretch of training, as most are, not moments after the last one:
            # the supervisor's warm standby for the next restart is started and ready by then.
            if number < args.deaths:
                time.sleep(max(0.0, args.steady_seconds - (time.monotonic() - resumed_at)))
        status = watch.latest()
        return {
            "deaths": args.deaths,
            "detect_p50_s": round(percentile(detects, 50), 3),
            "detect_p99_s": round(percentile(detects, 99), 3),
            "detect_max_s": round(max(detects), 3),
            "resume_median_s": round(statistics.median(resumes), 3),
            "resume_max_s": round(max(resumes), 3),
            "baseline_logage_detect_s": round(statistics.median(baseline), 3),
            "baseline_logage_max_s": round(max(baseline), 3),
            "baseline_logage_threshold_s": threshold,
            "baseline_largest_normal_gap_s": round(gap, 3),
            "baseline_normal_seconds": args.normal_seconds,
            "baseline_normal_checkpoint_saves": saves,
            "baseline_watchdog_poll_s": args.watchdog_poll,
            "monitor_interval_s": INTERVAL_S,
            "restart_backoff_s": BACKOFF_S,
            "steady_seconds_between_deaths": args.steady_seconds,
            "checkpoint_every_steps": EVERY_STEPS,
            "steps_lost_max": max(lost),
            "steps_lost_median": statistics.median(lost),
            "steps_lost": lost,
            "resumed_from": {name: layers.count(name) for name in sorted(set(layers))},
            "restarts_in_status": status.get("restarts"),
            "cpus": os.cpu_count(),
        }
    finally:
        if watch is not None:
            watch.stop()
        if writes is not None:
            writes.stop()
        operator.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON report."""
    args = parse_args(argv)
    # A SIGTERM unwinds like Ctrl-C, so the operator, the watch and an own cluster are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    own = args.cluster is None
    cluster = Cluster(args.cluster or f"bench-{uuid.uuid4().hex[:6]}")
    if own:
        log(f"starting cluster {cluster.name} with one process-backed node")
        cluster.up(nodes=0, process_nodes=1)
    elif not cluster.is_up():
        log(f"cluster {cluster.name} is not up; start it with `trainguard dev cluster up`")
        return 2
    try:
        report = measure(cluster, args)
    finally:
        if own:
            cluster.down(purge=True)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
