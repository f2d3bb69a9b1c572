"""`trainguard demo`: trainguard doing its whole job on a local control plane.

It brings up (or reuses) a local control plane with two process-backed GPU nodes, whose
pods run as real local processes (the GPUs are simulated); installs the CRD generated from
the API models; runs the operator as a local process with exactly the RBAC the Helm chart
grants; and applies ``examples/demo.yaml``, the tiny reference model training on the CPU.
With ``--real-nodes`` the same story runs on two real nodes (kubelet, containerd, runc; the
GPUs simulated), with the images built here and trainguard installed in-cluster from its
Helm chart (`trainguard_dev.demo.nodes` holds the difference). Then, with a live progress
line, it breaks the run twice and narrates what trainguard does:

1. silent death: the trainer is SIGKILLed; the agent sees it gone, the operator records
   `Dead` and the trainer restarts in place from its newest local (L1) checkpoint;
2. ghost VRAM: the node's simulated GPU keeps memory that no live process holds and the
   trainer is killed; the run's node is tainted and excluded, the run is rescheduled to the
   other node and restored there from the newest verified checkpoint of its remote layer.

It ends with a summary (detection latency, time to resume, steps lost, verified
checkpoints per layer), suspends the run (its status and Events stay for kubectl and
`trainguard status`), stops a local operator (an in-cluster one keeps watching) and leaves
the cluster up, printing its KUBECONFIG line; ``--down`` tears the cluster down instead
(``--keep``, the default, keeps it). ``--json`` prints only the summary, as one JSON object,
on stdout. Ctrl-C stops a local operator and deletes the run. A recovery that does not
happen in time exits 1, naming the step that did not happen.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from trainguard.api.constants import LABEL_NODE_HEALTH, TAINT_UNHEALTHY, Reason, Verdict
from trainguard.operator.k8s.client import Kube, KubeError
from trainguard_dev.cluster.cluster import Cluster, ClusterError
from trainguard_dev.demo import env as demo_env
from trainguard_dev.demo.nodes import Nodes, ProcessNodes, RealNodes
from trainguard_dev.demo.watch import L1, Checkpoints, Display, Observer, PodView, progress_line
from trainguard_dev.testing.polling import eventually

DEMO_CLUSTER = "demo"
DEMO_REAL_CLUSTER = "demo-real"
NAMESPACE = "trainguard-demo"
RUN = "demo"
GHOST_MIB = 8192
GHOST_CAUSES = (Verdict.GHOST_MEMORY.value, Reason.GPU_MEMORY_NOT_RELEASED.value)
POLL_SECONDS = 0.5
HEARTBEAT_WAIT_S = 3.0  # a little over the heartbeat's write interval
# Generous for a loaded machine; each names the step it bounds when it runs out.
TRAINING_TIMEOUT = 300.0
DETECT_TIMEOUT = 60.0
RECOVERY_TIMEOUT = 240.0
SUSPEND_TIMEOUT = 60.0

T = TypeVar("T")


class DemoError(RuntimeError):
    """Something the demo waits for did not happen; the message says what."""


@dataclass(frozen=True)
class Recovery:
    """One failure the demo caused, and how trainguard recovered from it."""

    scenario: str
    cause: str
    detect_s: float
    resume_s: float
    steps_lost: int
    step_at_failure: int
    resumed_step: int
    from_layer: str
    node_before: str
    node_after: str
    attempt_before: int
    attempt_after: int


@dataclass(frozen=True)
class Snapshot:
    """One look at the run: its status, its current pod and that pod's heartbeat."""

    status: dict[str, Any]
    pod: PodView | None
    beat: dict[str, Any] | None


def evidence_reason(failure: dict[str, Any]) -> str:
    """The sentence of a failure's evidence (the message is the agent's evidence as JSON)."""
    message = str(failure.get("message") or "")
    try:
        evidence = json.loads(message)
    except ValueError:
        return message
    return str(evidence.get("reason", message)) if isinstance(evidence, dict) else message


class Demo:
    """One demo: setup, the two failures, the summary and the cleanup."""

    def __init__(self, nodes: Nodes, display: Display) -> None:
        self.nodes = nodes
        self.cluster = nodes.cluster
        self.display = display
        self.workdir = self.cluster.root / "demo"
        self.observer: Observer | None = None
        self.checkpoints = Checkpoints()
        self.every_steps = 0
        self.last_step: int | None = None
        self.run_applied = False

    # ----- setup -------------------------------------------------------------------------

    def setup(self) -> None:
        """Control plane, CRD, the operator, the data and the run."""
        say = self.display.say
        demo_env.source_tree()
        self.nodes.up(say)
        self.workdir.mkdir(parents=True, exist_ok=True)
        demo_env.install_crd(self.cluster)
        say("CRD trainingruns.trainguard.dev installed (generated from the API models)")
        self.nodes.namespace(NAMESPACE)
        kube = Kube.connect(str(self.cluster.kubeconfig), pool_size=2)
        self.observer = Observer(kube, self.nodes.pod_files, NAMESPACE, RUN)
        self._fresh_stage()
        self.nodes.start_operator(NAMESPACE, self.workdir, say)
        run = self.nodes.run(RUN, NAMESPACE, self.workdir)
        self.nodes.backup_claim(NAMESPACE)
        self.every_steps = int(run["spec"]["checkpoints"]["everySteps"])
        self.cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(run))
        self.run_applied = True
        say(
            f"TrainingRun {NAMESPACE}/{RUN} applied (examples/demo.yaml): tiny GPT on CPU, "
            f"checkpoint every {self.every_steps} steps to L1, shipped to layer 'backup' "
            f"(PVC {demo_env.backup_claim()}, kept in "
            f"{demo_env.backup_dir(self.cluster, NAMESPACE)})"
        )

    def _fresh_stage(self) -> None:
        """On a reused cluster: no run of an earlier demo, healthy nodes."""
        self.cluster.kubectl(
            "delete", "trainingruns", RUN, "-n", NAMESPACE, "--ignore-not-found", "--wait=true",
            "--timeout=60s", timeout=90, check=False,
        )  # fmt: skip
        self._wait(lambda: not self._obs().pods(), 60.0, "pods of an earlier demo run to go")
        # The remote layer starts empty: the ghost recovery must restore what this run shipped.
        shutil.rmtree(demo_env.backup_dir(self.cluster, NAMESPACE), ignore_errors=True)
        nodes = self.nodes.names()
        for node in nodes:
            self.nodes.reset(node)
            self.cluster.kubectl("taint", "node", node, f"{TAINT_UNHEALTHY}-", check=False)
            self.cluster.kubectl("label", "node", node, f"{LABEL_NODE_HEALTH}-", check=False)
        self.cluster.kubectl(
            "wait", "--for=condition=Ready", *(f"node/{n}" for n in nodes), "--timeout=60s",
            timeout=90,
        )  # fmt: skip

    # ----- watching ----------------------------------------------------------------------

    def _obs(self) -> Observer:
        assert self.observer is not None
        return self.observer

    def snapshot(self) -> Snapshot:
        """The run's status, current pod and heartbeat now; refreshes the progress line."""
        observer = self._obs()
        status = observer.status()
        pod = observer.current_pod()
        beat = pod.heartbeat() if pod else None
        if beat and beat.get("step") is not None:
            self.last_step = int(beat["step"])
        self.checkpoints.observe(status, beat)
        self.display.progress(progress_line(status, beat))
        return Snapshot(status, pod, beat)

    def _wait(self, check: Callable[[], T | None], timeout: float, what: str) -> T:
        """Poll `check` until it returns something; DemoError after `timeout` s.

        A transient API error counts as "not yet"; the operator exiting meanwhile ends the
        wait at once.
        """

        def look() -> T | None:
            try:
                value = check()
            except KubeError as err:
                if not err.transient and err.status != 0:
                    raise
                value = None
            problem = None if value else self.nodes.operator_problem()
            if problem:
                raise DemoError(f"{problem} while waiting for {what}")
            return value

        try:
            return eventually(look, timeout, what, POLL_SECONDS)
        except TimeoutError:
            raise DemoError(f"{what} did not happen within {timeout:.0f} s") from None

    def watch(self, check: Callable[[Snapshot], T | None], timeout: float, what: str) -> T:
        """Poll snapshots until `check` returns something; DemoError after `timeout`.

        The error says where the run stands then: its phase and its last failure.
        """
        try:
            return self._wait(lambda: check(self.snapshot()), timeout, what)
        except DemoError as err:
            status = self._obs().status()
            failure = status.get("lastFailure") or {}
            where = f"the run is {status.get('phase') or 'without a status'}"
            if failure:
                where += (
                    f", its last failure {failure.get('cause')} on {failure.get('node')}: "
                    f"{evidence_reason(failure)}"
                )
            raise DemoError(f"{err}; {where}") from None

    def _trainer_alive(self, snap: Snapshot) -> bool:
        return snap.beat is not None and self.nodes.trainer_alive(snap.beat)

    def _new_failure(
        self, previous: dict[str, Any] | None, causes: tuple[str, ...]
    ) -> Callable[[Snapshot], dict[str, Any] | None]:
        def check(snap: Snapshot) -> dict[str, Any] | None:
            failure = snap.status.get("lastFailure")
            if failure and failure != previous and failure.get("cause") in causes:
                return dict(failure)
            return None

        return check

    # ----- the two failures ----------------------------------------------------------------

    def silent_death(self) -> Recovery:
        """SIGKILL the trainer: detected as Dead, restarted in place from L1."""
        say = self.display.say
        every = self.every_steps

        def ready(snap: Snapshot) -> Snapshot | None:
            beat = snap.beat or {}
            ok = (
                (beat.get("last_checkpoint_step") or 0) >= 2 * every
                and snap.status.get("verdict") == Verdict.HEALTHY.value
                and self._trainer_alive(snap)
            )
            return snap if ok else None

        snap = self.watch(ready, TRAINING_TIMEOUT, "training with two L1 checkpoints")
        assert snap.pod is not None
        pod = snap.pod
        say(f"training on {pod.node} (pod {pod.name}); two checkpoints saved, verdict Healthy")
        previous = snap.status.get("lastFailure")
        starts = len(pod.start_steps())
        before = _just_written(pod)
        pid, step = int(before["pid"]), int(before["step"])
        say(f"1. silent death: SIGKILL the trainer (pid {pid}) at step {step}")
        killed = time.monotonic()
        self.nodes.kill_trainer(pod.name, NAMESPACE, pid)
        dead = self._new_failure(previous, (Verdict.DEAD.value,))

        def detected(snap: Snapshot) -> dict[str, Any] | None:
            nonlocal step
            # The dead trainer's last heartbeat: the step it reached before the signal landed.
            if snap.beat and snap.beat.get("pid") == pid:
                step = max(step, int(snap.beat.get("step") or 0))
            return dead(snap)

        failure = self.watch(
            detected, DETECT_TIMEOUT, "detection of the silent death (Dead in the run's status)"
        )
        detect_s = time.monotonic() - killed
        say(f"   detected in {detect_s:.1f} s: {failure['cause']} ({evidence_reason(failure)})")

        def resumed(snap: Snapshot) -> Snapshot | None:
            beat = snap.beat or {}
            if snap.pod is None or snap.pod.uid != pod.uid or beat.get("pid") in (None, pid):
                return None
            restarts = snap.pod.start_steps()
            if len(restarts) <= starts or (beat.get("step") or 0) <= restarts[-1]:
                return None
            return snap

        after = self.watch(resumed, RECOVERY_TIMEOUT, "the trainer training again in place")
        resume_s = time.monotonic() - killed
        assert after.pod is not None and after.beat is not None
        resumed_step = after.pod.start_steps()[-1]
        # Killed right after a heartbeat write, the trainer was at `step` to within a step; a
        # checkpoint committed in that moment is the step it had reached at least.
        step = max(step, resumed_step)
        say(
            f"   resumed in place in {resume_s:.1f} s: same pod on {after.pod.node}, new trainer "
            f"(pid {after.beat['pid']}) from the L1 checkpoint of step {resumed_step}, "
            f"{step - resumed_step} steps lost"
        )
        return Recovery(
            scenario="silent-death",
            cause=str(failure["cause"]),
            detect_s=round(detect_s, 2),
            resume_s=round(resume_s, 2),
            steps_lost=step - resumed_step,
            step_at_failure=step,
            resumed_step=resumed_step,
            from_layer="l1",
            node_before=pod.node,
            node_after=after.pod.node,
            attempt_before=int(snap.status.get("attempt") or 1),
            attempt_after=int(after.status.get("attempt") or 1),
        )

    def ghost_memory(self, after_step: int) -> Recovery:
        """Ghost VRAM and a dead trainer: taint, exclude, reschedule, restore from remote.

        It waits until the remote layer holds a checkpoint two intervals past `after_step`
        (the previous failure): a failure at nearly the same step would be a pattern
        (`recovery.sameStepWindow`), which stops the run rather than moving it.
        """
        say = self.display.say
        wanted = after_step + 2 * self.every_steps

        def ready(snap: Snapshot) -> Snapshot | None:
            shipped = any(
                layer.get("layer") != L1
                and layer.get("verified")
                and (layer.get("step") or 0) >= wanted
                for layer in snap.status.get("checkpoints") or []
            )
            healthy = snap.status.get("verdict") == Verdict.HEALTHY.value
            return snap if shipped and healthy and self._trainer_alive(snap) else None

        snap = self.watch(
            ready, TRAINING_TIMEOUT, f"a verified checkpoint of step {wanted} in the remote layer"
        )
        assert snap.pod is not None and snap.beat is not None
        pod, node = snap.pod, snap.pod.node
        remote = [c for c in snap.status["checkpoints"] if c.get("layer") != L1]
        say(
            "training continues; remote layer "
            + ", ".join(f"{c['layer']} holds verified step {c.get('step')}" for c in remote)
        )
        previous = snap.status.get("lastFailure")
        attempt = int(snap.status.get("attempt") or 1)
        beat = _just_written(pod) or snap.beat
        pid, highest = int(beat["pid"]), int(beat["step"])
        self.nodes.inject_ghost(node, GHOST_MIB)
        say(
            f"2. ghost VRAM: {node}'s GPU keeps {GHOST_MIB} MiB no process holds; "
            f"SIGKILL the trainer (pid {pid}) at step {highest}"
        )
        killed = time.monotonic()
        self.nodes.kill_trainer(pod.name, NAMESPACE, pid)
        seen: list[dict[str, Any]] = []

        def detected(snap: Snapshot) -> dict[str, Any] | None:
            nonlocal highest
            if snap.pod is not None and snap.pod.uid == pod.uid and snap.beat:
                highest = max(highest, int(snap.beat.get("step") or 0))
            failure = snap.status.get("lastFailure")
            if failure and failure != previous and failure not in seen:
                seen.append(failure)
                if failure.get("cause") not in GHOST_CAUSES:
                    say(f"   {failure.get('cause')} first ({evidence_reason(failure)})")
            return self._new_failure(previous, GHOST_CAUSES)(snap)

        failure = self.watch(
            detected, DETECT_TIMEOUT + 30.0,
            f"detection of the ghost memory on {node} (GhostMemory or GPUMemoryNotReleased)",
        )  # fmt: skip
        detect_s = time.monotonic() - killed
        say(f"   detected in {detect_s:.1f} s: {failure['cause']} ({evidence_reason(failure)})")
        deadline = killed + RECOVERY_TIMEOUT

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        def tainted() -> str | None:
            found = self._obs().node(node) or {}
            for taint in found.get("spec", {}).get("taints") or []:
                if taint.get("key") == TAINT_UNHEALTHY:
                    return f"{taint['key']}={taint.get('value', '')}:{taint.get('effect')}"
            return None

        taint = self.watch(lambda _: tainted(), left(), f"the taint {TAINT_UNHEALTHY} on {node}")
        say(f"   node {node} tainted ({taint})")

        def excluded(snap: Snapshot) -> dict[str, Any] | None:
            for entry in snap.status.get("excludedNodes") or []:
                if entry.get("node") == node:
                    return dict(entry)
            return None

        entry = self.watch(excluded, left(), f"{node} in the run's status.excludedNodes")
        say(f"   {node} excluded from the run ({entry.get('reason')})")

        def moved(snap: Snapshot) -> Snapshot | None:
            ok = snap.pod is not None and snap.pod.uid != pod.uid and snap.pod.node != node
            return snap if ok else None

        moved_to = self.watch(moved, left(), "a new pod of the run bound to another node")
        assert moved_to.pod is not None
        new_pod = moved_to.pod
        say(
            f"   rescheduled: attempt {moved_to.status.get('attempt') or '-'} on {new_pod.node} "
            f"(pod {new_pod.name})"
        )
        record = self.watch(
            lambda _: new_pod.restore(), left(), f"the restore step on {new_pod.node}"
        )
        restored_step = record.get("step")
        from_layer = str(record.get("from_layer") or "none")
        if restored_step is None:
            raise DemoError(f"the restore step on {new_pod.node} found no checkpoint: {record}")
        say(f"   restored step {restored_step} from layer {from_layer!r} (verified)")

        def training(snap: Snapshot) -> Snapshot | None:
            beat = snap.beat or {}
            same = snap.pod is not None and snap.pod.uid == new_pod.uid
            return snap if same and (beat.get("step") or 0) > int(restored_step) else None

        after = self.watch(training, left(), f"training on {new_pod.node} past the restored step")
        resume_s = time.monotonic() - killed
        assert after.beat is not None
        say(f"   training continues on {new_pod.node} at step {after.beat['step']}")
        return Recovery(
            scenario="ghost-memory",
            cause=str(failure["cause"]),
            detect_s=round(detect_s, 2),
            resume_s=round(resume_s, 2),
            steps_lost=max(0, highest - int(restored_step)),
            step_at_failure=highest,
            resumed_step=int(restored_step),
            from_layer=from_layer,
            node_before=node,
            node_after=new_pod.node,
            attempt_before=attempt,
            attempt_after=int(after.status.get("attempt") or attempt + 1),
        )

    # ----- the end ---------------------------------------------------------------------------

    def summary(self, recoveries: list[Recovery], started: float) -> dict[str, Any]:
        """The demo's figures, as `--json` prints them."""
        status = self._obs().status()
        self.checkpoints.observe(status)
        return {
            "cluster": self.cluster.name,
            "kubeconfig": str(self.cluster.kubeconfig),
            "namespace": NAMESPACE,
            "run": RUN,
            "checkpoint_every_steps": self.every_steps,
            "recoveries": [asdict(r) for r in recoveries],
            "totals": {
                "recoveries": len(recoveries),
                "max_detect_s": max((r.detect_s for r in recoveries), default=None),
                "max_resume_s": max((r.resume_s for r in recoveries), default=None),
                "steps_lost": sum(r.steps_lost for r in recoveries),
                "checkpoints_verified": self.checkpoints.counts(),
                "final_step": self.last_step,
                "restarts": status.get("restarts"),
                "excluded_nodes": [e.get("node") for e in status.get("excludedNodes") or []],
                "wall_s": round(time.monotonic() - started, 1),
            },
        }

    def suspend(self) -> None:
        """Suspend the run (the operator flushes and stops its pod); keep its history."""
        patch = json.dumps({"spec": {"suspend": True}})
        self.cluster.kubectl(
            "patch", "trainingruns", RUN, "-n", NAMESPACE, "--type=merge", "-p", patch
        )
        self._wait(
            lambda: not self._obs().pods(), SUSPEND_TIMEOUT, "the suspended run's pod to stop"
        )

    def abandon(self) -> None:
        """Delete the run (garbage collection removes its pod); for Ctrl-C and failures."""
        if self.run_applied:
            self.cluster.kubectl(
                "delete", "trainingruns", RUN, "-n", NAMESPACE, "--ignore-not-found",
                "--wait=false", check=False,
            )  # fmt: skip

    def stop_operator(self) -> None:
        """Stop a local operator (idempotent); an in-cluster one stays."""
        self.nodes.stop_operator()


def summary_table(summary: dict[str, Any]) -> str:
    """The summary as a terminal table."""
    every = summary["checkpoint_every_steps"]
    rows = [("#", "failure", "cause", "detected", "resumed", "steps lost", "from", "node")]
    for i, r in enumerate(summary["recoveries"], 1):
        where = (
            f"{r['node_before']} (in place)"
            if r["node_before"] == r["node_after"]
            else f"{r['node_before']} -> {r['node_after']}"
        )
        rows.append(
            (
                str(i), r["scenario"], r["cause"], f"{r['detect_s']:.1f} s",
                f"{r['resume_s']:.1f} s", f"{r['steps_lost']} (<= {every})",
                r["from_layer"], where,
            )
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    totals = summary["totals"]
    verified = ", ".join(f"{k} {v}" for k, v in totals["checkpoints_verified"].items()) or "none"
    lines.append("")
    lines.append(f"verified checkpoints seen per layer: {verified}")
    lines.append(
        f"final step {totals['final_step']}, restarts {totals['restarts']}, excluded nodes: "
        f"{', '.join(totals['excluded_nodes']) or 'none'}; demo took {totals['wall_s']} s"
    )
    return "\n".join(lines)


def _just_written(pod: PodView) -> dict[str, Any]:
    """The pod's heartbeat right after its next write (it is written about once a second).

    Killing the trainer then, the step at its death is known to within a step: the step count
    of a stale heartbeat would understate it by up to a second of training.
    """
    first = pod.heartbeat()

    def written() -> dict[str, Any] | None:
        beat = pod.heartbeat()
        return beat if beat and beat != first else None

    try:
        return eventually(written, HEARTBEAT_WAIT_S, "the next heartbeat", 0.01)
    except TimeoutError:
        return first or {}


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="trainguard demo",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="The cluster stays up by default (--keep); stop it later with "
        "`trainguard dev cluster down --name <name>`.",
    )
    parser.add_argument(
        "--name",
        help=f"cluster name (default: {DEMO_CLUSTER}, with --real-nodes {DEMO_REAL_CLUSTER})",
    )
    parser.add_argument(
        "--real-nodes", action="store_true",
        help="run on two real nodes (kubelet, containerd, runc; needs root) with the images "
        "built here and trainguard installed in-cluster from its Helm chart",
    )  # fmt: skip
    end = parser.add_mutually_exclusive_group()
    end.add_argument("--keep", action="store_true", help="leave the cluster up (the default)")
    end.add_argument("--down", action="store_true", help="tear the cluster down at the end")
    parser.add_argument(
        "--json", action="store_true",
        help="non-interactive: print only the summary, one JSON object, on stdout",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Entry point of `trainguard demo`."""
    args = parse_args(argv)
    try:
        cluster = Cluster(args.name or (DEMO_REAL_CLUSTER if args.real_nodes else DEMO_CLUSTER))
    except ValueError as err:
        print(f"trainguard demo: {err}", file=sys.stderr)
        return 2
    display = Display(sys.stderr if args.json else sys.stdout)
    nodes: Nodes = RealNodes(cluster) if args.real_nodes else ProcessNodes(cluster)
    demo = Demo(nodes, display)
    started = time.monotonic()
    code = 1
    try:
        demo.setup()
        death = demo.silent_death()
        recoveries = [death, demo.ghost_memory(after_step=death.step_at_failure)]
        summary = demo.summary(recoveries, started)
        display.say("suspending the run (its status and Events stay for kubectl)")
        demo.suspend()
        code = 0
    except KeyboardInterrupt:
        display.text("\ninterrupted: stopping the operator and deleting the run")
        demo.abandon()
        code = 130
    except (DemoError, ClusterError, KubeError) as err:
        display.text(f"\ntrainguard demo: {err}")
        log = nodes.operator_log()
        if log:
            display.text(f"operator log: {log}")
        for pod in demo.observer.pods() if demo.observer is not None else []:
            display.text(f"pod {pod.name} on {pod.node}: logs in {pod.files.logs}")
        demo.abandon()
    finally:
        demo.stop_operator()
        if args.down:
            cluster.down(purge=True)
            display.text(f"cluster {cluster.name!r} torn down")
    if code != 0:
        return code
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    display.text()
    display.text(f"On {nodes.description}:")
    display.text(summary_table(summary))
    display.text()
    if not args.down:
        display.text("The cluster is still up:")
        display.text(f"  export KUBECONFIG={cluster.kubeconfig}")
        display.text(f"  {cluster.bin_dir / 'kubectl'} describe tr {RUN} -n {NAMESPACE}")
        display.text(f"  .venv/bin/trainguard status {RUN} -n {NAMESPACE}")
        display.text(f"Stop it with: .venv/bin/trainguard dev cluster down --name {cluster.name}")
    return 0
