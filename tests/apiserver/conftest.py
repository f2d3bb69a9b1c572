"""The apiserver tier of the API: installs the generated CRD into the session cluster.

Every test here runs against the real kube-apiserver of the local control plane, with the
checked-in CRD (the drift unit test keeps it equal to what the models generate).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainguard.api.constants import CRD_NAME
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.crdgen import CRD_FILE

REPO = Path(__file__).resolve().parents[2]
ESTABLISHED_TIMEOUT = 60.0


@pytest.fixture(scope="session", autouse=True)
def trainingrun_crd(cluster: Cluster) -> None:
    """The TrainingRun CRD, installed (or updated) and Established."""
    cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=trainguard-tests",
        "-f",
        str(REPO / CRD_FILE),
    )
    cluster.wait_established(CRD_NAME, ESTABLISHED_TIMEOUT)


@pytest.fixture
def server_create(
    cluster: Cluster, namespace: str
) -> Callable[[dict[str, Any]], subprocess.CompletedProcess[str]]:
    """Create an object with a server-side dry run: the apiserver validates and defaults it."""

    def create(obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl(
            "create",
            "--dry-run=server",
            "-n",
            namespace,
            "-o",
            "json",
            "-f",
            "-",
            input=json.dumps(obj),
            check=False,
        )

    return create
