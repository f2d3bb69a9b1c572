"""The goodput benchmark's arithmetic: goodput, steps recomputed, time lost per failure."""

from __future__ import annotations

import pytest

from trainguard_dev.testing.goodput import Failure, StepRecord, loss_ratio, side_figures

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

STEP_S = 0.1


def steady(first: int, last: int, start: float) -> list[StepRecord]:
    """Steps `first`..`last`, one every STEP_S, the first seen at `start`."""
    return [StepRecord(s, start + (s - first) * STEP_S) for s in range(first, last + 1)]


def test_an_uninterrupted_run_has_goodput_one_and_recomputes_nothing() -> None:
    figures = side_figures(steady(1, 100, 5.0), [], 100, STEP_S)

    assert figures["wall_s"] == pytest.approx(10.0)
    assert figures["useful_s"] == pytest.approx(10.0)
    assert figures["goodput"] == pytest.approx(1.0)
    assert figures["steps_recomputed"] == 0
    assert figures["time_lost_median_s"] is None


def test_a_death_costs_its_gap_and_the_steps_since_the_checkpoint() -> None:
    # Steps 1..60, then a death at step 60 (seen at 5.9 s); 4 s later the trainer resumes
    # from the checkpoint of step 50, redoes 51..60 and goes on to 100.
    before = steady(1, 60, 0.0)
    died_at = before[-1].seen + 0.05
    after = steady(51, 100, died_at + 4.0)
    figures = side_figures(before + after, [Failure("death", died_at, 60)], 100, STEP_S)

    assert figures["steps_executed"] == 110
    assert figures["steps_recomputed"] == 10
    # Lost: to the first step past 60 (step 61, ten steps after the restart), less one step.
    assert figures["time_lost_median_by_kind_s"] == {"death": pytest.approx(4.9)}
    # Wall = 10 s of useful steps + the 4 s gap + 10 recomputed steps (1 s) - 0.05 s.
    assert figures["wall_s"] == pytest.approx(10.0 + 0.05 + 4.0 + 1.0 - 0.1)
    assert figures["goodput"] == pytest.approx(10.0 / figures["wall_s"], abs=1e-4)


def test_time_lost_is_per_kind_and_the_ratio_divides_the_medians() -> None:
    records = steady(1, 30, 0.0) + steady(31, 60, 10.0) + steady(61, 90, 20.0)
    failures = [Failure("hang", 2.95, 30), Failure("ghost", 12.95, 60)]
    ours = side_figures(records, failures, 90, STEP_S)
    theirs = {"time_lost_median_s": ours["time_lost_median_s"] * 12}

    assert ours["time_lost_median_by_kind_s"] == {
        "hang": pytest.approx(10.0 - 2.95 - STEP_S),
        "ghost": pytest.approx(20.0 - 12.95 - STEP_S),
    }
    assert loss_ratio(theirs, ours) == pytest.approx(12.0)


def test_steps_a_frozen_trainer_makes_before_its_restart_are_not_a_resumption() -> None:
    # Frozen at step 30 (2.95 s); continued at 33 s for its stacks, it makes steps 31..34,
    # is killed, and the new trainer resumes from step 20 at 40 s: resumed past step 34.
    frozen_at = 2.95
    records = steady(1, 30, 0.0) + steady(31, 34, 33.0) + steady(21, 60, 40.0)
    figures = side_figures(records, [Failure("hang", frozen_at, 30)], 60, STEP_S)

    resumed = 40.0 + (35 - 21) * STEP_S
    assert figures["time_lost_median_by_kind_s"] == {
        "hang": pytest.approx(resumed - frozen_at - STEP_S)
    }
    # Steps 21..34 were executed twice: 74 executed for 60.
    assert figures["steps_recomputed"] == 14


def test_a_resume_at_the_step_reached_is_not_confused_with_the_next_failures_restart() -> None:
    # A death at step 30 (2.95 s); 2 s later the trainer resumes from a snapshot of step 30
    # itself (no step is redone). A hang at step 60 (later) restarts from step 50: that
    # restart is the hang's, not the death's.
    died_at = 2.95
    records = steady(1, 30, 0.0) + steady(31, 60, died_at + 2.0) + steady(51, 90, 20.0)
    hung_at = records[59].seen + 0.05
    failures = [Failure("death", died_at, 30), Failure("hang", hung_at, 60)]
    figures = side_figures(records, failures, 90, STEP_S)

    assert figures["time_lost_median_by_kind_s"] == {
        "death": pytest.approx(2.0 - STEP_S),
        "hang": pytest.approx(20.0 + (61 - 51) * STEP_S - hung_at - STEP_S),
    }


def test_a_run_that_never_finishes_has_no_figures() -> None:
    with pytest.raises(ValueError, match="never reached step 100"):
        side_figures(steady(1, 60, 0.0), [], 100, STEP_S)
