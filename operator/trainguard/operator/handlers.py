"""kopf registrations of the operator, and nothing else: each handler hands one run to a cycle.

- `configure` (startup): kopf's settings, the API client, the periodic resync; cycles tell
  the detection latencies they time to `metrics` (importing it registers its watch too).
- `login`: kopf's own connection, with the same credentials as the API client.
- `run_pods` / `runs` (indexes): a run's pods and the runs themselves, kept in memory from
  the watches, so a cycle lists nothing.
- `reconcile_run` (resume, create, spec update): a full cycle, companions re-applied.
- `pod_changed` (any event of a run's pod): a cycle of the owning run, so scheduling,
  node and phase reach the status at once. Events that arrive while a cycle of the run waits
  to start are told by that cycle (it reads the indexes when it starts): a gang of a thousand
  members makes thousands of pod events, not thousands of cycles.
- `run_leases` (index): each run's heartbeat Leases (a gang's one per member) as the agents
  last renewed them.
- `lease_changed` (any event of a heartbeat Lease): a cycle at once when the agent's verdict
  turns to a failure the status does not show yet, or when it carries an init step's report
  (preflight result, staging progress) or an invalid checkpoint the status lacks, or when any
  gang member's agent reports a rank failure that orders a gang restart (`policies.gang`);
  other renewals wait for the resync.

Cycles are `trainguard.operator.k8s.reconcile.reconcile`; they run in a thread pool through
`asyncio.to_thread` (the Kubernetes client blocks), never two at a time for the same run.
A cycle that holds a restart back-off books one more cycle for when it ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import kopf

from trainguard.api import TrainingRunStatus
from trainguard.api.constants import (
    COMPONENT_HEARTBEAT,
    GROUP,
    KIND,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_RUN,
    MANAGED_BY,
    PLURAL,
    VERSION,
)
from trainguard.operator.config import OperatorConfig
from trainguard.operator.k8s.client import Kube, KubeError
from trainguard.operator.k8s.leases import lease_view
from trainguard.operator.k8s.nodehealth import NodeChecks, health_pass
from trainguard.operator.k8s.pods import pod_view
from trainguard.operator.k8s.reconcile import Outcome, Settings, reconcile
from trainguard.operator.metrics import METRICS
from trainguard.operator.policies import findings, gang, initsteps, signals
from trainguard.operator.policies.lifecycle import PodView
from trainguard.operator.policies.signals import LeaseView

log = logging.getLogger(__name__)
OUR_PODS: dict[str, Any] = {
    LABEL_RUN: kopf.PRESENT,
    LABEL_MANAGED_BY: MANAGED_BY,
}
POD_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_RUN}"
OUR_LEASES: dict[str, Any] = {**OUR_PODS, LABEL_COMPONENT: COMPONENT_HEARTBEAT}
LEASE_SELECTOR = f"{POD_SELECTOR},{LABEL_COMPONENT}={COMPONENT_HEARTBEAT}"
LEASES = ("coordination.k8s.io", "v1", "leases")
# Names of the indexes, as kopf passes them to handlers.
RUN_PODS = "run_pods"
RUNS = "runs"
RUN_LEASES = "run_leases"
# kopf's own annotations on a run (retry progress, last handled spec) use our prefix.
ANNOTATION_PREFIX = GROUP
RETRY_DELAY_SECONDS = 5.0
# Nodes trainguard holds (suspect, tainted) are looked at this often: a check's end is seen
# within it. The pass lists only labelled nodes.
NODE_HEALTH_SECONDS = 3.0
WATCH_TIMEOUT_SECONDS = 300
# Pod events of one run start a cycle no sooner than the last one took after its end, up to
# this: a thousand members starting at once (several events each) would otherwise keep the
# operator cycling, and writing the run's status, back to back.
POD_CYCLE_PAUSE_MAX_SECONDS = 1.0


class RunsDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled configuration, built only where a handler of changes reads it.

    kopf builds it for every event of every watched kind, deep-copying the whole body first
    (status and managed fields included) to keep its spec, labels and annotations. Only runs
    have handlers of changes (`reconcile_run`); a pod's or a Lease's is never read, and a
    thousand members starting send thousands of their events. A run's is the same as kopf's,
    built from the fields it keeps, without copying its status (a thousand members' entries).
    """

    def build(
        self,
        *,
        body: kopf.Body,
        extra_fields: Iterable[Any] | None = None,
    ) -> kopf.BodyEssence:
        """A run's essence as kopf builds it; an empty one for every other kind."""
        if body.get("kind") not in (None, KIND):
            return kopf.BodyEssence()
        # The top-level stanza of each extra field ("status.x" or ("status", "x")).
        tops = {(f.split(".") if isinstance(f, str) else list(f))[0] for f in extra_fields or ()}
        kept = {k: v for k, v in body.items() if k not in ("metadata", "status")}
        meta = body.get("metadata") or {}
        if "metadata" in tops:
            kept["metadata"] = meta
        else:
            kept["metadata"] = {k: meta[k] for k in ("labels", "annotations") if k in meta}
        if "status" in tops and "status" in body:
            kept["status"] = body["status"]
        return super().build(body=kopf.Body(cast(kopf.RawBody, kept)), extra_fields=extra_fields)


@kopf.on.startup()
async def configure(*, settings: kopf.OperatorSettings, memo: Any, **kwargs: Any) -> None:
    """Set timeouts and storages, connect, start the resync loop."""
    config: OperatorConfig = memo.get("config") or OperatorConfig.from_env()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = RunsDiffBase(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # our Events tell the story; kopf's only errors
    # Only the operator's own pods travel: the apiserver filters the watch, not this process.
    settings.watching.label_selectors["v1", "pods"] = POD_SELECTOR
    settings.watching.label_selectors["coordination.k8s.io", "leases"] = LEASE_SELECTOR
    settings.watching.server_timeout = WATCH_TIMEOUT_SECONDS
    settings.networking.request_timeout = WATCH_TIMEOUT_SECONDS + 30
    # Cycles block on the client: they run in this pool (asyncio.to_thread), one API
    # connection per thread.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(config.workers, thread_name_prefix="trainguard-cycle")
    )
    memo.kube = await asyncio.to_thread(Kube.connect, config.kubeconfig, config.workers)
    node_checks = NodeChecks(
        config.taint_policy,
        config.node_check_namespace,
        config.agent_image,
        config.node_recheck_seconds,
        instance=config.instance,
    )
    memo.settings = Settings(
        config.agent_image, config.network, config.instance, node_checks, METRICS.detected
    )
    memo.records = RunRecords()
    memo.loop = asyncio.get_running_loop()
    memo.booked = set()
    memo.indexes = (kwargs[RUNS], kwargs[RUN_PODS], kwargs[RUN_LEASES])
    memo.resync = asyncio.create_task(_resync(memo, config.resync_seconds))
    memo.node_health = asyncio.create_task(_node_health(memo, NODE_HEALTH_SECONDS))


SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"
SERVICE_PORT_ENV = "KUBERNETES_SERVICE_PORT"


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account in a cluster, else the kubeconfig (as the operator's client)."""
    info = kopf.login_with_service_account(**kwargs)
    if info is not None:
        return dataclasses.replace(info, server=in_cluster_server(os.environ, info.server))
    return kopf.login_with_kubeconfig(**kwargs)


def in_cluster_server(environ: Mapping[str, str], default: str) -> str:
    """The apiserver's address inside a pod, as client-go's in-cluster config finds it.

    The kubelet puts the `kubernetes` Service's address in every container's environment;
    kopf's own login names it `kubernetes.default.svc`, which only a cluster DNS resolves
    (not a pod with `dnsPolicy: Default`, nor a cluster without DNS).
    """
    host, port = environ.get(SERVICE_HOST_ENV), environ.get(SERVICE_PORT_ENV)
    if not host or not port:
        return default
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@kopf.on.cleanup()
async def stop(*, memo: Any, **_: Any) -> None:
    """Stop the resync and node health loops."""
    memo.resync.cancel()
    memo.node_health.cancel()


@kopf.index("pods", labels=OUR_PODS)
def run_pods(*, body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any) -> object:
    """Pods by (namespace, run): the operator's view of each."""
    view = pod_view(dict(body))
    return {(namespace, labels[LABEL_RUN]): view} if view is not None else None


@kopf.index(GROUP, VERSION, PLURAL)
def runs(*, body: kopf.Body, namespace: str | None, name: str, **_: Any) -> object:
    """Runs by (namespace, name), as last seen."""
    return {(namespace, name): dict(body)}


@kopf.index(*LEASES, labels=OUR_LEASES)
def run_leases(*, body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any) -> object:
    """Heartbeat Leases by (namespace, run): the agents' latest signals (one per gang member)."""
    return {(namespace, labels[LABEL_RUN]): lease_view(dict(body))}


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def reconcile_run(
    *, body: kopf.Body, namespace: str | None, name: str, memo: Any, **kwargs: Any
) -> None:
    """A full cycle; transient API errors retry after a delay, an invalid spec is permanent."""
    pods = _indexed(kwargs, RUN_PODS, (namespace, name))
    try:
        leases = _indexed(kwargs, RUN_LEASES, (namespace, name))
        outcome = await asyncio.to_thread(_cycle, memo, dict(body), pods, leases, True)
    except KubeError as err:
        if err.transient:
            raise kopf.TemporaryError(str(err), delay=RETRY_DELAY_SECONDS) from err
        raise
    if outcome.invalid is not None:
        raise kopf.PermanentError(outcome.invalid)


@kopf.on.event("pods", labels=OUR_PODS)
async def pod_changed(
    *, namespace: str | None, labels: kopf.Labels, memo: Any, **kwargs: Any
) -> None:
    """A cycle of the run that owns the pod (errors are retried by the resync).

    None when a cycle of the run already waits to start: it will see this pod as it is then.
    A cycle waits, after the run's last pod-event cycle ended, as long as that one took (at
    most `POD_CYCLE_PAUSE_MAX_SECONDS`): milliseconds for a one-pod run, while one run's
    storm of events takes at most half the operator's time.
    """
    key = (namespace, labels[LABEL_RUN])
    for body in _indexed(kwargs, RUNS, key):
        record: RunRecord = memo.records.get(body["metadata"]["uid"])
        if record.queued:
            continue
        record.queued = True
        async with record.turn:
            # Events arriving during the pause join this cycle (it is still queued).
            await asyncio.sleep(max(0.0, record.pause_until - time.monotonic()))
            record.queued = False
            started = time.monotonic()
            await _cycle_key(memo, key)
            took = min(time.monotonic() - started, POD_CYCLE_PAUSE_MAX_SECONDS)
            record.pause_until = time.monotonic() + took


@kopf.on.event(*LEASES, labels=OUR_LEASES)
async def lease_changed(
    *, body: kopf.Body, namespace: str | None, labels: kopf.Labels, memo: Any, **kwargs: Any
) -> None:
    """A cycle of the run at once when the agent reports a failure the status does not show.

    Also when it carries an init step's report or an invalid checkpoint the status lacks, and
    when any gang member's agent reports a rank failure no gang restart covers yet.
    """
    key = (namespace, labels[LABEL_RUN])
    lease = lease_view(dict(body))
    for run in _indexed(kwargs, RUNS, key):
        status = memo.records.get(run["metadata"]["uid"]).last_status(run)
        name = run["metadata"]["name"]
        # A rank failure on any member orders a gang restart at once; a member's other news
        # (other than member 0's) reaches the status at the resync.
        ordering = bool(gang.failing(name, status.attempt, [lease], gang.generation(status)))
        if lease.member and not ordering:
            continue
        news = initsteps.news(name, lease, status) or findings.news(name, lease, status)
        if ordering or signals.urgent(lease, status) or news:
            pods = _indexed(kwargs, RUN_PODS, key)
            leases = _indexed(kwargs, RUN_LEASES, key)
            await asyncio.to_thread(_cycle_logged, memo, run, pods, leases)


def _split(leases: Iterable[LeaseView]) -> tuple[LeaseView | None, tuple[LeaseView, ...]]:
    """The run's own Lease (a gang's member 0's) and a gang's other members'."""
    own = [lease for lease in leases if not lease.member]
    return (own[0] if own else None), tuple(lease for lease in leases if lease.member)


def _indexed(indices: dict[str, Any], index: str, key: tuple[str | None, str]) -> list[Any]:
    # kopf passes each index as a keyword argument named after its function. The copy is
    # taken here, on the event loop that updates the indexes, before a cycle's thread runs.
    return list(indices[index].get(key, []))


def _cycle(
    memo: Any,
    body: dict[str, Any],
    pods: Iterable[PodView],
    leases: Iterable[LeaseView],
    full: bool,
) -> Outcome:
    record: RunRecord = memo.records.get(body["metadata"]["uid"])
    lease, members = _split(list(leases))
    with record.lock:
        outcome = reconcile(
            memo.kube, body, list(pods), memo.settings, full, record.status, lease, members
        )
        record.status = outcome.status
        if outcome.retry_after is not None and not record.due:
            # A restart back-off ends without any watch event: the cycle is booked for then.
            record.due = True
            meta = body["metadata"]
            key = (meta.get("namespace"), meta["name"])
            memo.loop.call_soon_threadsafe(_book, memo, key, record, outcome.retry_after)
        return outcome


def _book(memo: Any, key: tuple[str | None, str], record: RunRecord, delay: float) -> None:
    task = asyncio.create_task(_cycle_later(memo, key, record, delay))
    memo.booked.add(task)  # held until done: the loop keeps only weak references
    task.add_done_callback(memo.booked.discard)


async def _cycle_later(
    memo: Any, key: tuple[str | None, str], record: RunRecord, delay: float
) -> None:
    await asyncio.sleep(delay)
    record.due = False
    await _cycle_key(memo, key)


async def _cycle_key(memo: Any, key: tuple[str | None, str]) -> None:
    """A cycle of one run from the indexes as they are now."""
    runs, run_pods, run_leases = memo.indexes
    for body in list(runs.get(key, [])):
        pods = list(run_pods.get(key, []))
        leases = list(run_leases.get(key, []))
        await asyncio.to_thread(_cycle_logged, memo, body, pods, leases)


def _cycle_logged(
    memo: Any, body: dict[str, Any], pods: Iterable[PodView], leases: Iterable[LeaseView]
) -> None:
    try:
        _cycle(memo, body, pods, leases, full=False)
    except Exception:
        meta = body.get("metadata", {})
        log.exception("cycle of %s/%s failed", meta.get("namespace"), meta.get("name"))


async def _resync(memo: Any, every: float) -> None:
    runs: kopf.Index[Any, dict[str, Any]] = memo.indexes[0]
    while True:
        await asyncio.sleep(every)
        try:
            for key in list(runs):
                await _cycle_key(memo, key)
            memo.records.forget_all_but(
                {b["metadata"]["uid"] for k in list(runs) for b in runs.get(k, [])}
            )
        except Exception:  # the loop must outlive any one bad pass
            log.exception("resync pass failed")


async def _node_health(memo: Any, every: float) -> None:
    """Suspect and tainted nodes: their checks started, read, acted on (`k8s.nodehealth`)."""
    held: frozenset[str] = frozenset()
    while True:
        await asyncio.sleep(every)
        try:
            held = await asyncio.to_thread(health_pass, memo.kube, memo.settings.node_checks, held)
        except Exception:  # the loop must outlive any one bad pass
            log.exception("node health pass failed")


class RunRecord:
    """What the operator remembers of one run: its lock, the status it wrote last, a booking."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.status: TrainingRunStatus | None = None
        self.due = False  # a cycle is booked (the end of a restart back-off)
        # Pod events: one cycle at a time takes its turn (on the event loop), and while one
        # waits for it (`queued`), later events add none.
        self.turn = asyncio.Lock()
        self.queued = False
        self.pause_until = 0.0  # monotonic: the next pod-event cycle starts no sooner

    def last_status(self, body: dict[str, Any]) -> TrainingRunStatus:
        """The status this operator wrote last, else the run's as watched."""
        return self.status or TrainingRunStatus.from_object(body.get("status") or {})


class RunRecords:
    """One record per run, so two cycles of the same run never interleave."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._records: dict[str, RunRecord] = {}

    def get(self, uid: str) -> RunRecord:
        """The run's record (created on first use)."""
        with self._guard:
            return self._records.setdefault(uid, RunRecord())

    def forget_all_but(self, uids: set[str]) -> None:
        """Drop the records of runs that are gone."""
        with self._guard:
            for uid in set(self._records) - uids:
                del self._records[uid]
