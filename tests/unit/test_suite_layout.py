"""The suite collects as one: no two test modules outside a package share a basename.

pytest imports a test module outside a package by its basename (rootdir-relative imports), so
a second `test_x.py` in another tier makes the whole suite's collection fail, not just the
tier it was added to.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

TESTS = Path(__file__).resolve().parents[1]


def test_test_modules_outside_packages_have_unique_basenames() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for module in TESTS.rglob("test_*.py"):
        if (module.parent / "__init__.py").exists():
            continue  # imported by its package path, unique already
        seen[module.name].append(str(module.relative_to(TESTS)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
