"""Component files: any training state round-trips exactly; model files are plain safetensors."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from trainguard_harness.snapshot import HostSnapshotter, plan_state
from trainguard_harness.tensorfile import StateFormatError, decode_component, layout_component

pytestmark = pytest.mark.unit


def file_bytes(name: str, state: object) -> bytearray:
    """What the writer puts in `<name>.safetensors`, via the real snapshot path."""
    plan = plan_state({name: state})
    snapshot = HostSnapshotter().capture(plan)
    return bytearray(plan.components[0].header()) + bytearray(snapshot.data(0))


def assert_same(left: object, right: object) -> None:
    assert type(left) is type(right), (left, right)
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor)
        assert left.dtype == right.dtype and left.shape == right.shape
        # Bitwise, so NaNs and signed zeros count too.
        bits = [t.contiguous().reshape(-1).view(torch.uint8) for t in (left, right)]
        assert torch.equal(*bits)
    elif isinstance(left, np.ndarray):
        assert isinstance(right, np.ndarray)
        assert left.dtype == right.dtype and np.array_equal(left, right)
    elif isinstance(left, dict):
        assert isinstance(right, dict) and list(left) == list(right)
        for key in left:
            assert_same(left[key], right[key])
    elif isinstance(left, list | tuple):
        assert isinstance(right, list | tuple) and len(left) == len(right)
        for a, b in zip(left, right, strict=True):
            assert_same(a, b)
    elif isinstance(left, float) and math.isnan(left):
        assert isinstance(right, float) and math.isnan(right)
    else:
        assert left == right


def test_nested_state_round_trips_exactly() -> None:
    generator = torch.Generator().manual_seed(0)
    state = {
        "state": {
            0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 5, generator=generator)},
            1: {"step": torch.tensor(3.0), "exp_avg": torch.randn(7, generator=generator)},
        },
        "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0, 1], "fused": None}],
        "dtypes": [
            torch.arange(6, dtype=torch.int64).view(2, 3),
            torch.tensor([True, False, True]),
            torch.randn(3, generator=generator).to(torch.bfloat16),
            torch.randn(3, generator=generator).to(torch.float16),
            torch.arange(5, dtype=torch.uint8),
            torch.empty(0, 4),
            torch.randn(4, 4, generator=generator).t(),  # not contiguous
        ],
        "numpy": np.arange(10, dtype=np.uint32),
        "numpy_scalar": np.float64(2.5).item(),
        "tuple_key": {(1, "a"): "x"},
        "tag_like_key": {"__tensor__": 1},
        "bytes": b"\x00\xff",
        "floats": [float("inf"), -float("inf"), float("nan"), 1e-300],
        "python_rng": random.Random(4).getstate(),
        "empty": {},
    }
    assert_same(state, decode_component(file_bytes("optimizer", state)))


def test_model_file_is_a_plain_safetensors_weights_file(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    path = tmp_path / "model.safetensors"
    path.write_bytes(file_bytes("model", model.state_dict()))
    loaded = load_file(str(path))
    assert set(loaded) == set(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor)


def test_tensors_are_aligned_by_decreasing_element_size() -> None:
    state = {"a": torch.ones(3, dtype=torch.int8), "b": torch.ones(1), "c": torch.ones(1).double()}
    slots = layout_component("x", state).slots
    assert [slot.name for slot in slots] == ["c", "b", "a"]
    for slot in slots:
        assert slot.offset % slot.dtype.itemsize == 0
    # The data section starts block-aligned, ready for O_DIRECT.
    assert len(layout_component("x", state).header()) % 4096 == 0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"f": lambda: 0}, "cannot store function at f"),
        ({"s": {1, 2}}, "cannot store set at s"),
        ({"t": torch.eye(2).to_sparse()}, "only dense tensors"),
    ],
)
def test_unstorable_values_are_refused_with_their_path(value: object, message: str) -> None:
    with pytest.raises(StateFormatError, match=message):
        layout_component("c", value)


def test_truncated_files_are_refused() -> None:
    data = file_bytes("m", {"w": torch.ones(100)})
    with pytest.raises(StateFormatError):
        decode_component(data[:-4])
    with pytest.raises(StateFormatError):
        decode_component(data[:4])
