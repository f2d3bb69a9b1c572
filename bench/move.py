"""Move benchmark: a node fails under the demo's run; each phase of its move to a fresh node.

Starts a local control plane of its own (or uses `--cluster NAME`, started with
`trainguard dev cluster up --name NAME --process-nodes 2`) with two process-backed nodes, so
the run's pod is real local processes (agent sidecar, init steps, supervisor, trainer).
Installs the CRD and runs `trainguard operator` as a local process with the demo's settings
(its resync and agent image). Each move uses a fresh TrainingRun made from
``examples/demo.yaml`` as `trainguard demo` makes it (the tiny reference model, a checkpoint
every 20 steps to L1, each verified one shipped to the `file` remote layer `backup`, a volume
every node reaches), with a claim of its own for that layer, so a move restores only what its
own run shipped. Once the remote layer holds a verified checkpoint `--checkpoints` intervals
in and the run is Healthy, the failure is caused on the run's node:

- `ghost`: the node's simulated GPU reports `GHOST_MIB` held by no process (the node's GPU
  simulator state, as the demo does); the trainer lives on. The agent's GhostMemory verdict
  moves the run: the node is tainted and excluded, the pod deleted (the agent flushes the
  newest checkpoint within the grace period), and the next attempt starts elsewhere;
- `node-loss`: the node goes `down`: every process of its pods dies at once and its
  heartbeats stop; the run's Lease expires, the node turns NotReady, the operator force-deletes
  the pod and starts the next attempt elsewhere.

Between moves the run is deleted and both nodes are made healthy again (control files
removed, taint and health label taken off, Ready). For each move the milestones
(`trainguard_dev.testing.move.MILESTONES`) are read from what the system itself records: the
run's status, the pods' timestamps and their containers' start times, the scheduler's Event,
the init steps' reports in the state volume (their mtimes), the supervisor's state file, the
trainer's log and heartbeat. API timestamps have a resolution of one second (truncated); the
JSON names each milestone's source. The old pod's disappearance is the one milestone this
benchmark observes itself (a pod watch): a deleted object keeps no timestamp. The heartbeat
is written at most once a second, so its first record past the restored step may come up to
a second after the first step: the first step lies between `trainer_resumed` and
`first_step`.

Prints ONE JSON object on stdout: per cause the phases' medians and raw lists, the total after
the detection bound (`after_detection_s`: the failure in the status -> the first training
step on the fresh node; target <= 20 s), the step and layer each move resumed from, the steps
lost, and the machine's load average at each failure; progress goes to stderr.

    python bench/move.py --repeats 2
    python bench/move.py --cause node-loss --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from trainguard.api.constants import (
    API_VERSION,
    L0_LAYER,
    L1_LAYER,
    LABEL_NODE_HEALTH,
    LABEL_RUN,
    TAINT_UNHEALTHY,
    Verdict,
)
from trainguard.contract.files import (
    PREFLIGHT_FILENAME,
    RESTORE_FILENAME,
    STAGING_FILENAME,
    SUPERVISOR_FILENAME,
    read_json,
)
from trainguard.operator.build.constants import Container
from trainguard.operator.k8s.client import Kube, object_path
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.nodes import process_node_name
from trainguard_dev.cluster.procnode import DOWN_FILENAME, pod_processes
from trainguard_dev.demo import env as demo_env
from trainguard_dev.demo.main import GHOST_MIB
from trainguard_dev.demo.nodes import ProcessNodes
from trainguard_dev.testing import pods
from trainguard_dev.testing.move import MILESTONES, parse_time, phases, summary
from trainguard_dev.testing.polling import eventually, seconds_left
from trainguard_dev.testing.processes import OperatorProcess, stop_process
from trainguard_dev.testing.runs import make_shards

CAUSES = ("ghost", "node-loss")
NODES = 2
PLURAL = "trainingruns"
POLL_S = 0.2  # the run's status and pods, through the API
FILE_POLL_S = 0.05  # the new pod's heartbeat: its first record past the restored step
NODE_READY_TIMEOUT = "90s"
# The trainer's log: `<asctime> <logger> rank 0 resumed from <path>/step-<n> (layer <layer>)`.
RESUMED_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ .*resumed from \S*step-(\d+) \(layer (\w+)\)",
    re.MULTILINE,
)
ASCTIME = "%Y-%m-%d %H:%M:%S,%f"
# The agent's log line when it has flushed before its pod's end (`HH:MM:SS trainguard-agent:`).
FLUSH_LINE = re.compile(r"^(\d\d:\d\d:\d\d) \S+ flush before exit: (.*)$", re.MULTILINE)
SCHEDULED = "Scheduled"
# The supervisor's state file (`trainguard_harness.supervisor`): when it started, and its
# training processes, each with the time it was started.
SUPERVISOR_STARTED = "started_at"
SUPERVISOR_HISTORY = "history"


def log(message: str) -> None:
    """Progress, on stderr (stdout carries only the JSON report)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cause", choices=(*CAUSES, "both"), default="both")
    parser.add_argument("--repeats", type=int, default=2, help="moves per cause")
    parser.add_argument(
        "--checkpoints", type=int, default=2, help="checkpoint intervals shipped before a failure"
    )
    parser.add_argument("--cluster", help="use this running dev cluster instead of a new one")
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up after (seconds)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.checkpoints < 1:
        parser.error("--repeats and --checkpoints must be >= 1")
    return args


class PodWatch:
    """`kubectl get pods -w --output-watch-events`, read as it streams, in a thread.

    Keeps, per pod UID, when its DELETED event arrived (this machine's clock) and when its
    deletion was requested: the first deletionTimestamp it carried less its grace period (the
    apiserver sets it to the request's time plus the grace period; a later deletion with a
    shorter grace, the node's final one, moves it).
    """

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.argv = [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig),
                     "get", "pods", "-n", namespace, "-w", "--output-watch-events",
                     "-o", "json"]  # fmt: skip
        self.proc: subprocess.Popen[str] | None = None
        self.stopping = False
        self.lock = threading.Lock()
        self.gone: dict[str, float] = {}
        self.deleting: dict[str, float | None] = {}
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        # A watch ends (the apiserver closes long ones): it is started again at once.
        while not self.stopping:
            self.proc = subprocess.Popen(
                self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
            assert self.proc.stdout is not None
            for event in watch_events(self.proc.stdout):
                now = time.time()
                meta = (event.get("object") or {}).get("metadata") or {}
                uid = str(meta.get("uid", ""))
                with self.lock:
                    if meta.get("deletionTimestamp") and uid not in self.deleting:
                        at = parse_time(meta["deletionTimestamp"])
                        grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                        self.deleting[uid] = None if at is None else at - grace
                    if event.get("type") == "DELETED":
                        self.gone.setdefault(uid, now)
            self.proc.wait()
            if not self.stopping:
                time.sleep(0.2)

    def deleted(self, uid: str) -> tuple[float | None, float | None]:
        """When a pod's deletion was requested (to the second), and when it was seen gone."""
        with self.lock:
            return self.deleting.get(uid), self.gone.get(uid)

    def stop(self) -> None:
        """End the watch."""
        self.stopping = True
        stop_process(self.proc)


def watch_events(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The events of kubectl's `--output-watch-events -o json` stream, one JSON object each.

    kubectl prints each event compact, on a line of its own; an object spread over lines (an
    indented one) is gathered until it parses.
    """
    buffer = ""
    for line in lines:
        buffer += line
        try:
            event = json.loads(buffer)
        except ValueError:
            continue
        buffer = ""
        if isinstance(event, dict):
            yield event


def mtime(path: Path) -> float | None:
    """A file's modification time (epoch seconds), or None when it does not exist."""
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def container_time(pod: dict[str, Any], name: str, key: str) -> float | None:
    """`startedAt` or `finishedAt` of a container (init or not) in whatever state it is."""
    status = pod.get("status") or {}
    for entry in [*(status.get("initContainerStatuses") or []),
                  *(status.get("containerStatuses") or [])]:  # fmt: skip
        if entry.get("name") != name:
            continue
        for state in (entry.get("state") or {}).values():
            if isinstance(state, dict) and state.get(key):
                return parse_time(state[key])
    return None


def supervisor_times(state: Path) -> tuple[float | None, float | None]:
    """When the supervisor started, and its first training process (its state file)."""
    data = read_json(state / SUPERVISOR_FILENAME) or {}
    history = data.get(SUPERVISOR_HISTORY) or [{}]
    return data.get(SUPERVISOR_STARTED), history[0].get(SUPERVISOR_STARTED)


def trainer_resumed(log_path: Path) -> tuple[float, int, str] | None:
    """The trainer's 'resumed from' line: its time (the trainer's clock), step and layer."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    found = RESUMED_LINE.findall(text)
    if not found:
        return None
    stamp, step, layer = found[-1]
    return datetime.strptime(stamp, ASCTIME).timestamp(), int(step), layer


def agent_flush(log_path: Path) -> str | None:
    """The old agent's flush line ('HH:MM:SS done'), or None when it did not get to flush."""
    try:
        found = FLUSH_LINE.findall(log_path.read_text(errors="replace"))
    except OSError:
        return None
    return f"{found[-1][0]} {found[-1][1]}" if found else None


class Bench:
    """The operator, the nodes and the runs of one benchmark."""

    def __init__(self, cluster: Cluster, work: Path, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.work = work
        self.args = args
        self.nodes = ProcessNodes(cluster)
        self.namespace = f"move-{uuid.uuid4().hex[:6]}"
        self.kube = Kube.connect(str(cluster.kubeconfig), pool_size=2)
        self.shards = make_shards(work / "shards")
        self.operator = OperatorProcess(
            cluster.kubeconfig,
            [self.namespace],
            work / "operator.log",
            resync_seconds=demo_env.RESYNC_SECONDS,
            agent_image=demo_env.AGENT_IMAGE,
            extra_args=[f"--node-check-namespace={self.namespace}"],
        )
        self.watch: PodWatch | None = None
        self.deadline = time.monotonic() + args.timeout

    # ----- set-up and tear-down ----------------------------------------------------------

    def start(self) -> None:
        """CRD, namespace, healthy nodes, the operator, the pod watch."""
        demo_env.install_crd(self.cluster)
        demo_env.ensure_namespace(self.cluster, self.namespace)
        self.heal_nodes()
        self.operator.start()
        self.operator.wait_started()
        log(f"operator up (pid {self.operator.pid}, log {self.operator.log_path})")
        self.watch = PodWatch(self.cluster, self.namespace)

    def stop(self) -> None:
        """The watch and the operator stopped, the namespace deleted, the nodes healed."""
        if self.watch is not None:
            self.watch.stop()
        self.operator.stop()
        self.cluster.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)
        self.heal_nodes(wait=False)

    def heal_nodes(self, wait: bool = True) -> None:
        """Every node healthy: no control file, no taint or health label, Ready."""
        names = [process_node_name(i) for i in range(NODES)]
        for node in names:
            self.nodes.reset(node)
            self.cluster.kubectl("taint", "node", node, f"{TAINT_UNHEALTHY}-", check=False)
            self.cluster.kubectl("label", "node", node, f"{LABEL_NODE_HEALTH}-", check=False)
        if wait:
            self.cluster.kubectl(
                "wait", "--for=condition=Ready", *(f"node/{n}" for n in names),
                f"--timeout={NODE_READY_TIMEOUT}", timeout=120,
            )  # fmt: skip

    # ----- reading the run -----------------------------------------------------------------

    def left(self) -> float:
        """Seconds until the benchmark's deadline."""
        return seconds_left(self.deadline)

    def run_object(self, name: str) -> dict[str, Any]:
        """The run as the apiserver has it now."""
        return self.kube.get(object_path(API_VERSION, PLURAL, self.namespace, name)) or {}

    def run_pods(self, name: str) -> list[dict[str, Any]]:
        """The run's pods bound to a node, not being deleted."""
        listed = self.kube.request(
            "GET",
            object_path("v1", "pods", self.namespace, None),
            query={"labelSelector": f"{LABEL_RUN}={name}"},
        )
        return [
            p
            for p in listed.get("items") or []
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        ]

    def scheduled_at(self, pod: dict[str, Any]) -> float | None:
        """The scheduler's Scheduled Event of the pod: its eventTime (µs), else its first time."""
        selector = f"involvedObject.name={pod['metadata']['name']},reason={SCHEDULED}"
        listed = self.kube.request(
            "GET",
            object_path("v1", "events", self.namespace, None),
            query={"fieldSelector": selector},
        )
        uid = pod["metadata"]["uid"]
        for event in listed.get("items") or []:
            if (event.get("involvedObject") or {}).get("uid") == uid:
                return parse_time(event.get("eventTime") or event.get("firstTimestamp"))
        return None

    # ----- one move ------------------------------------------------------------------------

    def manifest(self, name: str, claim: str) -> dict[str, Any]:
        """The demo's run under `name`, its remote layer on a claim of its own."""
        run = demo_env.demo_run(name, self.shards)
        (layer,) = run["spec"]["checkpoints"]["remote"]
        layer["claimName"] = claim
        layer["uri"] = f"file:///backup/{name}"
        return run

    def ready(self, name: str, every: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The run's pod and heartbeat once the remote layer holds `--checkpoints` intervals."""
        status = self.run_object(name).get("status") or {}
        wanted = self.args.checkpoints * every
        shipped = any(
            c.get("layer") not in (L0_LAYER, L1_LAYER)
            and c.get("verified")
            and (c.get("step") or 0) >= wanted
            for c in status.get("checkpoints") or []
        )
        if not shipped or status.get("verdict") != Verdict.HEALTHY.value:
            return None
        found = self.run_pods(name)
        if len(found) != 1:
            return None
        beat = pods.heartbeat(pods.state_dir(self.cluster.root, found[0]))
        if not beat or not self.nodes.trainer_alive(beat):
            return None
        return found[0], beat

    def inject(self, cause: str, old: dict[str, Any]) -> float:
        """Cause the failure on the old pod's node; the wall-clock time it was caused."""
        node = str(old["spec"]["nodeName"])
        at = time.time()
        if cause == "ghost":
            self.nodes.inject_ghost(node, GHOST_MIB)
            return at
        (self.cluster.root / "procnodes" / node / DOWN_FILENAME).touch()
        uid = str(old["metadata"]["uid"])
        eventually(lambda: not pod_processes(uid), 10, f"the processes of {node}'s pod gone")
        return at

    def move(self, cause: str, number: int) -> dict[str, Any]:
        """One fresh run, trained, failed by `cause`, moved; its milestones and phases."""
        name = f"move-{cause}-{number}"
        claim = f"{name}-backup"
        demo_env.create_claim(self.cluster, self.namespace, claim)
        run = self.manifest(name, claim)
        every = int(run["spec"]["checkpoints"]["everySteps"])
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(run))
        wanted = self.args.checkpoints * every
        log(f"{name}: applied; waiting for step {wanted} in the remote layer")
        old, beat = eventually(
            lambda: self.ready(name, every), self.left(), f"{name}: shipped and Healthy", POLL_S
        )
        status = self.run_object(name)["status"]
        previous = status.get("lastFailure")
        attempt = int(status.get("attempt") or 1)
        node = str(old["spec"]["nodeName"])
        old_dir = pods.pod_directory(self.cluster.root, old)
        highest = int(beat.get("step") or 0)
        load = os.getloadavg()
        injected = self.inject(cause, old)
        log(f"{name}: {cause} on {node} at step {highest} (pod {old['metadata']['name']})")

        def detected() -> dict[str, Any] | None:
            nonlocal highest
            latest = pods.heartbeat(pods.state_dir(self.cluster.root, old)) or {}
            if latest.get("pid") == beat.get("pid"):
                highest = max(highest, int(latest.get("step") or 0))
            failure = (self.run_object(name).get("status") or {}).get("lastFailure")
            if not failure or failure == previous or failure.get("attempt") != attempt:
                return None
            return dict(failure)

        failure = eventually(detected, self.left(), f"{name}: the failure in the status", POLL_S)
        log(f"{name}: {failure.get('cause')} in the status; waiting for the move")

        def moved() -> dict[str, Any] | None:
            found = [p for p in self.run_pods(name) if p["spec"]["nodeName"] != node]
            return found[0] if found else None

        new = eventually(moved, self.left(), f"{name}: a new pod on another node", POLL_S)
        state = pods.state_dir(self.cluster.root, new)
        new_dir = pods.pod_directory(self.cluster.root, new)

        def first_step() -> tuple[dict[str, Any], dict[str, Any]] | None:
            report = read_json(state / RESTORE_FILENAME)
            latest = pods.heartbeat(state)
            if report is None or not latest:
                return None
            past = int(latest.get("step") or 0) > int(report.get("step") or 0)
            return (report, latest) if past else None

        report, first = eventually(
            first_step, self.left(), f"{name}: training on the new node", FILE_POLL_S
        )
        new = (
            self.kube.get(object_path("v1", "pods", self.namespace, new["metadata"]["name"])) or new
        )
        assert self.watch is not None
        deleting, gone = self.watch.deleted(str(old["metadata"]["uid"]))
        resumed = trainer_resumed(new_dir / f"{Container.TRAINER}.log")
        supervisor, process = supervisor_times(state)
        # The old trainer may step on until its pod is deleted (its SIGTERM saves): its last
        # heartbeat tells the step it reached.
        last = pods.heartbeat(pods.state_dir(self.cluster.root, old)) or {}
        highest = max(highest, int(last.get("step") or 0))
        marks = {
            "injected": injected,
            "detected": parse_time(failure.get("time")),
            "old_pod_deleting": deleting,
            "old_pod_gone": gone,
            "pod_created": parse_time(new["metadata"].get("creationTimestamp")),
            "scheduled": self.scheduled_at(new),
            "preflight_started": container_time(new, Container.PREFLIGHT, "startedAt"),
            "preflight_finished": mtime(state / PREFLIGHT_FILENAME),
            "staged": mtime(state / STAGING_FILENAME),
            "restored": mtime(state / RESTORE_FILENAME),
            "trainer_started": container_time(new, Container.TRAINER, "startedAt"),
            "supervisor_started": supervisor,
            "trainer_process_started": process,
            "trainer_resumed": None if resumed is None else resumed[0],
            "first_step": float(first["time"]),
        }
        found = phases(marks)
        restored = report.get("step")
        log(
            f"{name}: moved {node} -> {new['spec']['nodeName']}, restored step {restored} from "
            f"{report.get('from_layer')}; after the detection bound "
            f"{found.get('after_detection_s')} s; phases {found}"
        )
        self.cluster.kubectl(
            "delete", PLURAL, name, "-n", self.namespace, "--wait=true", "--timeout=120s",
            timeout=150,
        )  # fmt: skip
        self.heal_nodes()
        return {
            "cause": cause,
            "run": name,
            "failure_cause": failure.get("cause"),
            "node_before": node,
            "node_after": new["spec"]["nodeName"],
            "step_at_failure": highest,
            "restored_step": restored,
            "restored_from_layer": report.get("from_layer"),
            # A lost node's last heartbeat may be a second old: never below 0.
            "steps_lost": None if restored is None else max(0, highest - int(restored)),
            "first_heartbeat_step": first.get("step"),
            "trainer_resumed_step": None if resumed is None else resumed[1],
            "old_agent_flush": agent_flush(old_dir / f"{Container.AGENT}.log"),
            "load_average_at_failure": [round(x, 2) for x in load],
            "marks": {k: None if v is None else round(v, 3) for k, v in marks.items()},
            "phases_s": found,
        }


def report(moves: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON report: per cause the phase medians and raw lists; every move."""
    causes = {}
    for cause in sorted({m["cause"] for m in moves}):
        mine = [m for m in moves if m["cause"] == cause]
        causes[cause] = {
            "moves": len(mine),
            **summary([m["phases_s"] for m in mine]),
            "resumed_from": [(m["restored_step"], m["restored_from_layer"]) for m in mine],
            "steps_lost": [m["steps_lost"] for m in mine],
            "failure_causes": [m["failure_cause"] for m in mine],
        }
    return {
        "target_after_detection_s": 20.0,
        "causes": causes,
        "milestones": dict(MILESTONES),
        "resolution_note": "API timestamps are truncated to the second; phases between them "
        "are known to within 1 s, and one between an API timestamp and a finer clock may be "
        "slightly negative",
        "checkpoint_intervals_before_failure": args.checkpoints,
        "moves": moves,
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON report."""
    args = parse_args(argv)
    # A SIGTERM unwinds like Ctrl-C, so the operator, the watch and an own cluster are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    causes = CAUSES if args.cause == "both" else (args.cause,)
    own = args.cluster is None
    cluster = Cluster(args.cluster or f"bench-{uuid.uuid4().hex[:6]}")
    if own:
        log(f"starting cluster {cluster.name} with {NODES} process-backed nodes")
        cluster.up(nodes=0, process_nodes=NODES)
    elif not cluster.is_up():
        log(f"cluster {cluster.name} is not up; start it with `trainguard dev cluster up`")
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-move-"))
    bench = Bench(cluster, work, args)
    moves: list[dict[str, Any]] = []
    try:
        bench.start()
        for cause in causes:
            for number in range(1, args.repeats + 1):
                moves.append(bench.move(cause, number))
    finally:
        bench.stop()
        if own:
            cluster.down(purge=True)
    print(json.dumps(report(moves, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
