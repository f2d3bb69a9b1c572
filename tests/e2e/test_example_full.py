"""examples/full.yaml on process-backed nodes, applied as is but for site values.

Its data source and every layer work (`full_example.ships_everywhere`, which the real-node
tier runs as well, says what the site gives the example and what is checked). This site:
SeaweedFS and the Hub stand-in on loopback, the sshd on loopback serving `/srv` from a
directory of the test's, the backup claim on a volume every process-backed node shares, and
the process-backed nodes as the example's GPU nodes, tainted as GPU node pools are.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from full_example import (
    GPU_TAINT,
    HF_TOKEN,
    ExampleSite,
    backup_claim,
    ships_everywhere,
    site_values,
)
from integration.hub_standin import HubServer, serving
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.nodes import PROCESS_NODE_LABEL
from trainguard_dev.cluster.procnode import ENV_FILENAME, claim_dir, shared_claim
from trainguard_dev.demo.env import create_claim
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import REFERENCE_IMAGE
from trainguard_dev.testing.servers import INSTALL_HINT, SSHD, SeaweedFS, Sshd, start_sshd

pytest_plugins = ("operator_fixtures", "integration.s3_fixtures")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# The process-backed nodes carry the example's GPU labels, as the kwok nodes do, which run nothing.
SITE = site_values(REFERENCE_IMAGE, {("placement", "nodeSelector", PROCESS_NODE_LABEL): "true"})


@pytest.fixture
def hub() -> Iterator[HubServer]:
    """The Hub stand-in, serving from a thread of this process."""
    with serving(HF_TOKEN) as server:
        yield server


@pytest.fixture
def backup_host(tmp_path: Path) -> Iterator[tuple[Sshd, Path]]:
    """The sshd, with `/srv` a directory of the test's: the server and that directory."""
    if not SSHD.exists():
        pytest.fail(f"no sshd at {SSHD}: {INSTALL_HINT}")
    srv = tmp_path / "srv"
    srv.mkdir()
    (tmp_path / "sshd").mkdir()
    server = start_sshd(tmp_path / "sshd", mounts={"/srv": srv})
    try:
        yield server, srv
    finally:
        server.stop()


@pytest.fixture
def backup_volume(cluster: Cluster, namespace: str) -> Iterator[Path]:
    """The example's `file://` layer's claim, on a volume every node reaches; its directory."""
    claim = backup_claim()
    create_claim(cluster, namespace, claim)
    try:
        yield claim_dir(cluster.root, namespace, claim)
    finally:
        volume = shared_claim(cluster.root, namespace, claim)[0]["metadata"]["name"]
        cluster.kubectl("delete", "pv", volume, "--wait=false", check=False)


@pytest.fixture
def gpu_nodes(cluster: Cluster, process_nodes: list[str]) -> Iterator[list[str]]:
    """The process-backed nodes, tainted as GPU node pools are; untainted afterwards."""
    for node in process_nodes:
        cluster.kubectl("taint", "node", node, GPU_TAINT, "--overwrite")
    try:
        yield process_nodes
    finally:
        for node in process_nodes:
            cluster.kubectl("taint", "node", node, f"{GPU_TAINT}-", check=False)


@pytest.mark.parametrize("operator", ["chart-rbac"], indirect=True)
def test_the_full_example_stages_its_data_and_ships_to_every_layer(
    cluster: Cluster,
    namespace: str,
    gpu_nodes: list[str],
    operator: OperatorProcess,
    seaweedfs: SeaweedFS,
    hub: HubServer,
    backup_host: tuple[Sshd, Path],
    backup_volume: Path,
    tmp_path: Path,
) -> None:
    sshd, srv = backup_host
    site = ExampleSite(
        cluster=cluster,
        namespace=namespace,
        values=SITE,
        nodes=gpu_nodes,
        env_files=[cluster.root / "procnodes" / node / ENV_FILENAME for node in gpu_nodes],
        seaweedfs=seaweedfs,
        hub=hub,
        sshd=sshd,
        srv=srv,
        backup_dir=backup_volume,
    )
    ships_everywhere(site, tmp_path)
