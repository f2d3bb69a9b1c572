"""Waiting until something holds: the one polling loop of the tests, benchmarks and demo.

`eventually` calls a check until it returns something truthy and hands that back; when the
time is up it raises `TimeoutError` naming what never happened. `holds` is its converse: a
check that must stay true for a while. Specialised waits are thin calls to these.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 60.0
DEFAULT_INTERVAL = 0.3


def eventually(
    check: Callable[[], T | None],
    timeout: float = DEFAULT_TIMEOUT,
    what: str = "",
    interval: float = DEFAULT_INTERVAL,
    *,
    detail: Callable[[], object] | None = None,
) -> T:
    """Call `check` every `interval` s until it returns something truthy; return that.

    After `timeout` s (measured from the call; the check runs at least once) it raises
    `TimeoutError` naming `what`, followed by `detail()` when given (the state at the time).
    An exception raised by `check` ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout:.0f} s waiting for {what or _name(check)}"
            if detail is not None:
                message += f": {detail()}"
            raise TimeoutError(message)
        time.sleep(interval)


def holds(
    check: Callable[[], Any], seconds: float, what: str, interval: float = DEFAULT_INTERVAL
) -> None:
    """Fail (AssertionError naming `what`) unless `check` stays truthy for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check(), what
        time.sleep(interval)


def seconds_left(deadline: float) -> float:
    """The seconds until `deadline` (a `time.monotonic()` value), never below zero."""
    return max(0.0, deadline - time.monotonic())


def _name(check: Callable[[], Any]) -> str:
    return getattr(check, "__qualname__", None) or repr(check)
