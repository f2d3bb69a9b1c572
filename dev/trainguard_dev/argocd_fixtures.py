"""Generate the Argo CD health check's fixtures from the statuses the operator wrote in e2e runs.

`python -m trainguard_dev.argocd_fixtures --recorded <dir>` reads what the e2e tier recorded
with `TRAINGUARD_RECORD_STATUSES=<dir>` (`trainguard_dev.testing.statuses`; the whole round is
`hack/record-argocd-fixtures.sh`) and writes, under `--out` (`charts/trainguard/argocd`):

- `testdata/<phase>-<reason>[-<qualifier>].yaml`: one recorded run per case (`Case`: its phase,
  the reason of its state, whether its status is older than its spec, and the status of each
  condition the check reads, for the current spec or an older one), the first recorded; its
  metadata cut to name, namespace and generation, its spec and status as recorded;
- `health_test.yaml`: the table the test runs, in Argo CD's own layout. Each expectation comes
  from `RULES`, the rules of docs/argocd.md written as data, never from running the script:
  the test then shows that health.lua agrees with them on everything the operator wrote.

Nothing is written unless the recording covers every phase, every
rule (bar those marked `unrecorded`), and a run that goes on after a repeated failure
(`recovery.onRepeatedFailure: Continue`), the case the check once read as Healthy.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from trainguard.api import TrainingRun
from trainguard.api.constants import (
    ConditionStatus,
    ConditionType,
    OnRepeatedFailure,
    Phase,
)
from trainguard_dev.testing.statuses import Recorded, older_than, read_recorded

Obj = dict[str, Any]

OUT = Path("charts") / "trainguard" / "argocd"
TESTDATA = "testdata"
TESTS_FILE = "health_test.yaml"
KEPT_METADATA = ("name", "namespace", "generation")
GENERATED_BY = "python -m trainguard_dev.argocd_fixtures"
REGENERATE = "hack/record-argocd-fixtures.sh"
NO_STATUS = "no-status"
# The condition whose reason names the run's state (the operator's `STATE_CONDITION`).
STATE_CONDITION = ConditionType.PROGRESSING
REPEATED = (ConditionType.REPEATED_FAILURE_AT_STEP.value, ConditionStatus.TRUE.value)


class Health(StrEnum):
    """The health statuses the check gives (Argo CD's names)."""

    HEALTHY = "Healthy"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    SUSPENDED = "Suspended"


class Fact(StrEnum):
    """What a rule of the check looks at."""

    NOT_REPORTED = "not reported"  # no status, or no condition in it
    STALE = "stale"  # status.observedGeneration < metadata.generation
    HOLDS = "holds"  # a condition has a status, set for the current spec
    OTHERWISE = "otherwise"


WAITING = "Waiting for the trainguard operator to report on the run"
STALE_MESSAGE = (
    "Waiting for the trainguard operator to observe generation {generation} "
    "(status is for generation {observed})"
)


@dataclass(frozen=True)
class Rule:
    """One row of docs/argocd.md's table: when it applies and the health it gives.

    A `HOLDS` rule's message is its condition's `<reason>: <message>`. `unrecorded` says why
    no e2e run records a status this rule decides (the rule stays, for any status that comes).
    """

    row: str
    health: Health
    fact: Fact
    condition: ConditionType | None = None
    status: ConditionStatus = ConditionStatus.TRUE
    unrecorded: str | None = None


# The check's rules, first match wins: health.lua has the same order and the same rows.
RULES: tuple[Rule, ...] = (
    Rule("no status, or no condition set yet", Health.PROGRESSING, Fact.NOT_REPORTED),
    Rule("`status.observedGeneration` < `metadata.generation`", Health.PROGRESSING, Fact.STALE),
    Rule(
        "`Failed=True` (`MaxRestartsExceeded`, `RepeatedFailureAtStep` with `Stop`, "
        "`InvalidSpec`, `DataSourceUnreachable`)",
        Health.DEGRADED,
        Fact.HOLDS,
        ConditionType.FAILED,
    ),
    Rule("`Complete=True`", Health.HEALTHY, Fact.HOLDS, ConditionType.COMPLETE),
    Rule("`Suspended=True`", Health.SUSPENDED, Fact.HOLDS, ConditionType.SUSPENDED),
    Rule(
        "`RepeatedFailureAtStep=True`, whatever `Ready` and `Degraded` say",
        Health.DEGRADED,
        Fact.HOLDS,
        ConditionType.REPEATED_FAILURE_AT_STEP,
    ),
    Rule(
        "`Degraded=True` (`PodFailed`)",
        Health.DEGRADED,
        Fact.HOLDS,
        ConditionType.DEGRADED,
    ),
    Rule("`Ready=True` (`Training`)", Health.HEALTHY, Fact.HOLDS, ConditionType.READY),
    Rule(
        "`Progressing=True` (`Scheduling`, `Starting`, `Rescheduling`, `SpecChanged`, "
        "`Resumed`, `PodDeleted`)",
        Health.PROGRESSING,
        Fact.HOLDS,
        ConditionType.PROGRESSING,
    ),
    Rule(
        "`Progressing=False` (`NetworkVolumeOnHotPath`, `Unschedulable`, `ImagePullFailed`, "
        "`SecretNotFound`, `ClaimNotFound`)",
        Health.DEGRADED,
        Fact.HOLDS,
        ConditionType.PROGRESSING,
        ConditionStatus.FALSE,
    ),
    Rule(
        "none of the above",
        Health.PROGRESSING,
        Fact.OTHERWISE,
        unrecorded="the operator sets Progressing, True or False, in every status it writes",
    ),
)
# The condition types the check reads.
DECIDING = tuple(dict.fromkeys(r.condition for r in RULES if r.condition is not None))


class GenerationError(Exception):
    """The recording cannot make a complete set of fixtures."""


def _conditions(obj: Obj) -> list[Obj]:
    conditions: list[Obj] = (obj.get("status") or {}).get("conditions") or []
    return conditions


def _find(obj: Obj, kind: str) -> Obj | None:
    return next((c for c in _conditions(obj) if c.get("type") == kind), None)


def _generation(obj: Obj) -> int | None:
    generation: int | None = obj.get("metadata", {}).get("generation")
    return generation


def stale(obj: Obj) -> bool:
    """Whether the run's status describes an older spec than its own."""
    return older_than((obj.get("status") or {}).get("observedGeneration"), _generation(obj))


def holds(obj: Obj, kind: str, status: ConditionStatus = ConditionStatus.TRUE) -> bool:
    """Whether the condition has this status and was set for the run's current spec."""
    found = _find(obj, kind)
    return (
        found is not None
        and found.get("status") == status
        and not older_than(found.get("observedGeneration"), _generation(obj))
    )


def applies(rule: Rule, obj: Obj) -> bool:
    """Whether the rule applies to the run."""
    if rule.fact is Fact.NOT_REPORTED:
        return not _conditions(obj)
    if rule.fact is Fact.STALE:
        return stale(obj)
    if rule.fact is Fact.HOLDS:
        return rule.condition is not None and holds(obj, rule.condition, rule.status)
    return True


def deciding(obj: Obj) -> Rule:
    """The first rule that applies to the run."""
    return next(rule for rule in RULES if applies(rule, obj))


def describe(condition: Obj) -> str:
    """A condition as the check words it: `<reason>: <message>`, or the first of those it has."""
    reason, message = condition.get("reason"), condition.get("message")
    if reason is not None and message:
        return f"{reason}: {message}"
    return str(next(v for v in (reason, message, condition.get("type")) if v is not None))


def expected(obj: Obj) -> dict[str, str]:
    """The health the rules give the run: `{status, message}`, as health_test.yaml has it."""
    rule = deciding(obj)
    if rule.fact is Fact.STALE:
        observed = (obj.get("status") or {}).get("observedGeneration")
        message = STALE_MESSAGE.format(generation=_generation(obj), observed=observed)
    elif rule.fact is Fact.HOLDS and rule.condition is not None:
        found = _find(obj, rule.condition)
        assert found is not None  # the rule applies
        message = describe(found)
    else:
        message = WAITING
    return {"status": rule.health.value, "message": message}


def continues_after_repeated_failure(obj: Obj) -> bool:
    """Whether the run goes on in a repeated-failure pattern, as `Continue` asked."""
    recovery = obj.get("spec", {}).get("recovery") or {}
    return (
        recovery.get("onRepeatedFailure") == OnRepeatedFailure.CONTINUE
        and holds(obj, ConditionType.REPEATED_FAILURE_AT_STEP)
        and not holds(obj, ConditionType.FAILED)
    )


def _statuses(obj: Obj, older: bool) -> tuple[tuple[str, str], ...]:
    """(type, status) of each deciding condition set for the current spec, or for an older one."""
    found = []
    for kind in DECIDING:
        condition = _find(obj, kind)
        if condition is None or condition.get("status") not in set(ConditionStatus):
            continue
        if older_than(condition.get("observedGeneration"), _generation(obj)) is older:
            found.append((kind.value, str(condition["status"])))
    return tuple(found)


@dataclass(frozen=True)
class Case:
    """What tells one fixture from another: the facts the check reads, and how it is named."""

    phase: str | None
    reason: str
    stale: bool
    current: tuple[tuple[str, str], ...]  # deciding conditions set for the current spec
    older: tuple[tuple[str, str], ...]  # and those set for an older spec

    @classmethod
    def of(cls, obj: Obj) -> Case:
        """The case of a recorded run."""
        state = _find(obj, STATE_CONDITION)
        return cls(
            (obj.get("status") or {}).get("phase"),
            str(state.get("reason", "")) if state else "",
            stale(obj),
            _statuses(obj, older=False),
            _statuses(obj, older=True),
        )

    def name(self) -> str:
        """The fixture's name: phase and reason, with what else sets the case apart."""
        if self.phase is None and not self.current and not self.older:
            return NO_STATUS
        parts = [self.phase or "no-phase", self.reason]
        # A stale status has every condition set for an older spec.
        repeated = REPEATED in (self.older if self.stale else self.current)
        if repeated and self.reason != ConditionType.REPEATED_FAILURE_AT_STEP:
            parts.append("repeated-failure")
        if self.stale:
            parts.append("stale")
        elif REPEATED in self.older:
            parts.append("repeated-failure-of-older-spec")
        return "-".join(kebab(part) for part in parts if part)


def kebab(text: str) -> str:
    """`RestartingInPlace` as `restarting-in-place` (`GPUMemory...` as `gpu-memory-...`)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", text).lower()


@dataclass(frozen=True)
class Fixture:
    """One fixture: its file name, the run as written, the expectation and where it came from."""

    name: str
    obj: Obj
    health: dict[str, str]
    rule: Rule
    test: str


def stripped(obj: Obj) -> Obj:
    """The run without what changes from one recording to the next and the check never reads."""
    meta = obj.get("metadata", {})
    kept: Obj = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {key: meta[key] for key in KEPT_METADATA if key in meta},
        "spec": obj.get("spec"),
    }
    if "status" in obj:
        kept["status"] = obj["status"]
    return kept


def fixtures(records: Sequence[Recorded]) -> list[Fixture]:
    """One fixture per case, from the first record of each; named, with its expectation."""
    first: dict[Case, Recorded] = {}
    for record in records:
        try:
            TrainingRun.from_object(record.obj)
        except ValueError as err:
            raise GenerationError(f"{record.path} is not a TrainingRun of this API: {err}") from err
        first.setdefault(Case.of(record.obj), record)
    named: dict[str, int] = {}
    made = []
    for case, record in sorted(first.items(), key=lambda item: item[0].name()):
        base = case.name()
        named[base] = named.get(base, 0) + 1
        name = base if named[base] == 1 else f"{base}-{named[base]}"
        obj = stripped(record.obj)
        made.append(Fixture(name, obj, expected(obj), deciding(obj), record.test))
    return made


def gaps(made: Sequence[Fixture]) -> list[str]:
    """What a complete set of fixtures has and these lack."""
    phases = {f.obj.get("status", {}).get("phase") for f in made}
    missing = [f"no run in phase {phase}" for phase in Phase if phase.value not in phases]
    decided = {f.rule for f in made}
    missing += [
        f'no run that the rule "{rule.row}" decides'
        for rule in RULES
        if rule.unrecorded is None and rule not in decided
    ]
    if not any(continues_after_repeated_failure(f.obj) for f in made):
        missing.append(
            "no run that goes on after a repeated failure (recovery.onRepeatedFailure: Continue)"
        )
    return missing


def fixture_text(fixture: Fixture) -> str:
    """A fixture file: where it came from, then the run."""
    body = yaml.safe_dump(fixture.obj, sort_keys=False, width=100, allow_unicode=True)
    return (
        f"# Recorded during {fixture.test or 'an e2e run'}.\n"
        f"# A status the operator wrote, kept by `{GENERATED_BY}`:\n"
        f"# run {REGENERATE} rather than edit it.\n"
        f"{body}"
    )


def tests_text(made: Sequence[Fixture]) -> str:
    """health_test.yaml: each fixture's expected health, with the rule that gives it."""
    lines = [
        "# Expected Argo CD health of each TrainingRun under testdata/, in the shape of Argo",
        "# CD's own resource_customizations/*/health_test.yaml; run by",
        "# tests/unit/test_argocd_health.py. Generated from statuses the operator wrote in e2e",
        f"# runs by `{GENERATED_BY}` ({REGENERATE}).",
        "# Each expectation is the rule of docs/argocd.md that decides the run, written above it",
        "# (trainguard_dev.argocd_fixtures.RULES), never the script's own answer. Do not edit.",
        "tests:",
    ]
    for fixture in made:
        entry = {"healthStatus": fixture.health, "inputPath": f"{TESTDATA}/{fixture.name}.yaml"}
        lines.append(f"# {fixture.rule.row}")
        text = yaml.safe_dump([entry], sort_keys=False, width=100, allow_unicode=True)
        lines.extend(text.rstrip("\n").splitlines())
    return "\n".join(lines) + "\n"


def write(made: Sequence[Fixture], out: Path) -> list[Path]:
    """Replace the fixtures under `out` with these; the paths written."""
    testdata = out / TESTDATA
    testdata.mkdir(parents=True, exist_ok=True)
    for old in testdata.glob("*.yaml"):
        old.unlink()
    written = []
    for fixture in made:
        path = testdata / f"{fixture.name}.yaml"
        path.write_text(fixture_text(fixture))
        written.append(path)
    tests = out / TESTS_FILE
    tests.write_text(tests_text(made))
    return [*written, tests]


def generate(recorded: Path, out: Path) -> list[Path]:
    """Read a recording, check it is complete, write the fixtures; the paths written."""
    made = fixtures(read_recorded(recorded))
    missing = gaps(made)
    if missing:
        raise GenerationError("the recording is incomplete: " + "; ".join(missing))
    return write(made, out)


def main(argv: list[str] | None = None) -> int:
    """Write the fixtures from a recording; exit 1, writing nothing, if it is incomplete."""
    parser = argparse.ArgumentParser(prog=GENERATED_BY, description=__doc__)
    parser.add_argument(
        "--recorded", type=Path, required=True, help="directory the e2e tier recorded into"
    )
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT})")
    args = parser.parse_args(argv)
    if not args.recorded.is_dir():
        parser.error(f"{args.recorded} is not a directory")
    try:
        written = generate(args.recorded, args.out)
    except GenerationError as err:
        print(err, file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
