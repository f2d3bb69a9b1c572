"""The trainguard Helm chart for the tests: helm itself, rendering, and the rendered objects.

helm is the pinned binary that hack/build-control-plane.sh builds with the control plane.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from trainguard.devcluster.cluster import default_home, ensure_binaries

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "trainguard"
HELM_TIMEOUT_SECONDS = 120

Obj = dict[str, Any]


def helm_binary() -> Path:
    """The pinned helm (built with the control plane when missing)."""
    return ensure_binaries(default_home()) / "helm"


def helm(
    *args: str,
    values: Obj | None = None,
    kubeconfig: Path | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run helm; `values` go in on stdin as one more values file, after any given in args."""
    argv = [str(helm_binary()), *args]
    if values is not None:
        argv += ["--values", "-"]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    result = subprocess.run(
        argv,
        input=yaml.safe_dump(values) if values is not None else None,
        capture_output=True,
        text=True,
        timeout=HELM_TIMEOUT_SECONDS,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render_text(release: str, namespace: str, values: Obj | None = None) -> str:
    """`helm template` output: the chart's templates (not crds/) as one YAML stream."""
    return helm("template", release, str(CHART), "--namespace", namespace, values=values).stdout


def render(release: str, namespace: str, values: Obj | None = None) -> list[Obj]:
    """The objects the chart renders with these values."""
    return [d for d in yaml.safe_load_all(render_text(release, namespace, values)) if d]


def find(objects: Iterable[Obj], kind: str, name: str | None = None) -> list[Obj]:
    """The rendered objects of a kind (and name)."""
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def only(objects: Iterable[Obj], kind: str, name: str | None = None) -> Obj:
    """The one rendered object of a kind (and name)."""
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]
