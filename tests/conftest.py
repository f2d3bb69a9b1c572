"""Shared fixtures: the local control plane for the apiserver and e2e tiers, small disks.

`cluster` starts one real control plane (etcd, kube-apiserver, controller-manager,
scheduler, kwok GPU nodes) for the whole test session and stops it at the end. Set
TRAINGUARD_TEST_CLUSTER=<name> to reuse a cluster already started with
`trainguard dev cluster up --name <name>` (it is then left running).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from session_cluster import TEST_NODES, TEST_PROCESS_NODES
from trainguard_dev.cluster.cluster import Cluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "taint_policy(name): the e2e operator fixture's --taint-policy"
    )


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


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """Mount small tmpfs disks (size in bytes) that really fill up; unmounted afterwards.

    Needs root (the test environments run as root): a full disk is tested with a real one.
    """
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], check=True
        )
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=True)
