"""Shared fixtures: the local control plane for the apiserver and e2e tiers.

`cluster` starts one real control plane (etcd, kube-apiserver, controller-manager,
scheduler, kwok GPU nodes) for the whole test session and stops it at the end. Set
TRAINGUARD_TEST_CLUSTER=<name> to reuse a cluster already started with
`trainguard dev cluster up --name <name>` (it is then left running).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from trainguard.devcluster.cluster import Cluster

TEST_NODES = 3
TEST_PROCESS_NODES = 2


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A running local control plane: TEST_NODES kwok and TEST_PROCESS_NODES process-backed."""
    reuse = os.environ.get("TRAINGUARD_TEST_CLUSTER")
    if reuse:
        existing = Cluster(reuse)
        existing.up(
            nodes=TEST_NODES, process_nodes=TEST_PROCESS_NODES
        )  # idempotent: returns at once when already up
        yield existing
        return
    started = Cluster(f"test-{uuid.uuid4().hex[:6]}")
    try:
        started.up(nodes=TEST_NODES, process_nodes=TEST_PROCESS_NODES)
        yield started
    finally:
        started.down(purge=True)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def kubectl_json(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """Run kubectl with `-o json` appended (helper for assertions)."""
    return cluster.kubectl(*args, "-o", "json")
