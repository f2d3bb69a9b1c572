"""`trainguard agent`: the native sidecar that watches the trainer by absence.

Every `monitor.intervalSeconds`, and at once when the supervisor's state changes (a death, a
restart: `trainguard.agent.wake`), it collects the signals, classifies a verdict and renews the
run's heartbeat Lease with the verdict and compact evidence (annotations under 1 KiB). A
changed verdict renews at once and becomes an Event. On `Hung` it has the trainer's stacks
dumped (the harness's faulthandler signal) into its log and an Event, and the training process
killed so the supervisor restarts it in place (`trainguard.agent.stopping`: through the
supervisor, since the agent runs as another user); a kill that did not happen is an Event too.
The killed trainer stays `Hung` until its successor is watched (`AFTER_KILL`): one hang, one
failure.
Every restore record (`restore.json`: the restore step's at the pod's start, the harness's
when a restarted trainer resumed from elsewhere, e.g. from L0) is a `Restored` Event and the
Lease's `trainguard.dev/restored`; the Lease also carries L0's newest checkpoint beside the
remote layers' states. Every invalid checkpoint the restore step, the shipper or the harness
found is a Warning Event `InvalidCheckpoint`, once, and the Lease carries how many per layer
and the last one (`trainguard.agent.findings`). A gang member's agent also carries the restart
generation its verdict is about (`trainguard.dev/verdict-generation`, from the supervisor's
state) and hands the generation the operator orders on its Lease to the supervisor
(`gang.json`: `trainguard.operator.policies.gang`). When the API is unreachable it keeps
monitoring and retries with back-off: the agent never crash-loops.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from trainguard.agent.findings import Told, event_message
from trainguard.agent.shipper import Shipper
from trainguard.agent.signals import Collector, newest_saved_step
from trainguard.agent.stopping import stop_hung
from trainguard.agent.verdicts import (
    DEAD,
    HEALTHY,
    HUNG,
    SLOW,
    UNKNOWN,
    Thresholds,
    Verdict,
    classify,
)
from trainguard.agent.wake import StateFileWake
from trainguard.api import constants
from trainguard.contract import env, reports
from trainguard.contract.env import PodEnv
from trainguard.contract.files import (
    HEARTBEAT_INTERVAL_S,
    RESTORE_FILENAME,
    RestoreReport,
    read_gang_generations,
    read_restore_report,
    share_with_pod,
    write_gang_order,
)
from trainguard.contract.findings import Finding
from trainguard.layers import LayerConfig, open_layer
from trainguard.layers.lineage import Lineage, Origin

ANNOTATION_LAYERS = constants.ANNOTATION_LAYERS
ANNOTATION_RESTORED = constants.ANNOTATION_RESTORED
ANNOTATION_INVALID_CHECKPOINTS = constants.ANNOTATION_INVALID_CHECKPOINTS
ANNOTATION_LIMIT = 1000  # bytes of evidence JSON; all annotations stay well under 1 KiB
# The per-layer report: up to 8 layers with 63-character names fit (state, steps, counts) in it.
LAYERS_ANNOTATION_LIMIT = 2000
MAX_BACKOFF_S = 30.0
KILL_RETRY_S = 30.0  # a hung trainer that could not be killed is tried again after this
# What the verdict on a trainer this agent had killed for hanging may say until its successor
# is watched, all of it that hang's, not news: absence (the kill itself), and alive or even
# advancing (the kill is asynchronous: a process still exiting at the next look, after the
# steps a SIGSTOPped trainer takes once continued for its stack dump). Each is kept `Hung`,
# with the hang's start, so one hang is one failure for the operator (a Healthy in between
# would make the Hung that follows a new failure at nearly the same step:
# RepeatedFailureAtStep after a single hang). Node verdicts (memory, I/O) are news, kept.
# Settled here because only the agent knows which trainer it had killed: the supervisor cannot
# dump a stopped process's stacks without letting it run (faulthandler runs in the process;
# ptrace is not granted under the restricted profile), and the operator sees verdicts, not PIDs.
AFTER_KILL = frozenset({HEALTHY, SLOW, DEAD})
STACK_EVENT_BYTES = 900  # an Event message stays under 1 KiB
FRAME_FILE = re.compile(r'File "([^"]+)"')
STDLIB_MARK = "/lib/python3"
LOG_PREFIX = "trainguard-agent"


def log(message: str) -> None:
    """One line to the agent's log (stdout), with a wall-clock time."""
    print(f"{time.strftime('%H:%M:%S')} {LOG_PREFIX}: {message}", flush=True)


def compact_evidence(verdict: Verdict) -> str:
    """The verdict's reason and evidence as JSON, cut to fit an annotation."""
    data = {"reason": verdict.reason, **verdict.evidence}
    text = json.dumps(data, separators=(",", ":"))
    while len(text.encode()) > ANNOTATION_LIMIT and len(data["reason"]) > 20:
        data["reason"] = data["reason"][: len(data["reason"]) // 2] + "..."
        text = json.dumps(data, separators=(",", ":"))
    return text


def layers_report(states: dict[str, dict[str, Any]]) -> tuple[str, dict[str, dict[str, Any]]]:
    """The shipper's per-layer states as the Lease's JSON, and the states it holds.

    Bounded by construction, never cut mid-JSON: over the limit, error messages are shortened
    and then dropped, then the byte counts; every layer's state, steps and counts always stay.
    """
    layers = {
        name: {k: v for k, v in state.items() if v is not None and k != "at"}
        for name, state in states.items()
    }

    def text() -> str:
        return json.dumps(layers, separators=(",", ":"))

    for budget in (200, 80, 0):
        if len(text().encode()) <= LAYERS_ANNOTATION_LIMIT:
            break
        for state in layers.values():
            if "error" in state:
                state["error"] = str(state["error"])[:budget]
                if not budget:
                    del state["error"]
    if len(text().encode()) > LAYERS_ANNOTATION_LIMIT:
        for state in layers.values():
            state.pop("bytes_done", None)
            state.pop("bytes_total", None)
    return text(), layers


def _frame_path(match: re.Match[str]) -> str:
    parts = match.group(1).split("/")
    return 'File "' + ("/".join(["...", *parts[-2:]]) if len(parts) > 3 else match.group(1)) + '"'


def _runs_module(block: str) -> bool:
    # The main thread is the one whose outermost frame runs a module. faulthandler's "Current
    # thread" is only the thread the dump signal landed on: any thread, a saver's as often.
    return "in <module>" in block


def _is_current(block: str) -> bool:
    return block.startswith("Current thread")


def _is_library(block: str) -> bool:
    # Threads whose every frame is in the standard library (pools, timers) say least.
    files = FRAME_FILE.findall(block)
    return all(STDLIB_MARK in f and "site-packages" not in f for f in files)


def shorten_dump(dump: str) -> str:
    """A stack dump cut to fit an Event, the frames that matter first (marked when cut).

    Thread blocks in this order: the main thread (the training loop), then threads running
    code outside the standard library, then the rest; file paths keep their last two parts.
    """
    blocks = [b.strip("\n") for b in dump.split("\n\n") if b.strip()]
    blocks.sort(key=lambda b: (not _runs_module(b), _is_library(b), not _is_current(b)))
    text = "\n\n".join(FRAME_FILE.sub(_frame_path, b) for b in blocks) + "\n"
    data = text.encode()
    if len(data) <= STACK_EVENT_BYTES:
        return text
    marker = "(truncated) ...\n"
    keep = STACK_EVENT_BYTES - len(marker)
    return data[:keep].decode(errors="ignore") + marker


def _fit(message: str) -> str:
    """A message cut to fit an Event (under 1 KiB), marked when cut."""
    data = message.encode()
    if len(data) <= STACK_EVENT_BYTES:
        return message
    return data[: STACK_EVENT_BYTES - 4].decode(errors="ignore") + " ..."


def since_text(wall: float) -> str:
    """A wall-clock time as the Lease's verdict-since annotation (RFC 3339, UTC, µs)."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Agent:
    """The monitoring loop of one training pod."""

    def __init__(
        self, environ: dict[str, str], client: Any, shipper: Shipper | None = None
    ) -> None:
        self.environ = environ
        self.pod = PodEnv.from_env(environ)
        self.client = client
        self.shipper = shipper
        self.pending_events: list[tuple[str, str, bool]] = []
        self.told = Told()  # the invalid checkpoints told of
        self.restored = ""  # the restore record's summary (JSON), once there is one
        self.restore_report: RestoreReport | None = None
        self.note_restore()
        # The API's own model: the same defaults and bounds as the CRD.
        monitor = self.pod.monitor
        self.interval = float(monitor.interval_seconds)
        # Each rank of the pod is a trainer process of the same command line.
        self.thresholds = dataclasses.replace(
            Thresholds.from_monitor(monitor), expected_processes=self.pod.procs_per_node
        )
        self.lease_duration = int(monitor.lease_duration_seconds)
        self.flush_timeout = self.pod.flush_timeout_seconds
        marker = f"{env.L1_DIR}={self.pod.l1_dir}".encode()
        self.collector = Collector(
            heartbeat_file=self.pod.heartbeat,
            gpu_file=self.pod.gpu,
            l1_dir=self.pod.l1_dir,
            log_file=self.pod.log_file,
            marker=marker,
            gpu_stale_s=max(5.0, 5 * self.interval),
            released_mib=self.thresholds.released_mib,
            supervisor_file=self.pod.supervisor_file,
            rank_heartbeats=self.pod.rank_heartbeats,
            report_lag_s=HEARTBEAT_INTERVAL_S + self.interval,
        )
        self.verdict: Verdict | None = None
        self.killed_pid: int | None = None  # a hung trainer whose kill is confirmed
        self.stop_tried: dict[int, float] = {}  # hung trainers and when stopping them was tried
        self.verdict_since = ""
        self.since_pid: int | None = None  # the trainer the current verdict is about
        self.backoff = 0.0
        self.next_api_try = 0.0
        self.reporting: dict[str, dict[str, Any]] = {}  # the layer states of the renewal under way
        # The supervisor rewrites its state file the moment its child ends: the next look
        # follows at once, not at the next interval.
        self.wake = StateFileWake(self.pod.supervisor_file)
        self.gang_generation: int | None = None  # the order last written to `gang.json`

    def note_restore(self) -> None:
        """Tell each restore record once it is there: the restore step's, then the harness's.

        The agent is a native sidecar: it starts before the restore step has run; a trainer
        restarted in place that resumed from another checkpoint (L0) leaves a new record.
        """
        report = read_restore_report(self.pod.report_file(RESTORE_FILENAME))
        if report is None or report == self.restore_report:
            return
        self.restore_report = report
        self.restored = json.dumps(report.summary(), separators=(",", ":"), sort_keys=True)
        log(report.line())
        self.pending_events.append(("Restored", report.line(), False))
        if report.fenced:
            fenced = "; ".join(report.fenced)
            log(f"restore ignored fenced checkpoints: {fenced}")
            message = f"restore ignored what superseded attempts shipped after a fence: {fenced}"
            self.pending_events.append(("FencedCheckpointsIgnored", _fit(message), True))
        self.note_findings(report.findings)

    def note_findings(self, findings: Iterable[Finding]) -> None:
        """Tell each invalid checkpoint not told yet: a log line and a Warning Event."""
        for finding in self.told.news(findings):
            message = event_message(finding)
            log(message)
            reason = constants.Reason.INVALID_CHECKPOINT.value
            self.pending_events.append((reason, _fit(message), True))

    def step(self) -> Verdict:
        """Observe, classify, act on Hung, report."""
        self.note_restore()
        now = time.monotonic()
        signals = self.collector.collect(now, time.time())
        self.note_findings(self.collector.findings)
        if self.shipper is not None:
            self.note_findings(self.shipper.take_findings())
        verdict = classify(signals, self.thresholds)
        pid = self.collector.pid
        if verdict.name in AFTER_KILL and pid is not None and pid == self.killed_pid:
            verdict = Verdict(
                HUNG, f"hung trainer pid {pid} killed; waiting for its restart", verdict.evidence
            )
        changed = self.verdict is None or verdict.name != self.verdict.name
        # A restarted trainer that died before this agent saw it alive is a new death.
        changed = changed or (verdict.name == DEAD and pid != self.since_pid)
        if changed:
            self.verdict_since = since_text(time.time())
            self.since_pid = pid
            log(f"verdict {verdict.name}: {verdict.reason}")
            if verdict.name not in (HEALTHY, UNKNOWN):
                self.pending_events.append((f"Verdict{verdict.name}", verdict.reason, True))
        self.verdict = verdict
        if verdict.name == HUNG and pid is not None and self._should_stop(pid, now):
            # The verdict reaches the Lease before the kill.
            self.report(verdict, force=True)
            self.stop_hung(pid, verdict, now)
            return verdict
        self.report(verdict, force=changed)
        return verdict

    def _should_stop(self, pid: int, now: float) -> bool:
        if pid == self.killed_pid:
            return False
        tried = self.stop_tried.get(pid)
        return tried is None or now - tried >= KILL_RETRY_S

    def stop_hung(self, pid: int, verdict: Verdict, now: float) -> None:
        """Dump the hung trainer's stacks and kill it; record the kill only once it happened."""
        first_try = pid not in self.stop_tried
        self.stop_tried[pid] = now
        result = stop_hung(self.pod, pid, verdict.reason)
        if first_try or result.dump:
            dump = result.dump or "(no stack dump: the trainer did not answer SIGUSR1)"
            log(f"stacks of hung trainer pid {pid}:\n{dump}")
            self.pending_events.append(("HungTrainerStacks", shorten_dump(dump), True))
        if result.killed:
            self.killed_pid = pid
            log(f"hung trainer pid {pid} {result.how}; the supervisor restarts it in place")
        else:
            message = f"hung trainer pid {pid} not killed: {result.how}"
            log(message)
            self.pending_events.append(("HungTrainerNotKilled", message, True))
        self.report(verdict, force=True)

    def verdict_generation(self, verdict: Verdict) -> int | None:
        """A gang member's: the restart generation of the launch the verdict is about.

        The failed launch's for Dead (the supervisor may run the next one already), the
        running one's otherwise; None for a one-pod run or where the supervisor says none.
        """
        if self.pod.nnodes == 1:
            return None
        running, failed = read_gang_generations(self.pod.supervisor_file)
        if verdict.name == DEAD and failed is not None:
            return failed
        return running

    def annotations(self, verdict: Verdict) -> dict[str, str]:
        """The Lease annotations for one renewal."""
        saved = newest_saved_step(self.pod.l1_dir)
        extra = {}
        states = {} if self.shipper is None else dict(self.shipper.states())
        if self.pod.l0_dir is not None:
            # L0 is never shipped: its newest checkpoint only, beside the remote layers'.
            states[constants.L0_LAYER] = {"step": newest_saved_step(self.pod.l0_dir)}
        if states:
            extra[ANNOTATION_LAYERS], self.reporting = layers_report(states)
            self.reporting.pop(constants.L0_LAYER, None)
        if self.restored:
            extra[ANNOTATION_RESTORED] = self.restored
        invalid = self.told.annotation()
        if invalid is not None:
            extra[ANNOTATION_INVALID_CHECKPOINTS] = invalid
        # The init steps' progress and results, for the run's status (live during staging).
        extra.update(reports.lease_annotations(self.pod.state_dir, self.pod.attempt))
        generation = self.verdict_generation(verdict)
        if generation is not None:
            extra[constants.ANNOTATION_VERDICT_GENERATION] = str(generation)
        return {
            **extra,
            constants.ANNOTATION_VERDICT: verdict.name,
            constants.ANNOTATION_VERDICT_SINCE: self.verdict_since,
            constants.ANNOTATION_EVIDENCE: compact_evidence(verdict),
            constants.ANNOTATION_STEP: ""
            if self.collector.step is None
            else str(self.collector.step),
            constants.ANNOTATION_SAVED_STEP: "" if saved is None else str(saved),
        }

    def follow_gang(self, stored: object) -> None:
        """Hand the gang's restart generation the operator wrote on the Lease to the supervisor.

        A gang member's only: `gang.json` (`PodEnv.gang_file`) is rewritten when the order
        changes, and written at the first renewal (0 while the operator ordered none), so a
        supervisor that reads none knows that this agent has not renewed yet.
        """
        if self.pod.nnodes == 1 or not isinstance(stored, dict):
            return
        text = stored.get(constants.ANNOTATION_GANG_GENERATION) or "0"
        ordered = int(text) if str(text).isdigit() else None
        if ordered is None or ordered == self.gang_generation:
            return
        write_gang_order(self.pod.gang_file, ordered)
        if ordered:
            log(f"gang restart generation {ordered}: every member restarts its ranks")
        self.gang_generation = ordered

    def report(self, verdict: Verdict, force: bool) -> None:
        """Renew the Lease and send pending Events, backing off while the API is away."""
        now = time.monotonic()
        if now < self.next_api_try and not force:
            return
        try:
            stored = self.client.renew(self.lease_duration, self.annotations(verdict))
            self.follow_gang(stored)
            if self.shipper is not None:
                self.shipper.acknowledge(self.reporting)
            while self.pending_events:
                reason, message, warning = self.pending_events[0]
                self.client.event(reason, message, warning)
                self.pending_events.pop(0)
            self.backoff = 0.0
        except Exception as err:  # any API failure: keep monitoring, retry later
            self.backoff = min(MAX_BACKOFF_S, max(self.interval, self.backoff * 2))
            self.next_api_try = now + self.backoff
            log(f"API unavailable ({err}); retrying in {self.backoff:.0f}s")

    def run(self, stop_after_s: float | None = None) -> None:
        """Loop until SIGTERM (or for `stop_after_s`, in tests)."""
        stopping = False

        def stop(_signum: int, _frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        started = time.monotonic()
        while not stopping:
            tick = time.monotonic()
            try:
                self.step()
            except Exception as err:  # never crash-loop: a bad reading is logged, not fatal
                log(f"monitoring pass failed: {err!r}")
            if stop_after_s is not None and tick - started >= stop_after_s:
                return
            self.wake.wait(self.interval - (time.monotonic() - tick))
        if self.shipper is not None:
            # The pod is being deleted: its emptyDir dies with it, so the newest verified
            # checkpoint goes to a remote layer first (bounded by the grace period).
            flushed = self.shipper.flush(self.flush_timeout)
            log(f"flush before exit: {'done' if flushed else 'not completed'}")
            self.note_findings(self.shipper.take_findings())
            with contextlib.suppress(Exception):
                self.report(self.verdict or classify_unknown(), force=True)


def main(argv: list[str]) -> int:
    """Entry point of `trainguard agent`."""
    parser = argparse.ArgumentParser(prog="trainguard agent", description=__doc__)
    parser.parse_args(argv)
    share_with_pod()
    environ = dict(os.environ)
    from trainguard.agent.kube import AgentApiError, AgentClient, RunRef, keep_credentials_private

    if not keep_credentials_private():
        log("could not make the agent non-dumpable: same-user processes may read its token")

    pod = PodEnv.from_env(environ)
    run = RunRef(
        namespace=pod.namespace,
        name=pod.run_name,
        uid=pod.run_uid,
        api_version=constants.API_VERSION,
        kind=constants.KIND,
    )
    if not run.name:
        print(f"trainguard agent: {env.RUN_NAME} is not set", file=sys.stderr)
        return 2
    holder = pod.pod_name or os.uname().nodename
    while True:
        try:
            client = AgentClient(run, pod.lease, holder)
            break
        except AgentApiError as err:
            log(f"{err}; retrying in 5s")
            time.sleep(5)
    origin = Origin.of(pod.run_uid, pod.attempt)
    layers = [open_layer(LayerConfig.from_spec(layer), environ, origin) for layer in pod.layers]
    lineage = Lineage(origin, pod.fences)
    shipper = Shipper(pod.l1_dir, layers, lineage=lineage) if layers else None
    if shipper is not None:
        shipper.start()
    log(f"watching run {run.namespace}/{run.name} as {holder}; {len(layers)} remote layers")
    Agent(environ, client, shipper).run()
    return 0


def classify_unknown() -> Verdict:
    """A placeholder verdict for a report before any observation."""
    return Verdict(UNKNOWN, "agent stopping")
