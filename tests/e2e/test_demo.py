"""The README's first command, non-interactively: `trainguard demo --json`, `trainguard status`.

The demo runs on a control plane of its own (a unique name, torn down afterwards), exactly as
a user runs it: its own CRD install, the operator as a local process with the chart's RBAC,
two process-backed nodes, examples/demo.yaml. Its one JSON object must show both recoveries
with honest figures; `trainguard status` on the kept cluster must tell the same story.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from demo_story import assert_story
from trainguard_dev.cluster.cluster import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

TRAINGUARD = Path(sys.executable).parent / "trainguard"
DEMO_TIMEOUT_SECONDS = 900
LOG_TAIL_CHARS = 4000
# The demo's run: examples/demo.yaml, in the demo's namespace.
RUN, NAMESPACE = "demo", "trainguard-demo"
# Dead is seen by absence within a few agent intervals; ghost memory is judged only once the
# dead trainer's memory outlives monitor.ghostMemory.releaseTimeoutSeconds (30 s by default)
# or a restarted trainer finds it held by no process.
DEAD_DETECT_BOUND_S = 5.0
GHOST_DETECT_BOUND_S = 30.0 + 15.0


@pytest.fixture
def demo_cluster(request: pytest.FixtureRequest) -> Any:
    """A unique cluster name for the demo; torn down afterwards, its logs printed on failure."""
    name = f"demo-test-{uuid.uuid4().hex[:6]}"
    failed_before = request.session.testsfailed
    try:
        yield name
    finally:
        if request.session.testsfailed > failed_before:
            print(_logs(Cluster(name).root))
        Cluster(name).down(purge=True)


def _logs(root: Path) -> str:
    """The operator's log and each pod's container logs, their tails."""
    paths = [root / "demo" / "operator.log", *sorted(root.glob("procnodes/*/pods/*/*.log"))]
    parts = []
    for path in paths:
        if path.exists():
            text = path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
            parts.append(f"----- {path} -----\n{text}")
    return "\n".join(parts)


def _demo(name: str) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [str(TRAINGUARD), "demo", "--json", "--name", name],
        capture_output=True, text=True, timeout=DEMO_TIMEOUT_SECONDS, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"demo failed ({done.returncode}):\n{done.stderr[-8000:]}"
    summary: dict[str, Any] = json.loads(done.stdout)  # nothing else on stdout
    return summary, done.stderr


def test_demo_shows_both_recoveries_and_status_tells_the_story(demo_cluster: str) -> None:
    summary, progress = _demo(demo_cluster)
    assert_story(summary, dead_bound_s=DEAD_DETECT_BOUND_S, ghost_bound_s=GHOST_DETECT_BOUND_S)
    ghost = summary["recoveries"][1]
    # The narration went to stderr.
    assert "silent death" in progress and "ghost VRAM" in progress

    # The cluster was kept: the run's story, as `trainguard status` tells it.
    cluster = Cluster(demo_cluster)
    assert summary["kubeconfig"] == str(cluster.kubeconfig)
    status = subprocess.run(
        [str(TRAINGUARD), "status", RUN, "-n", NAMESPACE, "--kubeconfig", summary["kubeconfig"]],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    text = status.stdout
    sections = {s.split("\n", 1)[0].split(" (")[0]: s for s in text.split("\n\n")}
    detections = sections["Detections"]
    assert " Dead " in detections and ghost["cause"] in detections, text
    excluded = sections["Excluded nodes"]
    assert ghost["node_before"] in excluded and ghost["cause"] in excluded, text
    restores = sections["Restores"]
    assert f"restored step {ghost['resumed_step']} from layer backup" in restores, text
    assert "backup" in sections["Checkpoints"], text
