"""What every end-to-end test gets: the statuses its runs go through, recorded on request.

With TRAINGUARD_RECORD_STATUSES=<dir>, every new case of a TrainingRun's status that the
operator writes is recorded there, credited to the test that made it: the Argo CD health
check's fixtures are generated from them (`hack/record-argocd-fixtures.sh`,
`trainguard_dev.testing.statuses`). Without the variable nothing is started and no fixture is
asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.statuses import RECORD_ENV, StatusRecorder, watch_command


@pytest.fixture(scope="session")
def status_recorder(cluster: Cluster) -> Iterator[StatusRecorder]:
    """Every new case of a TrainingRun's status, cluster-wide, written under $RECORD_ENV."""
    kubectl = [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
    recorder = StatusRecorder(watch_command(kubectl), Path(os.environ[RECORD_ENV]))
    recorder.start()
    try:
        yield recorder
    finally:
        recorder.stop()


@pytest.fixture(autouse=True)
def recorded_statuses(request: pytest.FixtureRequest) -> None:
    """Credit what the recorder sees from now on to this test (only when recording)."""
    if not os.environ.get(RECORD_ENV) or "cluster" not in request.fixturenames:
        return
    recorder: StatusRecorder = request.getfixturevalue("status_recorder")
    recorder.test = request.node.nodeid
