"""The chart's alerting rules (PrometheusRule), checked and unit-tested by promtool.

The chart is rendered with helm, the PrometheusRule's groups become a rule file, and promtool
(built from the pinned Prometheus module) checks it and runs `chart_alerts_test.yaml`: input
series and the alerts expected of them, for every alert, firing and silent. A broken rule must
fail those tests, and the bounds and labels must come from the values.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart import CHART, Obj, find, helm, only, render
from prometheus_tools import BUILD_TIMEOUT_SECONDS, promtool

# The first test may build promtool (hack/setup.sh normally has): its time is bounded apart.
pytestmark = [pytest.mark.unit, pytest.mark.timeout(BUILD_TIMEOUT_SECONDS + 120)]

RELEASE = "tg"
NAMESPACE = "trainguard-system"
ON: Obj = {"alerts": {"enabled": True}}
TESTS = Path(__file__).with_name("chart_alerts_test.yaml")
ALERTS = {
    "TrainguardRunFailed",
    "TrainguardRunsNotTraining",
    "TrainguardGhostGPUMemory",
    "TrainguardCheckpointNotVerified",
    "TrainguardCheckpointCorrupted",
}
SEVERITIES = {"critical", "warning"}


def rule_groups(values: Obj) -> dict[str, Any]:
    """The rule file the chart's PrometheusRule amounts to: its spec (`groups`)."""
    spec: dict[str, Any] = only(render(RELEASE, NAMESPACE, values), "PrometheusRule")["spec"]
    return spec


def alert_rules(groups: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The alerting rules by name."""
    return {r["alert"]: r for g in groups["groups"] for r in g["rules"] if "alert" in r}


def run_tests(groups: dict[str, Any], tmp_path: Path) -> tuple[int, str]:
    """Exit status and output of promtool's unit tests of these groups."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(groups, sort_keys=False))
    tests = yaml.safe_load(TESTS.read_text())
    tests["rule_files"] = [str(rules)]
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = promtool("test", "rules", str(path))
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def groups() -> dict[str, Any]:
    return rule_groups(ON)


def test_rules_only_when_enabled_with_metrics() -> None:
    assert not find(render(RELEASE, NAMESPACE), "PrometheusRule")
    no_metrics = {"metrics": {"enabled": False}, "alerts": {"enabled": True}}
    assert not find(render(RELEASE, NAMESPACE, no_metrics), "PrometheusRule")
    rule = only(render(RELEASE, NAMESPACE, ON), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE


def test_promtool_accepts_the_rules(groups: dict[str, Any], tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(groups, sort_keys=False))
    done = promtool("check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout
    assert set(alert_rules(groups)) == ALERTS


def test_rules_unit_tests_pass(groups: dict[str, Any], tmp_path: Path) -> None:
    code, output = run_tests(groups, tmp_path)
    assert code == 0, output
    assert "SUCCESS" in output


def test_every_alert_is_tested_firing_and_silent() -> None:
    cases = [c for t in yaml.safe_load(TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    for alert in ALERTS:
        fired = [c for c in cases if c["alertname"] == alert and c["exp_alerts"]]
        silent = [c for c in cases if c["alertname"] == alert and not c["exp_alerts"]]
        assert fired, f"no test expects {alert} to fire"
        assert silent, f"no test expects {alert} to stay silent"
        assert any("exp_annotations" in a for c in fired for a in c["exp_alerts"]), alert


# Each mutation breaks one property of a rule; the named test must notice it.
Rule = dict[str, Any]
BROKEN: dict[str, tuple[str, Callable[[Rule], Rule], str]] = {
    "the first sighting of ghost memory": (
        "TrainguardGhostGPUMemory",
        lambda rule: {**rule, "expr": rule["expr"].split(" or ")[0]},
        "first ghost memory sighting",
    ),
    "a shorter bound": (
        "TrainguardRunsNotTraining",
        lambda rule: {**rule, "for": "20m"},
        "run pending beyond the bound",
    ),
    "recovering runs": (
        "TrainguardRunsNotTraining",
        lambda rule: {**rule, "expr": rule["expr"].replace("|Recovering", "")},
        "dead run recovering then pending, never back",
    ),
    "the failed phase": (
        "TrainguardRunFailed",
        lambda rule: {**rule, "expr": rule["expr"].replace('"Failed"', '"Failure"')},
        "failed run",
    ),
    "a longer bound of verified checkpoints": (
        "TrainguardCheckpointNotVerified",
        lambda rule: {**rule, "expr": rule["expr"].replace("> 3600", "> 4000")},
        "shipping failing beyond the bound",
    ),
    "the run in the verified checkpoint alert": (
        "TrainguardCheckpointNotVerified",
        lambda rule: {**rule, "expr": rule["expr"].replace("run, ", "")},
        "shipping failing beyond the bound",
    ),
    "the first invalid checkpoint": (
        "TrainguardCheckpointCorrupted",
        lambda rule: {**rule, "expr": rule["expr"].split(" or ")[0]},
        "first invalid checkpoint",
    ),
    "invalid checkpoints that are not new": (
        "TrainguardCheckpointCorrupted",
        lambda rule: {**rule, "expr": rule["expr"].replace("increase(", "max_over_time(")},
        "another invalid checkpoint",
    ),
}


@pytest.mark.parametrize("mutation", sorted(BROKEN))
def test_unit_tests_catch_a_broken_rule(
    groups: dict[str, Any], tmp_path: Path, mutation: str
) -> None:
    alert, change, failing = BROKEN[mutation]
    broken = {
        "groups": [
            {**g, "rules": [change(r) if r.get("alert") == alert else r for r in g["rules"]]}
            for g in groups["groups"]
        ]
    }
    assert broken != groups
    code, output = run_tests(broken, tmp_path)
    assert code != 0, f"breaking {mutation} went unnoticed"
    assert f"name: {failing}," in output, output


def test_bounds_and_labels_come_from_values() -> None:
    values: Obj = {
        "alerts": {
            "enabled": True,
            "labels": {"release": "kube-prometheus"},
            "alertLabels": {"team": "ml-infra"},
            "notTrainingFor": "2h",
            "ghostMemoryWindow": "90m",
            "checkpointNotVerifiedFor": "2h30m",
            "invalidCheckpointWindow": "3h",
        }
    }
    rule = only(render(RELEASE, NAMESPACE, values), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    alerts = alert_rules(rule["spec"])
    assert alerts["TrainguardRunsNotTraining"]["for"] == "2h"
    assert "2h" in alerts["TrainguardRunsNotTraining"]["annotations"]["summary"]
    ghost = alerts["TrainguardGhostGPUMemory"]
    assert re.findall(r"\[(\w+)\]|offset (\w+)", ghost["expr"]) == [("90m", ""), ("", "90m")]
    assert "within the last 90m" in ghost["annotations"]["description"]
    not_verified = alerts["TrainguardCheckpointNotVerified"]
    assert not_verified["expr"].endswith("> 9000")  # 2h30m in seconds
    assert "for 2h30m" in not_verified["annotations"]["summary"]
    corrupted = alerts["TrainguardCheckpointCorrupted"]
    assert re.findall(r"\[(\w+)\]|offset (\w+)", corrupted["expr"]) == [("3h", ""), ("", "3h")]
    assert "within the last 3h" in corrupted["annotations"]["description"]
    for name, alert in alerts.items():
        assert alert["labels"]["team"] == "ml-infra", name
        assert alert["labels"]["severity"] in SEVERITIES, name
        assert alert["annotations"]["summary"] and alert["annotations"]["description"], name


@pytest.mark.parametrize(
    "key",
    ["notTrainingFor", "ghostMemoryWindow", "checkpointNotVerifiedFor", "invalidCheckpointWindow"],
)
def test_a_bound_that_is_no_duration_is_refused(key: str) -> None:
    values = {"alerts": {"enabled": True, key: "30 minutes"}}
    result = helm("template", RELEASE, str(CHART), values=values, check=False)
    assert result.returncode != 0
    assert f"alerts.{key} must be a Prometheus duration" in result.stderr
