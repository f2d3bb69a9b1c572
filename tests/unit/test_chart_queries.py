"""Every query the chart ships reads only metrics the operator exports.

The Grafana dashboard's queries (panels and template variables) and the alerting rules' are
parsed by Prometheus's own PromQL parser (promqlnames, built from the pinned module); each
metric they read must be a sample name of the operator's /metrics, as its registry's text
exposition announces them. A renamed or misspelt metric then fails here instead of leaving a
panel empty or an alert that never fires.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from chart import CHART, Obj, only, render
from prometheus_tools import BUILD_TIMEOUT_SECONDS, exported_names, metric_names

# The first test may build promqlnames (hack/setup.sh normally has): its time is bounded apart.
pytestmark = [pytest.mark.unit, pytest.mark.timeout(BUILD_TIMEOUT_SECONDS + 120)]

DASHBOARD = CHART / "dashboards" / "trainguard.json"
# Grafana's own interval variables stand where PromQL wants a duration; any duration parses.
GRAFANA_DURATIONS = re.compile(r"\$\{?__(rate_interval|interval|range)(_s|_ms)?\}?")
# Grafana's Prometheus variable queries: label_values(<selector>, <label>), query_result(<expr>).
LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.+),\s*\w+\s*\)\s*$", re.DOTALL)
QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.+)\)\s*$", re.DOTALL)
OPERATOR_PREFIX = "trainguard_"


def walk(node: Any) -> Iterator[Obj]:
    """Every JSON object in a document, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def variable_query(variable: Obj) -> str | None:
    """The PromQL of a Grafana query variable; None for a variable that reads no metric."""
    query = variable.get("query")
    text = query.get("query", "") if isinstance(query, dict) else str(query or "")
    if (m := LABEL_VALUES.match(text)) or (m := QUERY_RESULT.match(text)):
        return m.group(m.lastgroup or 0)
    assert not text.startswith(("metrics(", "label_names(")), f"unchecked query {text!r}"
    return text or None


def dashboard_queries(dashboard: Obj) -> list[str]:
    """The PromQL of every panel target and template query variable, Grafana's variables set."""
    exprs = [o["expr"] for o in walk(dashboard.get("panels", [])) if isinstance(o.get("expr"), str)]
    variables = dashboard.get("templating", {}).get("list", [])
    exprs += [q for v in variables if v.get("type") == "query" and (q := variable_query(v))]
    return [GRAFANA_DURATIONS.sub("5m", e) for e in exprs]


def unknown(exprs: list[str]) -> dict[str, set[str]]:
    """The names each query reads that the operator does not export."""
    exported = exported_names()
    found = metric_names(exprs)
    return {e: names - exported for e, names in found.items() if names - exported}


def test_the_exposition_names_every_family_as_prometheus_reads_it() -> None:
    exported = exported_names()
    operator = {n for n in exported if n.startswith(OPERATOR_PREFIX)}
    assert {
        "trainguard_runs",
        "trainguard_verdicts_total",
        "trainguard_detection_latency_seconds_bucket",
        "trainguard_detection_latency_seconds_count",
        "trainguard_checkpoint_age_seconds",
        "trainguard_verified_checkpoint_age_seconds",
        "trainguard_checkpoints_invalid_total",
    } <= operator
    # A classic histogram has no series of its bare name, a counter none without _total.
    assert "trainguard_detection_latency_seconds" not in exported
    assert "trainguard_verdicts" not in exported


def test_the_parser_reads_metric_names_only() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le) (rate("
        'trainguard_detection_latency_seconds_bucket{namespace=~"$namespace"}[15m])))'
        ' / on (namespace) group_left sum by (namespace) ({__name__="trainguard_runs"})'
    )
    assert metric_names([expr]) == {
        expr: {"trainguard_detection_latency_seconds_bucket", "trainguard_runs"}
    }
    # A selector without a metric name cannot be checked: it reads as "".
    assert metric_names(['sum({namespace="a"})']) == {'sum({namespace="a"})': {""}}


def test_a_misspelt_metric_is_caught() -> None:
    wrong = 'sum(rate(trainguard_verdict_total{verdict="Dead"}[5m]))'
    right = 'sum(rate(trainguard_verdicts_total{verdict="Dead"}[5m]))'
    assert unknown([wrong, right]) == {wrong: {"trainguard_verdict_total"}}


def test_a_query_that_does_not_parse_is_caught() -> None:
    with pytest.raises(AssertionError, match="do not parse"):
        metric_names(["sum(rate(trainguard_runs[5m])"])


def test_dashboard_reads_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_queries(dashboard)
    # The panels and the namespace variable (label_values(trainguard_runs, namespace)).
    assert len(exprs) > len(dashboard["panels"])
    assert any(e.strip() == "trainguard_runs" for e in exprs)
    assert unknown(exprs) == {}


def test_alert_rules_read_only_exported_metrics() -> None:
    rule = only(render("tg", "trainguard-system", {"alerts": {"enabled": True}}), "PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert exprs
    assert unknown(exprs) == {}
