"""What `trainguard demo` watches: the run, its pod, and the trainer's own files.

The run's status and pods come from the apiserver (as the cluster admin). The trainer's
heartbeat and the restore step's record are files in the pod's state volume, and the
trainer's output a file beside it; where they are depends on the nodes (`PodFiles`, given by
`trainguard_dev.demo.nodes`). The display prints the narration and a progress line: refreshed
in place on a terminal, a plain line every few seconds otherwise.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from trainguard.api.constants import API_VERSION, LABEL_RUN, PLURAL
from trainguard.contract.files import RESTORE_FILENAME, read_json
from trainguard.operator.k8s.client import Kube, object_path
from trainguard_dev.testing.pods import heartbeat

Obj = dict[str, Any]

RESTORE = RESTORE_FILENAME
# The reference trainer logs "...; steps <first>..<last>" once it has resumed.
START_LINE = re.compile(r"steps (\d+)\.\.\d+")
PLAIN_PROGRESS_SECONDS = 5.0
L1 = "l1"


@dataclass(frozen=True)
class PodFiles:
    """Where a pod's files are on its node, read from this machine."""

    state: Path  # the state volume: heartbeat, restore record
    logs: Path  # the directory of its containers' output
    trainer_log: str  # the trainer container's output in `logs` (a glob: one file a start)


@dataclass(frozen=True)
class PodView:
    """A pod of the run that is bound to a node, and where its files are."""

    name: str
    uid: str
    node: str
    files: PodFiles
    deleting: bool

    def heartbeat(self) -> Obj | None:
        """The trainer's heartbeat file, or None before the first one."""
        return heartbeat(self.files.state)

    def restore(self) -> Obj | None:
        """What the restore init step did (``step``, ``from_layer``), or None."""
        return read_json(self.files.state / RESTORE)

    def start_steps(self) -> list[int]:
        """The step each trainer process of this pod resumed from, in order."""
        paths = sorted(
            self.files.logs.glob(self.files.trainer_log), key=lambda p: (len(p.name), p.name)
        )
        text = ""
        for path in paths:
            try:
                text += path.read_text(errors="replace")
            except OSError:
                continue
        return [int(found) - 1 for found in START_LINE.findall(text)]


class Observer:
    """Reads the demo run's status, pods, nodes and Events."""

    def __init__(
        self, kube: Kube, locate: Callable[[Obj], PodFiles], namespace: str, run: str
    ) -> None:
        self.kube = kube
        self.locate = locate
        self.namespace = namespace
        self.run_name = run

    def run(self) -> Obj | None:
        """The TrainingRun, or None when it does not exist."""
        return self.kube.get(object_path(API_VERSION, PLURAL, self.namespace, self.run_name))

    def status(self) -> Obj:
        """The run's status ({} before the operator writes one)."""
        run = self.run()
        return dict(run.get("status") or {}) if run else {}

    def pods(self) -> list[PodView]:
        """The run's pods that are bound to a node, oldest first."""
        listed = self.kube.request(
            "GET",
            object_path("v1", "pods", self.namespace, None),
            query={"labelSelector": f"{LABEL_RUN}={self.run_name}"},
        )
        items = sorted(listed.get("items", []), key=lambda p: p["metadata"]["creationTimestamp"])
        views = []
        for pod in items:
            meta, node = pod["metadata"], pod["spec"].get("nodeName")
            if not node:
                continue
            deleting = bool(meta.get("deletionTimestamp"))
            views.append(PodView(meta["name"], meta["uid"], node, self.locate(pod), deleting))
        return views

    def current_pod(self) -> PodView | None:
        """The newest bound pod that is not being deleted."""
        live = [p for p in self.pods() if not p.deleting]
        return live[-1] if live else None

    def node(self, name: str) -> Obj | None:
        """A node, or None when it is gone."""
        return self.kube.get(object_path("v1", "nodes", None, name))

    def events(self) -> list[Obj]:
        """The Events about the run."""
        selector = f"involvedObject.kind=TrainingRun,involvedObject.name={self.run_name}"
        listed = self.kube.request(
            "GET",
            object_path("v1", "events", self.namespace, None),
            query={"fieldSelector": selector},
        )
        items: list[Obj] = listed.get("items", [])
        return items


@dataclass
class Checkpoints:
    """The verified checkpoints seen per layer over the demo (from the run's status)."""

    seen: dict[str, set[int]] = field(default_factory=dict)

    def observe(self, status: Obj, beat: Obj | None = None) -> None:
        """Record the newest verified checkpoint of each layer in this status and heartbeat.

        The trainer reports a checkpoint in its heartbeat once it is saved and verified in L1.
        """
        for layer in status.get("checkpoints") or []:
            if layer.get("verified") and layer.get("step") is not None:
                self.seen.setdefault(layer["layer"], set()).add(int(layer["step"]))
        saved = (beat or {}).get("last_checkpoint_step")
        if saved:
            self.seen.setdefault(L1, set()).add(int(saved))

    def counts(self) -> dict[str, int]:
        """Verified checkpoints seen, per layer."""
        return {layer: len(steps) for layer, steps in sorted(self.seen.items())}


def progress_line(status: Obj, beat: Obj | None) -> str:
    """One line: step, tokens/s, checkpoints per layer, node, attempt, verdict."""
    step = (beat or {}).get("step", status.get("step"))
    rate = (beat or {}).get("tokens_per_s", status.get("tokensPerSecond"))
    parts = [f"step {step if step is not None else '-'}"]
    parts.append(f"{rate:,.0f} tokens/s" if isinstance(rate, int | float) else "- tokens/s")
    layers = []
    reported = status.get("checkpoints") or []
    saved = (beat or {}).get("last_checkpoint_step", status.get("checkpointStep"))
    if saved and not any(layer.get("layer") == L1 for layer in reported):
        layers.append(f"{L1}@{saved}")
    for layer in reported:
        mark = "verified" if layer.get("verified") else "unverified"
        shipping = (layer.get("shipping") or {}).get("state")
        extra = f", {shipping.lower()}" if shipping and shipping != "Verified" else ""
        layers.append(f"{layer['layer']}@{layer.get('step', '-')} ({mark}{extra})")
    parts.append("checkpoints " + (" ".join(layers) if layers else "none yet"))
    parts.append(f"node {status.get('node') or '-'}")
    parts.append(f"attempt {status.get('attempt') or '-'}")
    parts.append(status.get("verdict") or status.get("phase") or "Pending")
    return " | ".join(parts)


class Display:
    """Narration lines and a progress line on one stream."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self._progress_shown = False
        self._last_plain = 0.0

    def elapsed(self) -> float:
        """Seconds since the demo started."""
        return time.monotonic() - self.started

    def say(self, message: str) -> None:
        """One narration line, stamped with the demo's elapsed time."""
        self._clear()
        print(f"[{self.elapsed():6.1f}s] {message}", file=self.stream, flush=True)

    def text(self, message: str = "") -> None:
        """Plain text (setup output, the summary)."""
        self._clear()
        print(message, file=self.stream, flush=True)

    def progress(self, line: str) -> None:
        """The progress line: in place on a terminal, else every few seconds."""
        if self.tty:
            # Cut to the terminal's width: a wrapped line could not be redrawn in place.
            width = shutil.get_terminal_size().columns - 3
            print(f"\r\x1b[K  {line[:width]}", end="", file=self.stream, flush=True)
            self._progress_shown = True
        elif time.monotonic() - self._last_plain >= PLAIN_PROGRESS_SECONDS:
            self._last_plain = time.monotonic()
            print(f"[{self.elapsed():6.1f}s]   {line}", file=self.stream, flush=True)

    def _clear(self) -> None:
        if self._progress_shown:
            print("\r\x1b[K", end="", file=self.stream, flush=True)
            self._progress_shown = False
