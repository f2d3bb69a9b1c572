"""Random number generator states, captured with every checkpoint so a resume is exact.

Covers Python's `random`, numpy's global generator when numpy is imported, torch's CPU
generator and, when CUDA has been initialised, every CUDA device's generator.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

PYTHON = "python"
NUMPY = "numpy"
TORCH = "torch"
CUDA = "cuda"


def capture() -> dict[str, Any]:
    """The current state of every generator in use."""
    state: dict[str, Any] = {PYTHON: random.getstate(), TORCH: torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state[NUMPY] = numpy.random.get_state()
    # Reading CUDA states would initialise CUDA in a process that never used it.
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state[CUDA] = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
    return state


def restore(state: dict[str, Any]) -> None:
    """Put every generator back in a captured state (those absent here are left alone)."""
    random.setstate(state[PYTHON])
    torch.set_rng_state(state[TORCH])
    if NUMPY in state:
        import numpy

        numpy.random.set_state(state[NUMPY])
    if CUDA in state and torch.cuda.is_available():
        devices = torch.cuda.device_count()
        for index, device_state in enumerate(state[CUDA][:devices]):
            torch.cuda.set_rng_state(device_state, index)
