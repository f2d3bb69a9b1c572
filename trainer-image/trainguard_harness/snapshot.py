"""The blocking part of a save: copying training state into reused host buffers.

One flat byte buffer holds every tensor of every component, each as a typed view at a fixed
offset. It is allocated once (pinned when the state lives on a GPU, so device-to-host copies
run at full speed and asynchronously) and reused by every later save with the same layout, so
a save costs one copy at memory bandwidth instead of an allocation plus page faults. Because a
save never starts before the previous one is persisted, one buffer is enough.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from trainguard.ckpt import DIRECT_IO_ALIGN
from trainguard_harness.tensorfile import ComponentLayout, layout_component

# Component regions start at O_DIRECT-aligned addresses, so the writer can send them to the
# device without a page-cache copy; tensors inside are aligned by their order.
REGION_ALIGN = DIRECT_IO_ALIGN


@dataclass(frozen=True)
class Plan:
    """Where each component's data section lives in the host buffer."""

    components: tuple[ComponentLayout, ...]
    offsets: tuple[int, ...]
    nbytes: int
    on_gpu: bool


def plan_state(state: Mapping[str, object]) -> Plan:
    """Lay out `state` (component name -> state value) in one buffer."""
    components = tuple(layout_component(name, value) for name, value in state.items())
    offsets = []
    offset = 0
    for component in components:
        offsets.append(offset)
        offset += component.nbytes + (-component.nbytes % REGION_ALIGN)
    on_gpu = any(tensor.is_cuda for component in components for tensor in component.tensors)
    return Plan(components, tuple(offsets), offset, on_gpu)


@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of the state in host memory, ready to be written in the background."""

    plan: Plan
    buffer: torch.Tensor

    def data(self, index: int) -> memoryview:
        """The bytes of component `index`'s data section, without copying them."""
        component = self.plan.components[index]
        start = self.buffer.data_ptr() + self.plan.offsets[index]
        # ctypes exposes the buffer's memory as a Python buffer even without numpy installed.
        array = (ctypes.c_char * component.nbytes).from_address(start)
        return memoryview(array).cast("B")


class HostSnapshotter:
    """Owns the reused host buffer and copies state into it."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._pinned = False
        # The typed views of the buffer the last plan copied into, and that plan's layout:
        # a save with the same layout (every save once shapes are final) reuses them.
        self._targets: list[torch.Tensor] = []
        self._targets_layout: object = None

    @property
    def capacity(self) -> int:
        """Bytes currently allocated."""
        return 0 if self._buffer is None else self._buffer.numel()

    def ensure(self, plan: Plan) -> torch.Tensor:
        """Return a buffer large enough for `plan`, allocating (and faulting in) one if needed."""
        pinned = plan.on_gpu and torch.cuda.is_available()
        if self._buffer is not None and self.capacity >= plan.nbytes and self._pinned == pinned:
            return self._buffer
        self._buffer = None  # release the old one before allocating its replacement
        self._targets, self._targets_layout = [], None
        raw = torch.empty(plan.nbytes + REGION_ALIGN, dtype=torch.uint8, pin_memory=pinned)
        shift = -raw.data_ptr() % REGION_ALIGN
        buffer = raw[shift : shift + max(plan.nbytes, 1)]
        # Touch every page now so the first save does not pay the page faults.
        buffer.fill_(0)
        self._buffer, self._pinned = buffer, pinned
        return buffer

    def capture(self, plan: Plan) -> Snapshot:
        """Copy every tensor of `plan` into the buffer; returns when the copy is complete."""
        buffer = self.ensure(plan)
        targets = self._targets_for(plan, buffer)
        sources = [source for component in plan.components for source in component.tensors]
        for target, source in zip(targets, sources, strict=True):
            target.copy_(source, non_blocking=self._pinned)
        devices = {source.device for source in sources if source.is_cuda} if plan.on_gpu else ()
        for device in devices:
            # Non-blocking copies into pinned memory are complete only after a sync.
            torch.cuda.synchronize(device)
        return Snapshot(plan, buffer)

    def _targets_for(self, plan: Plan, buffer: torch.Tensor) -> list[torch.Tensor]:
        """The view of `buffer` each tensor of `plan` is copied into, in slot order."""
        layout = (plan.offsets, tuple(component.slots for component in plan.components))
        if layout != self._targets_layout:
            self._targets = [
                buffer[region + slot.offset : region + slot.offset + slot.nbytes]
                .view(slot.dtype)
                .view(slot.shape)
                for component, region in zip(plan.components, plan.offsets, strict=True)
                for slot in component.slots
            ]
            self._targets_layout = layout
        return self._targets
