"""Component files: nested training state as a safetensors file plus a JSON skeleton.

Each component of a checkpoint (model, optimizer, scheduler, rng, data position, ...) is one
`<component>.safetensors` file. Tensors are stored as safetensors tensors, named after their
path in the state (so `model.safetensors` is a plain weights file that any safetensors reader
loads); everything else (numbers, strings, lists, tuples, dicts with any keys) is kept in a
JSON skeleton under the header's `__metadata__`, with tensors referenced by name. Nothing is
pickled: loading a checkpoint never runs code from it.

Tensors are laid out by decreasing element size so every tensor is naturally aligned inside
the data section; that lets a host buffer hold all of them as typed views without padding.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from trainguard.ckpt import DIRECT_IO_ALIGN

SKELETON_KEY = "trainguard.skeleton"
TENSOR_TAG = "__tensor__"
NDARRAY_TAG = "__ndarray__"
TUPLE_TAG = "__tuple__"
DICT_TAG = "__dict__"
BYTES_TAG = "__bytes__"
FLOAT_TAG = "__float__"
_TAGS = (TENSOR_TAG, NDARRAY_TAG, TUPLE_TAG, DICT_TAG, BYTES_TAG, FLOAT_TAG)
HEADER_LENGTH_BYTES = 8
# The data section starts at an O_DIRECT-aligned file offset (the header is space-padded, as
# the safetensors format allows), so it can be written straight from the host buffer.
HEADER_ALIGN = DIRECT_IO_ALIGN
FILE_SUFFIX = ".safetensors"

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.complex64: "C64",
}
DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}

JSON = None | bool | int | float | str | list["JSON"] | dict[str, "JSON"]


class StateFormatError(ValueError):
    """A state value cannot be stored, or a component file is malformed."""


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lives in a component's data section."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ComponentLayout:
    """One component's skeleton and tensor slots; `tensors` are the live sources, slot order."""

    name: str
    skeleton: JSON
    slots: tuple[TensorSlot, ...]
    tensors: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        """Size of the data section."""
        return sum(slot.nbytes for slot in self.slots)

    def header(self) -> bytes:
        """The safetensors header: length prefix and JSON, padded so data starts aligned."""
        metadata = {SKELETON_KEY: json.dumps(self.skeleton, allow_nan=False)}
        # The JSON object of the slots, then "__metadata__" last: the slots' part is the same
        # for every save of a layout and encoded once (an L0 snapshot every step or two).
        raw = (
            _slots_json(self.slots)
            + '"__metadata__":'
            + json.dumps(metadata, separators=(",", ":"))
            + "}"
        ).encode()
        raw += b" " * (-(HEADER_LENGTH_BYTES + len(raw)) % HEADER_ALIGN)
        return len(raw).to_bytes(HEADER_LENGTH_BYTES, "little") + raw

    def signature(self) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
        """What must match for a host buffer laid out for this component to be reused."""
        return tuple((slot.name, slot.dtype, slot.shape) for slot in self.slots)


@functools.lru_cache(maxsize=64)
def _slots_json(slots: tuple[TensorSlot, ...]) -> str:
    """The header's JSON up to its metadata: "{", then each slot's entry followed by ","."""
    entries = {
        slot.name: {
            "dtype": DTYPE_NAMES[slot.dtype],
            "shape": list(slot.shape),
            "data_offsets": [slot.offset, slot.offset + slot.nbytes],
        }
        for slot in slots
    }
    if not entries:
        return "{"
    return json.dumps(entries, separators=(",", ":"))[:-1] + ","


def layout_component(name: str, state: object) -> ComponentLayout:
    """Split `state` into a JSON skeleton and tensor slots (see the module docstring)."""
    found: list[tuple[str, torch.Tensor]] = []
    skeleton = _encode(state, (), found, set())
    # Stable sort: decreasing element size keeps every tensor aligned without padding.
    ordered = sorted(found, key=lambda item: -item[1].element_size())
    slots = []
    tensors = []
    offset = 0
    for tensor_name, tensor in ordered:
        nbytes = tensor.numel() * tensor.element_size()
        slots.append(TensorSlot(tensor_name, tensor.dtype, tuple(tensor.shape), offset, nbytes))
        tensors.append(tensor)
        offset += nbytes
    return ComponentLayout(name, skeleton, tuple(slots), tuple(tensors))


def _numpy() -> Any:
    # numpy is optional: a value can only be a numpy object if numpy is already imported.
    return sys.modules.get("numpy")


def _tensor_name(path: tuple[str, ...], used: set[str]) -> str:
    base = ".".join(path) or "tensor"
    name = base
    counter = 1
    while name in used:
        counter += 1
        name = f"{base}#{counter}"
    used.add(name)
    return name


# Values `_encode` returns unchanged (exact types: a subclass takes the general path).
_PLAIN_TYPES = frozenset({type(None), bool, int, str})


def _encode(
    value: object, path: tuple[str, ...], found: list[tuple[str, torch.Tensor]], used: set[str]
) -> JSON:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {FLOAT_TAG: repr(value)}
    if isinstance(value, torch.Tensor):
        return {TENSOR_TAG: _add_tensor(value, path, found, used)}
    numpy = _numpy()
    if numpy is not None and isinstance(value, numpy.ndarray):
        tensor = torch.from_numpy(numpy.ascontiguousarray(value))
        return {NDARRAY_TAG: _add_tensor(tensor, path, found, used)}
    if numpy is not None and isinstance(value, numpy.generic):
        return _encode(value.item(), path, found, used)
    if isinstance(value, bytes):
        return {BYTES_TAG: base64.b64encode(value).decode()}
    if isinstance(value, list | tuple):
        if all(type(item) in _PLAIN_TYPES for item in value):
            items = list(value)  # stored as they are (Python's RNG state: 625 integers)
        else:
            items = [_encode(item, (*path, str(i)), found, used) for i, item in enumerate(value)]
        return items if isinstance(value, list) else {TUPLE_TAG: items}
    if isinstance(value, Mapping):
        plain = all(isinstance(key, str) and key not in _TAGS for key in value)
        encoded = {
            str(key): _encode(item, (*path, str(key)), found, used) for key, item in value.items()
        }
        if plain:
            return encoded
        keys = [_encode(key, (*path, "key"), found, used) for key in value]
        return {DICT_TAG: [[key, item] for key, item in zip(keys, encoded.values(), strict=True)]}
    where = ".".join(path) or "<root>"
    raise StateFormatError(f"cannot store {type(value).__name__} at {where}")


def _add_tensor(
    tensor: torch.Tensor,
    path: tuple[str, ...],
    found: list[tuple[str, torch.Tensor]],
    used: set[str],
) -> str:
    if tensor.layout != torch.strided:
        where = ".".join(path) or "<root>"
        raise StateFormatError(f"only dense tensors can be stored, {where} is {tensor.layout}")
    if tensor.dtype not in DTYPE_NAMES:
        where = ".".join(path) or "<root>"
        raise StateFormatError(f"dtype {tensor.dtype} at {where} is not supported")
    name = _tensor_name(path, used)
    found.append((name, tensor.detach()))
    return name


def decode_component(data: memoryview | bytearray) -> object:
    """Rebuild a component's state from the bytes of its file."""
    view = memoryview(data)
    if len(view) < HEADER_LENGTH_BYTES:
        raise StateFormatError("component file is shorter than its header length")
    header_len = int.from_bytes(view[:HEADER_LENGTH_BYTES], "little")
    start = HEADER_LENGTH_BYTES + header_len
    if start > len(view):
        raise StateFormatError("component header runs past the end of the file")
    header = json.loads(bytes(view[HEADER_LENGTH_BYTES:start]))
    metadata = header.pop("__metadata__", None) or {}
    if SKELETON_KEY not in metadata:
        raise StateFormatError("component file has no trainguard skeleton")
    raw = torch.frombuffer(data, dtype=torch.uint8) if len(view) > start else None
    tensors: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = DTYPES_BY_NAME[info["dtype"]]
        if raw is None or start + end > len(view):
            raise StateFormatError(f"tensor {name} runs past the end of the file")
        flat = raw[start + begin : start + end].view(dtype)
        # Own storage, not a view at an offset into the file's bytes: some consumers (e.g.
        # torch.set_rng_state in torch 2.13) read a view's storage from its start and crash.
        tensors[name] = flat.view(tuple(info["shape"])).clone()
    return _decode(json.loads(metadata[SKELETON_KEY]), tensors)


def _as_list(tag: str, value: JSON) -> list[JSON]:
    if not isinstance(value, list):
        raise StateFormatError(f"{tag} must hold a list")
    return value


def _decode(value: JSON, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(item, tensors) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag in (TENSOR_TAG, NDARRAY_TAG):
            tensor = tensors[str(inner)]
            return tensor.numpy() if tag == NDARRAY_TAG else tensor
        if tag == TUPLE_TAG:
            return tuple(_decode(item, tensors) for item in _as_list(tag, inner))
        if tag == DICT_TAG:
            result = {}
            for pair in _as_list(tag, inner):
                key, item = _as_list(tag, pair)
                result[_decode(key, tensors)] = _decode(item, tensors)
            return result
        if tag == BYTES_TAG:
            return base64.b64decode(str(inner))
        if tag == FLOAT_TAG:
            return float(str(inner))
    return {key: _decode(item, tensors) for key, item in value.items()}
