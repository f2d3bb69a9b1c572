"""`trainguard demo`: bring up the local control plane and show how to use it.

The demo's cluster is named ``demo`` and is left running for kubectl; pass ``--down`` to
stop it instead.
"""

from __future__ import annotations

import argparse
import sys

from trainguard.devcluster.cluster import Cluster, ClusterError

DEMO_CLUSTER = "demo"


def main(argv: list[str]) -> int:
    """Entry point of `trainguard demo`."""
    parser = argparse.ArgumentParser(prog="trainguard demo", description=__doc__)
    parser.add_argument("--nodes", type=int, default=3, help="GPU nodes (default: 3)")
    parser.add_argument("--down", action="store_true", help="stop the demo cluster and exit")
    args = parser.parse_args(argv)
    cluster = Cluster(DEMO_CLUSTER)
    try:
        if args.down:
            cluster.down(purge=True)
            print("demo cluster stopped")
            return 0
        seconds = cluster.up(nodes=args.nodes)
        nodes = cluster.kubectl("get", "nodes", "-L", "nvidia.com/gpu.product").stdout
    except ClusterError as err:
        print(f"trainguard demo: {err}", file=sys.stderr)
        return 1
    print(nodes.rstrip())
    print()
    print("The local control plane is up (etcd, kube-apiserver, controller-manager,")
    print("scheduler, and kwok simulating the GPU nodes above). Use it with:")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    print(f"  {cluster.bin_dir / 'kubectl'} get nodes")
    print("Stop it with: .venv/bin/trainguard demo --down")
    print(f"ready in {seconds:.1f} s")
    return 0
