"""Prometheus's own tools for the tests: promtool and promqlnames, and the operator's metric names.

`hack/build-prometheus-tools.sh` builds both from the Prometheus module pinned in
hack/tools/prometheus (hack/setup.sh runs it, so the tests normally find them cached):
promtool checks and unit-tests rule files, promqlnames lists the metrics PromQL expressions
read, with the parser Prometheus itself uses.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from prometheus_client import generate_latest

from trainguard.operator.metrics import REGISTRY

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "hack" / "build-prometheus-tools.sh"
# A cold build (empty Go build cache) took about 4 minutes on two cores; a warm one only
# checks the cache.
BUILD_TIMEOUT_SECONDS = 600
RUN_TIMEOUT_SECONDS = 120
# Sample names of a family beyond its own, by its type in the text exposition: a classic
# histogram is read through these three and never by its bare name.
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}


@cache
def tools() -> Path:
    """The directory holding promtool and promqlnames (built when missing)."""
    built = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
        check=False,
    )
    if built.returncode != 0:
        raise AssertionError(f"{BUILD_SCRIPT.name} failed:\n{built.stderr}")
    return Path(built.stdout.strip().splitlines()[-1])


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run promtool (its exit status is the caller's to judge)."""
    return subprocess.run(
        [str(tools() / "promtool"), *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
        check=False,
    )


def metric_names(exprs: Sequence[str]) -> dict[str, set[str]]:
    """The metrics each PromQL expression reads; "" for a selector naming none by equality."""
    done = subprocess.run(
        [str(tools() / "promqlnames")],
        input=json.dumps(list(exprs)),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
        check=False,
    )
    results = [json.loads(line) for line in done.stdout.splitlines()]
    errors = [f"{r['expr']!r}: {r['error']}" for r in results if r.get("error")]
    if done.returncode != 0 or errors:
        raise AssertionError(f"queries that do not parse: {errors or done.stderr}")
    return {r["expr"]: set(r["names"]) for r in results}


def exported_names() -> set[str]:
    """The sample names the operator's /metrics serves, read off its text exposition.

    Every family is announced by its `# TYPE` line even before it has a sample (a counter with
    labels gets its first when first incremented), so the names come from those lines and the
    sample names each type implies.
    """
    text = generate_latest(REGISTRY).decode()
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE):
        names.update(name + suffix for suffix in SUFFIXES.get(kind, ("",)))
    return names
