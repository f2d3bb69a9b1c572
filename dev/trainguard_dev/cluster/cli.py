"""`trainguard dev cluster up | down | status | env`: the local control plane from a shell."""

from __future__ import annotations

import argparse
import sys

from trainguard_dev.cluster.cluster import Cluster, ClusterError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainguard dev", description="Developer tools: a real local control plane."
    )
    sub = parser.add_subparsers(dest="group", required=True)
    cluster = sub.add_parser("cluster", help="start, inspect or stop a local control plane")
    actions = cluster.add_subparsers(dest="action", required=True)

    def named(name: str, help_text: str) -> argparse.ArgumentParser:
        action = actions.add_parser(name, help=help_text)
        action.add_argument("--name", default="default", help="cluster name (default: default)")
        return action

    up = named("up", "start the cluster (idempotent) and wait until it is ready")
    up.add_argument("--nodes", type=int, default=3, help="kwok GPU nodes (default: 3)")
    up.add_argument(
        "--process-nodes",
        type=int,
        default=0,
        help="process-backed GPU nodes whose pods run as local processes (default: 0)",
    )
    up.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        help="real nodes (kubelet, containerd, runc, kube-proxy; needs root) (default: 0)",
    )
    up.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default: 8)")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for ready")
    down = named("down", "stop every component by its recorded PID")
    down.add_argument("--purge", action="store_true", help="also delete the cluster's files")
    named("status", "show each component's PID and state")
    named("env", "print the KUBECONFIG line for a shell")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of `trainguard dev`."""
    args = _parser().parse_args(argv)
    cluster = Cluster(args.name)
    try:
        if args.action == "up":
            if min(args.nodes, args.process_nodes, args.real_nodes, args.gpus_per_node) < 0:
                print("trainguard dev cluster up: node and GPU counts must be >= 0")
                return 2
            seconds = cluster.up(
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                timeout=args.timeout,
                process_nodes=args.process_nodes,
                real_nodes=args.real_nodes,
            )
            print(
                f"cluster {cluster.name!r}: {args.nodes} kwok + {args.process_nodes} "
                f"process-backed + {args.real_nodes} real GPU nodes, logs in {cluster.log_dir}"
            )
            for node in cluster.real_nodes.nodes():
                print(f"{node.name} Ready (IP {node.ip}, pods {node.subnet})")
            print(f"export KUBECONFIG={cluster.kubeconfig}")
            print(f"ready in {seconds:.1f} s")
        elif args.action == "down":
            stopped = cluster.down(purge=args.purge)
            print(f"cluster {cluster.name!r}: stopped {', '.join(stopped) or 'nothing'}")
        elif args.action == "status":
            states = cluster.status() + cluster.real_node_status()
            for s in states:
                state = "running" if s.alive else "stopped"
                print(f"{s.name:<24} {state:<8} pid {s.pid if s.pid else '-'}")
            ready = cluster.is_up()
            print(f"cluster {cluster.name!r}: {'ready' if ready else 'not ready'}")
            if ready:
                print(f"export KUBECONFIG={cluster.kubeconfig}")
            return 0 if ready else 1
        elif args.action == "env":
            print(f"export KUBECONFIG={cluster.kubeconfig}")
    except ClusterError as err:
        print(f"trainguard dev cluster {args.action}: {err}", file=sys.stderr)
        return 1
    return 0
