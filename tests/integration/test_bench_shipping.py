"""bench/shipping.py: its figures count only when every layer shipped verified checkpoints.

The benchmark's own shipping segment runs here (its writer saving, its shipper process
shipping) with two file:// layers, one of which always fails: the benchmark must say so and
exit non-zero instead of reporting a throughput ratio as if both had shipped.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import ModuleType

import pytest
import torch

from trainguard.layers import FileLayer, LayerConfig
from trainguard_harness.writer import CheckpointWriter

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def shipping() -> Iterator[ModuleType]:
    """The benchmark's module.

    It imports its sibling `checkpoint`, and so does its shipper process, which starts with
    this process's import path.
    """
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("shipping")
    finally:
        sys.path.remove(str(BENCH))


def _file_layer(root: Path, name: str) -> partial[FileLayer]:
    return partial(FileLayer, LayerConfig(name, f"file://{root}"), root)


def test_a_layer_that_ships_nothing_fails_the_benchmark(
    shipping: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    l1 = tmp_path / "l1"
    writer = CheckpointWriter(l1, keep_last=2, on_event=lambda event: None)
    state = {"model": {"w": torch.randn(64 * 1024)}, "optimizer": {"m": torch.randn(1024)}}
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the layer's directory should be")
    makers = [_file_layer(tmp_path / "good", "good"), _file_layer(blocker, "broken")]
    # 100 steps of 30 ms, a checkpoint every 10 steps.
    measure = partial(
        shipping.segment,
        lambda count: time.sleep(0.03 * count),
        writer,
        state,
        steps=100,
        every=10,
        first_step=1,
    )
    try:
        seconds, states = shipping.shipping_segment(measure, l1, makers)
    finally:
        writer.close()
    assert seconds >= 3.0

    results = shipping.layer_results([states])
    assert results["good"]["shipped"][0] >= 1
    assert results["broken"]["shipped"] == [0]
    assert results["broken"]["errors"] and "broken" in results["broken"]["errors"][0]
    problems = shipping.shipping_problems(results, ["good", "broken"])
    assert len(problems) == 1
    assert problems[0].startswith(
        "layer broken shipped no verified checkpoint during the shipping segments "
        "(per segment: [0]); last error: "
    )
    assert shipping.finish(problems) == 1
    err = capsys.readouterr().err
    assert "FAILED: layer broken shipped no verified checkpoint" in err
    assert "does not measure shipping" in err

    # Only the layer that shipped: the figures stand.
    assert shipping.finish(shipping.shipping_problems(results, ["good"])) == 0
    # A layer missing from the report altogether fails too.
    assert shipping.shipping_problems(results, ["good", "s3"]) == [
        "layer s3 shipped no verified checkpoint during the shipping segments (per segment: [])"
    ]
