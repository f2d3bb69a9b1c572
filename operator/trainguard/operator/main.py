"""`trainguard operator`: run the operator (kopf) with trainguard's handlers.

Equivalent to
`kopf run -m trainguard.operator.handlers -m trainguard.operator.metrics --standalone`, with
the settings of `trainguard.operator.config` as flags. Watches the namespaces given with
`--namespace`, or all of them with `--all-namespaces`.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import socket

import kopf

from trainguard.operator.config import (
    DEFAULT_RESYNC_SECONDS,
    DEFAULT_WORKERS,
    ENV_KUBECONFIG,
    OperatorConfig,
)
from trainguard.operator.policies.nodehealth import DEFAULT_RECHECK_SECONDS, TaintPolicy


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainguard operator", description="Reconcile TrainingRuns into guarded pods."
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("-n", "--namespace", action="append", help="namespace to watch (repeat)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch all namespaces")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster or $KUBECONFIG)")
    parser.add_argument("--agent-image", help="image of the agent and the init steps")
    parser.add_argument(
        "--network-csi-driver",
        action="append",
        default=[],
        metavar="NAME",
        help="CSI driver to treat as a network volume, beyond the built-in list (repeat)",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=DEFAULT_RESYNC_SECONDS,
        help="reconcile every run at least this often",
    )
    parser.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS, help="threads for API calls"
    )
    parser.add_argument(
        "--taint-policy",
        choices=[p.value for p in TaintPolicy],
        help="when a run's report of a sick node taints it for every run: after the "
        "operator's own node check confirms it (confirmed, the default), at once "
        "(immediate), or never",
    )
    parser.add_argument(
        "--node-check-namespace",
        metavar="NAMESPACE",
        help="namespace of the node check pods (default: the operator's own, else default)",
    )
    parser.add_argument(
        "--node-recheck-seconds",
        type=float,
        help=f"re-check a tainted node after this long, doubling per failed check "
        f"(default {DEFAULT_RECHECK_SECONDS:g})",
    )
    parser.add_argument(
        "--liveness", metavar="URL", help="serve liveness, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def identity() -> str:
    """Who this operator is, for kopf: `<user>@<host>`, where the user may have no name.

    kopf's own guess asks the password database for the user's name, and a container's fixed
    numeric user (the image's 65532) usually has no entry there: it would crash at start.
    """
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid-{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def main(argv: list[str]) -> int:
    """Run the operator until it is stopped (SIGINT/SIGTERM); return its exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.kubeconfig:
        # kopf's own login reads the same file as the operator's client.
        os.environ[ENV_KUBECONFIG] = args.kubeconfig
    env = OperatorConfig.from_env()
    config = OperatorConfig(
        agent_image=args.agent_image or env.agent_image,
        network=env.network.with_csi_drivers(args.network_csi_driver),
        resync_seconds=args.resync_seconds,
        workers=args.workers,
        kubeconfig=args.kubeconfig or env.kubeconfig,
        taint_policy=TaintPolicy(args.taint_policy) if args.taint_policy else env.taint_policy,
        node_check_namespace=args.node_check_namespace or env.node_check_namespace,
        node_recheck_seconds=args.node_recheck_seconds or env.node_recheck_seconds,
    )
    # Importing registers the handlers, and the metrics endpoint and its watch, with kopf.
    import trainguard.operator.handlers
    import trainguard.operator.metrics  # noqa: F401

    kopf.run(
        identity=identity(),  # type: ignore[arg-type]  # kopf's Identity is a NewType of str
        standalone=True,
        clusterwide=args.all_namespaces,
        namespaces=args.namespace or (),
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(config=config),
    )
    return 0
