"""The story every `trainguard demo --json` summary must tell, on any kind of node.

Two recoveries with honest figures: the silent death seen as `Dead`, the trainer restarted
in place from L1; ghost VRAM judged (`GhostMemory` or `GPUMemoryNotReleased`), the node
excluded and the run moved to the other node, restored from the remote layer `backup`.
`tests/e2e/test_demo.py` (process-backed nodes) and `tests/realnodes/test_demo_real.py`
(real nodes) check it with their own detection bounds.
"""

from __future__ import annotations

from typing import Any

GHOST_CAUSES = {"GhostMemory", "GPUMemoryNotReleased"}
FIGURES = {
    "cause", "detect_s", "resume_s", "steps_lost", "from_layer", "node_before", "node_after",
}  # fmt: skip


def assert_story(summary: dict[str, Any], *, dead_bound_s: float, ghost_bound_s: float) -> None:
    """Both recoveries happened as the demo narrates them, within the given detection bounds."""
    every = summary["checkpoint_every_steps"]
    assert every > 0
    death, ghost = summary["recoveries"]
    for recovery in (death, ghost):
        assert set(recovery) >= FIGURES, recovery
        assert 0 < recovery["detect_s"] <= recovery["resume_s"], recovery
        assert 0 <= recovery["steps_lost"] <= every, recovery

    assert death["cause"] == "Dead"
    assert death["detect_s"] <= dead_bound_s, death
    assert death["node_before"] == death["node_after"]
    assert death["from_layer"] == "l1"

    assert ghost["cause"] in GHOST_CAUSES
    assert ghost["detect_s"] <= ghost_bound_s, ghost
    assert ghost["node_before"] != ghost["node_after"]
    assert ghost["from_layer"] == "backup"  # the remote layer: L1 stayed on the sick node
    assert ghost["attempt_after"] == ghost["attempt_before"] + 1

    totals = summary["totals"]
    assert totals["recoveries"] == 2
    assert totals["excluded_nodes"] == [ghost["node_before"]]
    assert totals["checkpoints_verified"].get("l1", 0) >= 2
    assert totals["checkpoints_verified"].get("backup", 0) >= 1
