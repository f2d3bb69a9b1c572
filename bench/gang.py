"""Gang benchmark: a gang of N members on kwok nodes, how fast it runs and how fast it mends.

Starts a local control plane of its own (or uses `--cluster NAME`, started with
`trainguard dev cluster up --name NAME`), installs the CRD and, per gang size (`--members`,
default 128 and 1024), adds N + `--spare` (default 1) kwok GPU nodes of its own (labelled, so
the gang lands there and nowhere else; each member asks for a whole node's 8 GPUs, so one
member per node), starts `trainguard operator` on a fresh namespace and creates one TrainingRun
with `spec.trainer.nodes: N` (examples/minimal.yaml). It measures:

- `all_running_s`: from the creation of the run to the moment every member pod is Running;
- `status_ready_s`: until the run's status says so (`status.membersReady` N/N);
- `replacement_s`: one member's node lost, until every member is Running again. The member's
  agent renewed its Lease a minute before (kwok runs no agent: the renewal is written here,
  as the agent writes it) and its Node object is deleted; the operator sees the expired Lease
  at its next resync (`--resync`), finds the node gone, excludes it and recreates that member
  alone on a spare node; the other members keep their pods (`kept_pods` counts them);
- `operator_peak_rss_mib`: the operator process's peak resident memory (VmHWM), read at the
  end, so it covers the creation, the replacement and the status updates;
- `cpu_s_until_all_running`: the CPU seconds each control-plane component, the operator and
  this benchmark used from the run's creation until every member ran, and `cpu_busy`, their
  sum over the cores' time: where the two cores went;
- `apiserver_until_all_running`: in the same span, from the apiserver's own counters, the pod
  watchers it closed for falling behind (`pod_watchers_closed`: a watcher more than a few events
  behind is dropped and its client watches again, or lists again: `pod_watches`,
  `pod_lists`, every client's requests of the pods) and the pod status writes it accepted and
  refused (`pod_status_patches`, `pod_status_patches_refused`). kwok plays a pod's stage again
  when it is handed an older copy of a pod it already moved on; a run with many closed watchers
  and repeated plays loads the control plane more and is slower. These tell such a run apart.

The gang's pods are followed with one watch (a list of a thousand pods a second would load the
apiserver being measured). kwok, which plays the kubelets of every node, moves 64 pods and
nodes through their stages at once here (its default is 4): real kubelets work in parallel.

Prints ONE JSON object on stdout; progress goes to stderr. Targets on a 2-core machine: every
pod of a 1,024-member gang Running within 30 s, a replacement within 30 s.

    python bench/gang.py
    python bench/gang.py --members 1024 --cluster dev
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from trainguard.api.constants import CRD_NAME, GROUP, LABEL_MEMBER, LABEL_RUN, PLURAL, VERSION
from trainguard.contract.env import lease_name
from trainguard.operator.build.names import pod_name
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.nodes import gpu_node
from trainguard_dev.cluster.rest import Rest
from trainguard_dev.testing.polling import eventually, seconds_left
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import example_run, pinned

REPO = Path(__file__).resolve().parents[1]
POOL_LABEL = "trainguard.dev/bench-pool"
NODE_GPUS = 8  # each member asks for all of them: one member per node
RUN = "gang"
CREATE_THREADS = 8
CLEANUP_SECONDS = 600.0
POLL_SECONDS = 1.0  # the nodes' readiness and the run's status (the pods are watched)
WATCH_SECONDS = 300
# The operator's resync: how soon an expired member Lease (no watch event tells it) is seen.
RESYNC_SECONDS = 2.0
# The kwok nodes' Lease and the node controller's grace, in the benchmark's own cluster: kwok
# renews a thousand nodes' Leases from the same two cores the control plane, the operator and
# the benchmark run on, and late renewals under that load would read as nodes going NotReady
# (tainted, so members the scheduler tries then wait out its back-off). Real kubelets renew
# from their own machines. The replacement below deletes a Node, which no grace delays.
NODE_LEASE_SECONDS = 120
# kwok plays a thousand kubelets, one queue of stage changes (4 at once by default): real
# kubelets start their pods in parallel, each on its own node.
KWOK_PARALLELISM = 64
# A member's agent renewed its Lease this long before its node was lost: well past expiry.
LOST_RENEWAL_AGO = timedelta(minutes=1)


def log(message: str) -> None:
    """Progress, on stderr (stdout carries only the JSON report)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--members", type=int, nargs="+", default=[128, 1024], help="gang sizes, one run each"
    )
    parser.add_argument("--cluster", help="use this running dev cluster instead of a new one")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after (seconds)")
    parser.add_argument(
        "--resync", type=float, default=RESYNC_SECONDS, help="the operator's resync (seconds)"
    )
    parser.add_argument(
        "--spare", type=int, default=1, help="nodes beyond one per member (at least 1)"
    )
    parser.add_argument(
        "--node-lease",
        type=int,
        default=NODE_LEASE_SECONDS,
        help="the kwok nodes' Lease and the node controller's grace in its own cluster (seconds)",
    )
    return parser.parse_args(argv)


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set size (VmHWM) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_now(cluster: Cluster, operator_pid: int) -> dict[str, float]:
    """CPU seconds used so far by each control-plane component, the operator and this process."""
    pids = {c.name: c.pid for c in cluster.status() if c.pid is not None and c.alive}
    pids |= {"operator": operator_pid, "benchmark": os.getpid()}
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def apiserver_counts(cluster: Cluster) -> dict[str, float]:
    """The apiserver counters named in `apiserver_until_all_running`, read from its /metrics."""
    counts = dict.fromkeys(
        (
            "pod_watchers_closed",
            "pod_lists",
            "pod_watches",
            "pod_status_patches",
            "pod_status_patches_refused",
        ),
        0.0,
    )
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if 'resource="pods"' not in line:
            continue
        value = float(line.rpartition(" ")[2])
        if line.startswith("apiserver_terminated_watchers_total{"):
            counts["pod_watchers_closed"] += value
        elif line.startswith("apiserver_request_total{") and 'subresource=""' in line:
            for verb, name in (("LIST", "pod_lists"), ("WATCH", "pod_watches")):
                if f'verb="{verb}"' in line:
                    counts[name] += value
        elif (
            line.startswith("apiserver_request_total{")
            and 'subresource="status"' in line
            and 'verb="PATCH"' in line
        ):
            accepted = 'code="200"' in line
            counts["pod_status_patches" if accepted else "pod_status_patches_refused"] += value
    return counts


def wait_for(check: Callable[[], Any], deadline: float, what: str) -> float:
    """Poll until `check()` is true; return the time it became true (monotonic)."""
    eventually(check, seconds_left(deadline), what, POLL_SECONDS)
    return time.monotonic()


def add_nodes(rest: Rest, names: list[str], pool: str) -> None:
    """The gang's own kwok GPU nodes, labelled with the pool, created a few at a time."""

    def create(name: str) -> None:
        node = gpu_node(name, gpus=NODE_GPUS)
        node["metadata"]["labels"][POOL_LABEL] = pool
        rest.create("/api/v1/nodes", node)

    with ThreadPoolExecutor(CREATE_THREADS) as threads:
        list(threads.map(create, names))


def nodes_ready(rest: Rest, pool: str, count: int) -> bool:
    """Whether the pool's `count` nodes are all Ready and untainted (one list, not one per node).

    The node controller removes a new node's not-ready taint a moment after Ready, and a member
    the scheduler tried before that waits out its back-off.
    """
    items = rest.get(f"/api/v1/nodes?labelSelector={POOL_LABEL}={pool}")["items"]
    ready = [
        n
        for n in items
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in n.get("status", {}).get("conditions", [])
        )
        and not n.get("spec", {}).get("taints")
    ]
    return len(ready) == count


class Members:
    """The gang's Running pods as one watch sees them, and when a condition on them first held.

    A list of a thousand pods a second would itself load the apiserver the figures come from;
    a watch costs it one event per change, and times each change as it arrives. The watch
    asks only for Running pods (a field selector): a pod is sent once it runs and again when
    it stops running or goes, not at its creation and binding as well, so the benchmark's own
    share of the two cores stays small. A pod that stops running leaves `pods`.
    """

    def __init__(self, rest: Rest, pods_path: str) -> None:
        self.rest = rest
        self.path = pods_path
        self.pods: dict[str, dict[str, Any]] = {}
        self.changed = threading.Condition()
        self.error: BaseException | None = None
        self.stopped = False
        self._version = self._list()
        self._thread = threading.Thread(target=self._follow, name="bench-watch", daemon=True)
        self._thread.start()

    def _list(self) -> str:
        listing = self.rest.get(self.path)
        with self.changed:
            self.pods = {p["metadata"]["name"]: p for p in listing["items"]}
            self.changed.notify_all()
        return str(listing["metadata"]["resourceVersion"])

    def _follow(self) -> None:
        try:
            while not self.stopped:
                for event in self.rest.watch(self.path, self._version, WATCH_SECONDS):
                    if event["type"] == "ERROR":  # e.g. 410 Gone: list again
                        self._version = self._list()
                        break
                    pod = event["object"]
                    self._version = pod["metadata"]["resourceVersion"]
                    with self.changed:
                        name = pod["metadata"]["name"]
                        if event["type"] == "DELETED":
                            self.pods.pop(name, None)
                        else:
                            self.pods[name] = pod
                        self.changed.notify_all()
        except BaseException as err:  # handed to the waiting thread
            with self.changed:
                self.error = err
                self.changed.notify_all()

    def all_running(self, members: int) -> bool:
        """Whether a pod runs for every member (only Running pods are watched; hold `changed`)."""
        return len(self.pods) == members

    def wait(
        self, check: Callable[[], bool], deadline: float, what: str
    ) -> tuple[float, dict[str, dict[str, Any]]]:
        """The time `check()` first held (monotonic) and the pods then."""
        with self.changed:
            while True:
                if self.error is not None:
                    raise RuntimeError(f"the pod watch failed: {self.error}") from self.error
                if check():
                    return time.monotonic(), dict(self.pods)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out waiting for {what}")
                self.changed.wait(min(left, POLL_SECONDS))

    def stop(self) -> None:
        """Stop following (the watch ends at its timeout; the thread is a daemon)."""
        self.stopped = True


def measure_gang(
    cluster: Cluster, rest: Rest, members: int, timeout: float, resync: float, spare: int
) -> dict[str, Any]:
    """One gang of `members`: set up, run, lose a node, measure; clean up what it made."""
    tag = uuid.uuid4().hex[:6]
    namespace, pool = f"bench-gang-{tag}", f"bench-gang-{tag}"
    node_names = [f"bench-gang-{tag}-{i}" for i in range(members + max(1, spare))]
    add_nodes(rest, node_names, pool)
    # A gang created before its nodes are Ready finds none and waits for them (taken down
    # after the bound, tried again later): the figures are the operator's, not the nodes'.
    wait_for(
        lambda: nodes_ready(rest, pool, len(node_names)),
        time.monotonic() + timeout,
        "the gang's nodes Ready",
    )
    cluster.kubectl("create", "namespace", namespace)
    log_file = Path(tempfile.mkstemp(prefix="bench-gang-operator-", suffix=".log")[1])
    operator = OperatorProcess(cluster.kubeconfig, [namespace], log_file, resync_seconds=resync)
    operator.start()
    try:
        deadline = time.monotonic() + timeout
        operator.wait_started(seconds_left(deadline))
        log(f"{members} members: operator up (pid {operator.pid}, log {log_file})")
        run_path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
        pods_path = (
            f"/api/v1/namespaces/{namespace}/pods?labelSelector={LABEL_RUN}={RUN}"
            "&fieldSelector=status.phase%3DRunning"
        )
        trainer = {"nodes": members, "resources": {"gpus": NODE_GPUS}, "procsPerNode": 1}
        run = pinned(example_run("minimal", RUN, {"trainer": trainer}), POOL_LABEL, pool)

        def ready() -> bool:
            status = rest.get(f"{run_path}/{RUN}").get("status") or {}
            return bool(status.get("membersReady") == f"{members}/{members}")

        watched = Members(rest, pods_path)
        counts_before = apiserver_counts(cluster)
        cpu_before = cpu_now(cluster, operator.pid)
        started = time.monotonic()
        rest.create(run_path, run)
        running, before = watched.wait(
            lambda: watched.all_running(members), deadline, "every member Running"
        )
        cpu_after = cpu_now(cluster, operator.pid)
        counts_after = apiserver_counts(cluster)
        # Where the two cores went until every member ran: each process's CPU seconds.
        cpu = {name: round(cpu_after[name] - cpu_before.get(name, 0.0), 1) for name in cpu_after}
        log(f"{members} members: all Running after {running - started:.1f} s")
        status_ready = wait_for(ready, deadline, "the status to show every member running")

        attempt = (rest.get(f"{run_path}/{RUN}").get("status") or {}).get("attempt") or 1
        lost_member = members // 2
        lost_pod = pod_name(RUN, attempt, lost_member)
        lost_node = before[lost_pod]["spec"]["nodeName"]
        renewed = datetime.now(UTC) - LOST_RENEWAL_AGO
        rest.patch(
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/"
            f"{lease_name(RUN, lost_member)}",
            {
                "spec": {
                    "holderIdentity": lost_pod,
                    "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                }
            },
        )
        lost = time.monotonic()
        rest.delete(f"/api/v1/nodes/{lost_node}")

        def mended() -> bool:
            pods = watched.pods
            return (
                watched.all_running(members)
                and pods[lost_pod]["metadata"]["uid"] != before[lost_pod]["metadata"]["uid"]
            )

        replaced, after_pods = watched.wait(
            mended, deadline, "the lost member replaced and every member Running"
        )
        watched.stop()
        log(f"{members} members: replaced after {replaced - lost:.1f} s")
        created = sorted(p["metadata"]["creationTimestamp"] for p in before.values())
        scheduled = sorted(
            c["lastTransitionTime"]
            for p in before.values()
            for c in p["status"].get("conditions", [])
            if c["type"] == "PodScheduled"
        )
        ran = sorted(p["status"].get("startTime", "") for p in before.values())
        after = list(after_pods.values())
        kept = sum(
            p["metadata"]["uid"] == before[p["metadata"]["name"]]["metadata"]["uid"]
            for p in after
            if p["metadata"]["name"] in before
        )
        status = rest.get(f"{run_path}/{RUN}").get("status") or {}
        rss = peak_rss_mib(operator.pid)
        return {
            "members": members,
            "all_running_s": round(running - started, 2),
            "status_ready_s": round(status_ready - started, 2),
            "replacement_s": round(replaced - lost, 2),
            "kept_pods": kept,
            "replaced_on": next(
                p["spec"].get("nodeName")
                for p in after
                if p["metadata"]["labels"].get(LABEL_MEMBER) == str(lost_member)
            ),
            "excluded_nodes": [e["node"] for e in status.get("excludedNodes", [])],
            "attempt": status.get("attempt"),
            "operator_peak_rss_mib": round(rss, 1),
            "cpu_s_until_all_running": cpu,
            "cpu_busy": round(sum(cpu.values()) / ((running - started) * (os.cpu_count() or 1)), 2),
            "apiserver_until_all_running": {
                name: int(counts_after[name] - counts_before[name]) for name in counts_after
            },
            # The apiserver's clock, to the second: how long the members' creation took.
            "first_pod_created": created[0],
            "last_pod_created": created[-1],
            "last_pod_scheduled": scheduled[-1],
            "last_pod_started": ran[-1],
            "nodes": len(node_names),
        }
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        # One request for the whole pool (kubectl deletes node by node, throttled), waited for
        # long enough: the apiserver stops deleting when its client gives up.
        patient = Rest(cluster.server, cluster.pki, timeout=CLEANUP_SECONDS)
        patient.request("DELETE", f"/api/v1/nodes?labelSelector={POOL_LABEL}={pool}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON report."""
    args = parse_args(argv)
    own = args.cluster is None
    cluster = Cluster(
        args.cluster or f"bench-{uuid.uuid4().hex[:6]}",
        node_lease_seconds=args.node_lease,
        kwok_parallelism=KWOK_PARALLELISM,
    )
    if not own and not cluster.is_up():
        log(f"cluster {cluster.name} is not up; start it with `trainguard dev cluster up`")
        return 2
    try:
        if own:
            log(f"starting cluster {cluster.name}")
            cluster.up(nodes=0)
        cluster.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            str(REPO / "crds" / f"{CRD_NAME}.yaml"),
        )
        cluster.wait_established(CRD_NAME, 90)
        rest = Rest(cluster.server, cluster.pki, timeout=60.0)
        gangs = [
            measure_gang(cluster, rest, members, args.timeout, args.resync, args.spare)
            for members in args.members
        ]
    finally:
        if own:
            cluster.down(purge=True)
    own_lease = args.node_lease if own else None
    print(
        json.dumps(
            {
                "gangs": gangs,
                "resync_s": args.resync,
                "node_lease_s": own_lease,
                "cpus": os.cpu_count(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
