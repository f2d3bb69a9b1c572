"""Kubernetes quantities (`100Gi`, `500m`, `1.5e9`, `8`) as exact numbers; byte counts as text."""

from __future__ import annotations

from decimal import Decimal

from trainguard.api.base import python_regex
from trainguard.api.types import QUANTITY_RE

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = python_regex(QUANTITY_RE)


def parse_quantity(quantity: int | str) -> Decimal:
    """The value of a non-negative quantity; ValueError if it is not one."""
    if isinstance(quantity, int):
        if quantity < 0:
            raise ValueError(f"negative quantity: {quantity}")
        return Decimal(quantity)
    if not _QUANTITY.search(quantity):
        raise ValueError(f"not a quantity: {quantity!r}")
    for suffix, factor in _BINARY.items():
        if quantity.endswith(suffix):
            return Decimal(quantity[: -len(suffix)]) * factor
    if quantity[-1] in _DECIMAL and not quantity[-1].isdigit():
        # "E" is both exa and the exponent marker: "1E" is exa, "1E3" an exponent.
        return Decimal(quantity[:-1]) * _DECIMAL[quantity[-1]]
    return Decimal(quantity)


def quantity_bytes(quantity: int | str) -> int:
    """A size quantity in whole bytes, rounded up (a volume must be at least this big)."""
    value = parse_quantity(quantity)
    whole = int(value)
    return whole if whole == value else whole + 1


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(count: float) -> str:
    """A byte count for a log line or a message: 1.5 GiB, 340.0 MiB, 12 B."""
    value, unit = float(count), 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{value:.0f} B" if unit == 0 else f"{value:.1f} {_UNITS[unit]}"
