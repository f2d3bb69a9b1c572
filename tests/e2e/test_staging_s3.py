"""Data staged from an S3 bucket, end to end: the source's Secret reaches `stage-data` alone.

The run's shards are objects in a SeaweedFS bucket; the run names the bucket and a Secret
with the S3 keys and endpoint. On a process-backed node the pod's `stage-data` step reads
the Secret where the operator mounted it, stages the objects verified against their ETags,
its progress reaches the run's status, and the reference trainer trains on the local copy
(asserted as the real-node tier asserts it: `trainguard_dev.testing.signals`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, get_json, pods_of

from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run
from trainguard_dev.testing.servers import SeaweedFS
from trainguard_dev.testing.signals import assert_data_secrets_in_stage_data_alone, assert_staged

pytest_plugins = ("operator_fixtures", "integration.s3_fixtures")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SECRET = "shards-s3"
SHARDS = 8


@pytest.mark.parametrize("operator", ["chart-rbac"], indirect=True)
def test_a_run_stages_its_shards_from_s3_with_its_own_secret_and_trains(
    cluster: Cluster,
    namespace: str,
    process_nodes: list[str],
    operator: OperatorProcess,
    seaweedfs: SeaweedFS,
    bucket: str,
    tmp_path: Path,
) -> None:
    shards = make_shards(tmp_path / "shards", shards=SHARDS, tokens=20_000, seed=5)
    client = seaweedfs.client()
    objects = sorted(p for p in shards.rglob("*") if p.is_file())
    for path in objects:
        key = f"datasets/{path.relative_to(shards).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET}}
    source = {"uri": f"s3://{bucket}/datasets", "credentialsSecret": {"name": SECRET}}
    run = reference_run(
        "s3-data", shards, 20, {"data": {"source": source}, "monitor": {"startupGraceSeconds": 5}}
    )
    apply(cluster, namespace, {**secret, "stringData": seaweedfs.secret_data()}, run)

    def trained() -> dict[str, Any] | None:
        current = get_json(cluster, "tr", "s3-data", "-n", namespace)
        status = current.get("status", {})
        return current if (status.get("step") or 0) >= 5 else None

    current = eventually(trained, timeout=180, what="the run to train on the staged shards")
    assert_staged(current, objects)
    (pod,) = pods_of(cluster, namespace, "s3-data")
    assert_data_secrets_in_stage_data_alone(pod)
