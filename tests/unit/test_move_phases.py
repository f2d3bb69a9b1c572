"""The move benchmark's arithmetic: milestones to phases, the total after detection, medians."""

from __future__ import annotations

import itertools

import pytest

from trainguard_dev.testing.move import (
    AFTER_DETECTION,
    NAMES,
    parse_time,
    phase_name,
    phases,
    summary,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def test_api_timestamps_read_as_epoch_seconds_with_or_without_fractions() -> None:
    assert parse_time("1970-01-01T00:00:10Z") == 10.0
    assert parse_time("1970-01-01T00:00:10.250000Z") == pytest.approx(10.25)
    assert parse_time(None) is None
    assert parse_time("not a time") is None


def test_every_phase_runs_from_one_milestone_to_the_next() -> None:
    marks = {name: 100.0 + index for index, name in enumerate(NAMES)}

    found = phases(marks)

    assert list(found) == [
        *(phase_name(a, b) for a, b in itertools.pairwise(NAMES)),
        AFTER_DETECTION,
    ]
    assert all(found[phase_name(a, b)] == 1.0 for a, b in itertools.pairwise(NAMES))
    # From `detected` (the second milestone) to `first_step` (the last).
    assert found[AFTER_DETECTION] == len(NAMES) - 2


def test_a_milestone_not_read_folds_its_phase_into_the_next() -> None:
    marks = {"injected": 10.0, "detected": 12.5, "old_pod_gone": None, "pod_created": 16.0}

    assert phases(marks) == {
        phase_name("injected", "detected"): 2.5,
        phase_name("detected", "pod_created"): 3.5,
    }


def test_no_total_without_both_of_its_ends() -> None:
    assert AFTER_DETECTION not in phases({"injected": 1.0, "detected": 2.0})


def test_an_unknown_milestone_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown milestones"):
        phases({"injected": 1.0, "teleported": 2.0})


def test_the_summary_has_each_phase_median_and_its_raw_list_in_order() -> None:
    moves = [{"a": 1.0, "b": 4.0}, {"a": 3.0}, {"a": 2.0, "b": 6.0}]

    assert summary(moves) == {
        "median_s": {"a": 2.0, "b": 5.0},
        "raw_s": {"a": [1.0, 3.0, 2.0], "b": [4.0, 6.0]},
    }
