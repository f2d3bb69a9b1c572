"""Recording the statuses the operator writes to TrainingRuns, as the e2e tier sees them.

With `TRAINGUARD_RECORD_STATUSES=<dir>` set, the e2e tier (`tests/e2e/conftest.py`) runs a
`StatusRecorder`: `kubectl get trainingruns --all-namespaces --watch -o json` in a thread,
which sees every version of every run. Each version whose case (`case_key`: its phase,
whether its status is older than its spec, and each condition's type, status, reason and
whether it was set for an older spec) is new is written whole to `<dir>/<n>.yaml`, under a
comment naming the test during which it was seen. A version counts only if the operator wrote
its status (`written_by_operator`): a test that writes a status itself (to set the scene) is
not the operator speaking. A run being deleted is left out: Argo CD reports deletion itself,
before any health check runs.

`read_recorded` reads such a directory back; `trainguard_dev.argocd_fixtures` turns it into
the Argo CD health check's fixtures.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainguard.operator.build.constants import FIELD_MANAGER
from trainguard_dev.testing.processes import stop_process

Obj = dict[str, Any]
Condition = tuple[str, str, str, bool]
CaseKey = tuple[str | None, bool, tuple[Condition, ...]]

RECORD_ENV = "TRAINGUARD_RECORD_STATUSES"
RECORD_SUFFIX = ".yaml"
# The first line of a record: `# recorded during <pytest node id>`.
RECORDED_DURING = "# recorded during "
STATUS_SUBRESOURCE = "status"
LIST_SUFFIX = "List"
# A watch that ended (the apiserver closes long watches; the CRD may not exist yet when the
# recording starts) is started again after this pause; it lists every run again first.
RESTART_SECONDS = 1.0
STOP_SECONDS = 10.0


def watch_command(kubectl: Sequence[str]) -> list[str]:
    """The kubectl command (`kubectl` with its options) that prints every run's versions.

    kubectl hides `managedFields` unless asked: `written_by_operator` reads them.
    """
    return [*kubectl, "get", "trainingruns.trainguard.dev", "--all-namespaces", "--watch",
            "--show-managed-fields", "-o", "json"]  # fmt: skip


def json_objects(lines: Iterable[str]) -> Iterator[Obj]:
    """The objects of kubectl's `-o json` stream: indented documents, one after another.

    A document ends with a `}` alone on its line (its nested objects are indented). A list
    (`kind: List`) stands for its items.
    """
    buffer: list[str] = []
    for line in lines:
        buffer.append(line)
        if line.rstrip("\r\n") == "}":
            obj: Obj = json.loads("".join(buffer))
            buffer = []
            if str(obj.get("kind", "")).endswith(LIST_SUFFIX) and "items" in obj:
                yield from obj["items"]
            else:
                yield obj


def older_than(observed: int | None, generation: int | None) -> bool:
    """Whether something observed for generation `observed` is older than `generation`."""
    return observed is not None and generation is not None and observed < generation


def case_key(obj: Obj) -> CaseKey:
    """What makes a version of a run a case of its own (see the module's docstring)."""
    status = obj.get("status") or {}
    generation = obj.get("metadata", {}).get("generation")
    conditions = tuple(
        sorted(
            (
                str(c.get("type")),
                str(c.get("status")),
                str(c.get("reason", "")),
                older_than(c.get("observedGeneration"), generation),
            )
            for c in status.get("conditions") or []
        )
    )
    return status.get("phase"), older_than(status.get("observedGeneration"), generation), conditions


def written_by_operator(obj: Obj) -> bool:
    """Whether the operator wrote the run's status last (or nobody wrote one yet).

    The apiserver keeps, per field manager, when it last wrote the status subresource
    (`metadata.managedFields`, to the second). A tie counts against the operator: its next
    write is recorded instead.
    """
    if not obj.get("status"):
        return True
    writes = [
        entry
        for entry in obj.get("metadata", {}).get("managedFields") or []
        if entry.get("subresource") == STATUS_SUBRESOURCE
    ]
    ours = [str(e.get("time", "")) for e in writes if e.get("manager") == FIELD_MANAGER]
    theirs = [str(e.get("time", "")) for e in writes if e.get("manager") != FIELD_MANAGER]
    return bool(ours) and (not theirs or max(ours) > max(theirs))


@dataclass(frozen=True)
class Recorded:
    """One recorded version of a run, and the test during which it was seen."""

    path: Path
    test: str
    obj: Obj


def write_record(path: Path, test: str, obj: Obj) -> None:
    """A record: the comment naming the test, then the object as YAML."""
    body = yaml.safe_dump(obj, sort_keys=False, width=100, allow_unicode=True)
    path.write_text(f"{RECORDED_DURING}{test}\n{body}")


def _number(path: Path) -> int:
    return int(path.stem) if path.stem.isdigit() else -1


def record_paths(directory: Path) -> list[Path]:
    """The records of a directory, in the order they were written."""
    found = [p for p in directory.glob(f"*{RECORD_SUFFIX}") if p.stem.isdigit()]
    return sorted(found, key=_number)


def read_recorded(directory: Path) -> list[Recorded]:
    """Every record of a directory, in the order they were written."""
    records = []
    for path in record_paths(directory):
        text = path.read_text()
        first = text.partition("\n")[0]
        test = first.removeprefix(RECORDED_DURING) if first.startswith(RECORDED_DURING) else ""
        records.append(Recorded(path, test, yaml.safe_load(text)))
    return records


class StatusRecorder:
    """Writes each new case of a run's status it sees to `<out>/<n>.yaml` (see the module).

    `command` prints the runs' versions as kubectl's `-o json` watch does (`watch_command`).
    `test` names the test under way: a namespace's runs are credited to the test during which
    the recorder first saw that namespace (each e2e test has a namespace of its own). Cases
    already in `out` are not written again, so several sessions can add to one directory.
    """

    def __init__(self, command: Sequence[str], out: Path) -> None:
        self.command = list(command)
        self.out = out
        self.test = ""
        self._tests: dict[str, str] = {}
        out.mkdir(parents=True, exist_ok=True)
        existing = read_recorded(out)
        self._seen = {case_key(r.obj) for r in existing}
        self._count = max((_number(r.path) for r in existing), default=0)
        self._stopping = threading.Event()
        # Guards the watch process: `stop` must not miss one started as it stops.
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._watch, name="status-recorder", daemon=True)

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; what was seen is on disk."""
        with self._lock:
            self._stopping.set()
            stop_process(self._process)
        self._thread.join(STOP_SECONDS)

    def offer(self, obj: Obj) -> Path | None:
        """Write a version of a run if it is a new case the operator wrote; its path, if so."""
        meta = obj.get("metadata", {})
        if meta.get("deletionTimestamp") or not written_by_operator(obj):
            return None
        key = case_key(obj)
        if key in self._seen:
            return None
        self._seen.add(key)
        self._count += 1
        test = self._tests.setdefault(str(meta.get("namespace", "")), self.test)
        path = self.out / f"{self._count:04d}{RECORD_SUFFIX}"
        write_record(path, test, obj)
        return path

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._stopping.is_set():
                    return
                process = subprocess.Popen(
                    self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
                )
                self._process = process
            assert process.stdout is not None
            for obj in json_objects(process.stdout):
                self.offer(obj)
            process.wait()
            self._stopping.wait(RESTART_SECONDS)
