"""What users see through kubectl: printer columns, categories, explain, status validation."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trainguard.api import Condition, TrainingRunStatus
from trainguard.api import constants as c
from trainguard.api.spec import Checkpoints
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.polling import eventually

pytestmark = pytest.mark.apiserver

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
COLUMNS = ["NAME", "PHASE", "STEP", "NODE", "ATTEMPT", "RESTARTS", "CHECKPOINT", "AGE"]
EXPLAIN_DEADLINE_SECONDS = 60.0


def running_status() -> TrainingRunStatus:
    now = datetime.now(UTC)
    return TrainingRunStatus(
        observed_generation=1,
        phase=c.Phase.RUNNING,
        conditions=[
            Condition(
                type=c.ConditionType.READY,
                status=c.ConditionStatus.TRUE,
                reason=c.Reason.TRAINING,
                message="training",
                last_transition_time=now,
            )
        ],
        verdict=c.Verdict.HEALTHY,
        step=322,
        tokens_per_second=23950.5,
        node="gpu-node-1",
        attempt=2,
        restarts=1,
        checkpoint_step=300,
    )


def create_examples(cluster: Cluster, namespace: str) -> None:
    for example in ("minimal.yaml", "full.yaml"):
        cluster.kubectl("create", "-n", namespace, "-f", str(EXAMPLES / example))


def patch_status(cluster: Cluster, namespace: str, name: str, status: dict[str, object]) -> None:
    cluster.kubectl(
        "patch",
        f"{c.SINGULAR}/{name}",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def test_get_shows_the_printer_columns(cluster: Cluster, namespace: str) -> None:
    create_examples(cluster, namespace)
    patch_status(cluster, namespace, "full", running_status().to_object())

    table = cluster.kubectl("get", "tr", "-n", namespace).stdout.splitlines()
    assert table[0].split() == COLUMNS
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows["full"][1:7] == ["Running", "322", "gpu-node-1", "2", "1", "300"]
    assert len(rows["minimal"]) == 2  # no status yet: only the name and the age

    wide = cluster.kubectl("get", "tr", "full", "-n", namespace, "-o", "wide").stdout
    assert wide.splitlines()[0].split()[-3:] == ["VERDICT", "TOKENS/S", "RANKS"]
    # The full example leaves procsPerNode out (one rank per GPU): its cell is empty.
    assert wide.splitlines()[1].split()[-2:] == ["Healthy", "23950.5"]

    cluster.kubectl("create", "-n", namespace, "-f", str(EXAMPLES / "multi-gpu.yaml"))
    ranks = cluster.kubectl("get", "tr", "multi-gpu", "-n", namespace, "-o", "wide").stdout
    assert ranks.splitlines()[1].split()[-1] == "8"


def test_category_lists_runs(cluster: Cluster, namespace: str) -> None:
    create_examples(cluster, namespace)
    names = cluster.kubectl("get", "trainguard", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(names) == [f"{c.SINGULAR}.{c.GROUP}/full", f"{c.SINGULAR}.{c.GROUP}/minimal"]


def test_status_written_by_the_models_round_trips(cluster: Cluster, namespace: str) -> None:
    create_examples(cluster, namespace)
    status = running_status()
    patch_status(cluster, namespace, "full", status.to_object())
    stored = json.loads(cluster.kubectl("get", "tr", "full", "-n", namespace, "-o", "json").stdout)
    assert TrainingRunStatus.from_object(stored["status"]) == TrainingRunStatus.from_object(
        status.to_object()
    )


def test_status_is_validated(cluster: Cluster, namespace: str) -> None:
    create_examples(cluster, namespace)
    result = cluster.kubectl(
        "patch",
        f"{c.SINGULAR}/full",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Exploded", "restarts": -1}}),
        check=False,
    )
    assert result.returncode != 0
    assert "status.phase" in result.stderr
    assert "status.restarts" in result.stderr


def explain(cluster: Cluster, field: str) -> str:
    """`kubectl explain`, retried while the apiserver is still publishing the CRD's schema."""
    results: list[subprocess.CompletedProcess[str]] = []

    def explained() -> str | None:
        results.append(cluster.kubectl("explain", field, check=False))
        return results[-1].stdout if results[-1].returncode == 0 else None

    return eventually(
        explained,
        EXPLAIN_DEADLINE_SECONDS,
        f"`kubectl explain {field}`",
        1.0,
        detail=lambda: results[-1].stderr,
    )


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_explain_describes_every_checkpoints_field(cluster: Cluster) -> None:
    text = explain(cluster, "trainingrun.spec.checkpoints")
    assert "DESCRIPTION" in text and "FIELDS" in text
    flat = squash(text)
    for field in Checkpoints.model_fields.values():
        assert re.search(rf"^  {field.alias}\t", text, re.MULTILINE), field.alias
        assert field.description is not None
        assert squash(field.description) in flat, field.alias


def test_explain_reaches_nested_fields(cluster: Cluster) -> None:
    text = squash(explain(cluster, "trainingrun.spec.checkpoints.remote.uri"))
    assert "hf://owner/repo (Hugging Face Hub, weights only)" in text
