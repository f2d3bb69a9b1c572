"""The verdict classifier, one row per signal combination that matters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainguard.agent.verdicts import (
    DEAD,
    GHOST_MEMORY,
    HEALTHY,
    HUNG,
    IO_STUCK,
    SLOW,
    UNKNOWN,
    Signals,
    Thresholds,
    classify,
)

pytestmark = pytest.mark.unit

T = Thresholds(
    hang_after_s=30,
    slow_after_s=60,
    io_stuck_after_s=20,
    min_tokens_per_s=100,
    ghost_mib=2048,
    ghost_ratio=1.5,
    release_after_death_s=5,
)
ALIVE = Signals(
    trainer_seen=True,
    process_alive=True,
    process_state="R",
    process_count=1,
    step=100,
    seconds_since_step_advanced=1,
    tokens_per_s=1000,
    framework_reserved_mib=10000,
    gpu_used_mib=11000,
    gpu_processes=1,
    log_age_s=1,
)

CASES = [
    ("nothing started", replace(ALIVE, trainer_seen=False, process_alive=False), UNKNOWN),
    ("healthy", ALIVE, HEALTHY),
    (
        "healthy without GPU readings",
        replace(ALIVE, gpu_used_mib=None, gpu_processes=None),
        HEALTHY,
    ),
    (
        "healthy without heartbeat",
        replace(ALIVE, step=None, tokens_per_s=None, framework_reserved_mib=None),
        HEALTHY,
    ),
    (
        "process gone",
        replace(ALIVE, process_alive=False, seconds_since_death=0.5, gpu_used_mib=0),
        DEAD,
    ),
    ("zombie", replace(ALIVE, process_state="Z", seconds_since_death=0.5, gpu_used_mib=0), DEAD),
    (
        "gone, memory still held but within release bound",
        replace(ALIVE, process_alive=False, seconds_since_death=2, gpu_used_mib=9000),
        DEAD,
    ),
    (
        "gone, memory held past the bound",
        replace(ALIVE, process_alive=False, seconds_since_death=6, gpu_used_mib=9000),
        GHOST_MEMORY,
    ),
    (
        "gone, no GPU readings",
        replace(ALIVE, process_alive=False, seconds_since_death=60, gpu_used_mib=None),
        DEAD,
    ),
    (
        "gone, memory released",
        replace(ALIVE, process_alive=False, seconds_since_death=60, gpu_used_mib=100),
        DEAD,
    ),
    ("D state briefly", replace(ALIVE, process_state="D", seconds_in_d_state=5), HEALTHY),
    (
        "D state too long",
        replace(ALIVE, process_state="D", seconds_in_d_state=25, seconds_since_step_advanced=25),
        IO_STUCK,
    ),
    ("duplicate trainer processes", replace(ALIVE, process_count=2), GHOST_MEMORY),
    ("extra process on the GPU", replace(ALIVE, gpu_processes=3), GHOST_MEMORY),
    ("driver >> framework", replace(ALIVE, gpu_used_mib=30000), GHOST_MEMORY),
    ("memory held by no live process", replace(ALIVE, gpu_unattributed_mib=30000), GHOST_MEMORY),
    ("a little unattributed memory", replace(ALIVE, gpu_unattributed_mib=500), HEALTHY),
    ("driver a bit above framework", replace(ALIVE, gpu_used_mib=12000), HEALTHY),
    (
        "memory dropped to ~0 with frozen step",
        replace(ALIVE, gpu_used_mib=100, seconds_since_step_advanced=40),
        DEAD,
    ),
    ("step frozen", replace(ALIVE, seconds_since_step_advanced=31), HUNG),
    (
        "stopped by SIGSTOP, then frozen",
        replace(ALIVE, process_state="T", seconds_since_step_advanced=31),
        HUNG,
    ),
    (
        "stopped by SIGSTOP, not yet frozen",
        replace(ALIVE, process_state="T", seconds_since_step_advanced=3),
        SLOW,
    ),
    ("below the expected rate", replace(ALIVE, tokens_per_s=50), SLOW),
    ("old log but advancing: slow, never dead", replace(ALIVE, log_age_s=600), SLOW),
]


@pytest.mark.parametrize(("name", "signals", "expected"), CASES, ids=[c[0] for c in CASES])
def test_classify(name: str, signals: Signals, expected: str) -> None:
    verdict = classify(signals, T)
    assert verdict.name == expected, verdict.reason
    assert verdict.reason
    assert "step" in verdict.evidence


def test_log_age_alone_never_yields_dead_or_hung() -> None:
    for age in (0, 59, 60, 3600, 86400):
        verdict = classify(replace(ALIVE, log_age_s=age), T)
        assert verdict.name in (HEALTHY, SLOW)
