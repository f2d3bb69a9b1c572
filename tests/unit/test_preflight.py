"""`trainguard preflight`: real disks (a directory, a full tmpfs), injected corruption, GPU."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainguard.contract import env, files, reports
from trainguard.gpu import SIMULATION_ENV, UnavailableProbe
from trainguard.initsteps import preflight

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

MIB = 2**20
# Small and quick; floors low enough for any disk, so only the injected faults fail.
QUICK = ["--test-size", "4Mi", "--margin", "1Mi", "--min-write-mbps", "1", "--min-read-mbps", "1"]


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A healthy node: L1 and data directories, a state dir, an idle simulated GPU."""
    paths = {name: tmp_path / name for name in ("l1", "data", "state")}
    for path in paths.values():
        path.mkdir()
    paths["gpu"] = tmp_path / "gpu-sim.json"
    paths["gpu"].write_text(json.dumps({"ghost_mib": 0}))
    monkeypatch.setenv(env.L1_DIR, str(paths["l1"]))
    monkeypatch.setenv(env.DATA_DIR, str(paths["data"]))
    monkeypatch.setenv(env.STATE_DIR, str(paths["state"]))
    monkeypatch.setenv(SIMULATION_ENV, str(paths["gpu"]))
    monkeypatch.setenv(env.CKPT_BYTES, str(2 * MIB))
    monkeypatch.setenv(env.DATA_BYTES, str(3 * MIB))
    monkeypatch.setenv(env.KEEP_LAST, "2")
    for name in (preflight.INJECT_ENV, env.MONITOR, env.HASH):
        monkeypatch.delenv(name, raising=False)
    paths["termination"] = tmp_path / "termination-log"  # created by the kubelet in a pod
    paths["termination"].touch()
    monkeypatch.setenv(env.TERMINATION_LOG, str(paths["termination"]))
    return paths


def run(node: dict[str, Path], *args: str) -> tuple[int, dict[str, Any]]:
    code = preflight.main([*QUICK, *args])
    result: dict[str, Any] = json.loads((node["state"] / files.PREFLIGHT_FILENAME).read_text())
    assert result["exit_code"] == code
    return code, result


def checks(result: dict[str, Any], check: str) -> dict[str, dict[str, Any]]:
    return {c["target"]: c for c in result["checks"] if c["check"] == check}


def test_a_healthy_node_passes_with_figures(node: dict[str, Path]) -> None:
    code, result = run(node)

    assert code == preflight.ExitCode.OK
    assert result["ok"] and result["failure"] is None
    for target in ("l1", "data"):
        integrity = checks(result, preflight.INTEGRITY)[target]
        assert integrity["status"] == preflight.PASS, integrity
        figures = integrity["figures"]
        assert figures["bytes"] == 4 * MIB
        assert figures["written_hash"] == figures["read_hash"]
        assert figures["write_mb_per_s"] > 0 and figures["read_mb_per_s"] > 0
        assert checks(result, preflight.BANDWIDTH)[target]["status"] == preflight.PASS
        assert not list(node[target].glob(f"{preflight.TEST_FILE_PREFIX}*")), "test file left"
    (space,) = checks(result, preflight.SPACE).values()  # both on the same filesystem
    assert space["status"] == preflight.PASS
    # data 3 MiB + (keep 2 + 1) x checkpoint 2 MiB + margin 1 MiB
    assert space["figures"]["need_bytes"] == 10 * MIB
    assert space["figures"]["free_bytes"] > space["figures"]["need_bytes"]
    gpu = checks(result, preflight.GPU)["gpu"]
    assert gpu["status"] == preflight.PASS and gpu["figures"]["source"] == "simulated"
    # The termination message is the status's summary: the slowest bandwidth, the space.
    short = json.loads(node["termination"].read_text())
    assert short == reports.preflight_summary(result, preflight.MESSAGE_LIMIT)
    rates = checks(result, preflight.BANDWIDTH).values()
    assert short["passed"] is True and short["gpu"] == preflight.PASS
    assert short["writeMbps"] == min(c["figures"]["write_mb_per_s"] for c in rates)
    assert short["readMbps"] == min(c["figures"]["read_mb_per_s"] for c in rates)
    assert (short["freeBytes"], short["needBytes"]) == (
        space["figures"]["free_bytes"],
        10 * MIB,
    )
    assert (short["gpuUsedMib"], short["gpuTotalMib"]) == (0.0, 143771.0)


def test_l1_room_counts_a_pinned_checkpoint_per_upload_with_remote_layers(
    node: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    layers = [{"name": "backup", "uri": "s3://bucket/run"}]
    monkeypatch.setenv(env.LAYERS, json.dumps(layers))

    code, result = run(node)

    assert code == preflight.ExitCode.OK
    (space,) = checks(result, preflight.SPACE).values()
    # data 3 MiB + (keep 2 + 1 + 1 pinned while shipped) x checkpoint 2 MiB + margin 1 MiB
    assert space["figures"]["need_bytes"] == 12 * MIB
    assert space["figures"]["remote_layers"] == 1


@pytest.mark.parametrize(
    ("fill", "expect_integrity"),
    [(7 * MIB, preflight.SKIPPED), (0, preflight.PASS)],
    ids=["disk-full", "too-small-for-checkpoints"],
)
def test_a_disk_that_lacks_space_fails(
    node: dict[str, Path],
    tmpfs: Callable[[int], Path],
    monkeypatch: pytest.MonkeyPatch,
    fill: int,
    expect_integrity: str,
) -> None:
    disk = tmpfs(8 * MIB)
    l1 = disk / "l1"
    l1.mkdir()
    # Something else on the node's disk (outside L1) takes the room.
    (disk / "other-tenant").write_bytes(b"\0" * fill)
    monkeypatch.setenv(env.L1_DIR, str(l1))
    monkeypatch.setenv(env.CKPT_BYTES, str(3 * MIB))  # (keep 2 + 1) x 3 MiB: more than 8 MiB

    code, result = run(node)

    assert code == preflight.ExitCode.SPACE
    assert result["failure"] == preflight.Failure.INSUFFICIENT_SPACE
    space = checks(result, preflight.SPACE)["l1"]
    assert space["status"] == preflight.FAIL
    assert space["figures"]["free_bytes"] < space["figures"]["need_bytes"] == 10 * MIB
    assert "not enough space" in result["message"]
    assert checks(result, preflight.INTEGRITY)["l1"]["status"] == expect_integrity
    assert checks(result, preflight.SPACE)["data"]["status"] == preflight.PASS


def test_a_disk_that_corrupts_written_data_fails(
    node: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(preflight.INJECT_ENV, preflight.INJECT_CORRUPT_READBACK)

    code, result = run(node)

    assert code == preflight.ExitCode.STORAGE_INTEGRITY
    assert result["failure"] == preflight.Failure.STORAGE_CORRUPT
    assert result["fault_injection"] == preflight.INJECT_CORRUPT_READBACK
    integrity = checks(result, preflight.INTEGRITY)["l1"]
    assert integrity["status"] == preflight.FAIL
    assert integrity["figures"]["written_hash"] != integrity["figures"]["read_hash"]
    assert "the disk corrupts data" in result["message"]
    short = json.loads(node["termination"].read_text())
    assert (short["passed"], short["failure"]) == (False, "StorageCorrupt")
    assert "the disk corrupts data" in short["message"]


@pytest.mark.parametrize(
    ("gpu_state", "used_mib"),
    [({"ghost_mib": 30000}, 30000), ({"extra_processes": 1, "extra_process_mib": 512}, 512)],
    ids=["ghost-memory", "foreign-process"],
)
def test_gpu_memory_already_held_fails(
    node: dict[str, Path], gpu_state: dict[str, int], used_mib: int
) -> None:
    node["gpu"].write_text(json.dumps(gpu_state))

    code, result = run(node)

    assert code == preflight.ExitCode.GPU
    assert result["failure"] == preflight.Failure.GPU_MEMORY_HELD
    gpu = checks(result, preflight.GPU)["gpu"]
    assert gpu["status"] == preflight.FAIL
    assert gpu["figures"]["used_mib"] == used_mib
    assert gpu["figures"]["max_used_mib"] == 2048  # the run's ghost-memory threshold


def test_gpu_bound_follows_the_runs_monitor_and_the_flag(
    node: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    node["gpu"].write_text(json.dumps({"ghost_mib": 3000}))
    monkeypatch.setenv(env.MONITOR, json.dumps({"ghostMemory": {"thresholdMiB": 4096}}))
    assert run(node)[0] == preflight.ExitCode.OK
    assert run(node, "--gpu-max-used-mib", "1000")[0] == preflight.ExitCode.GPU


@pytest.mark.parametrize(
    ("checkpoint", "test_bytes"),
    [(None, 256 * MIB), (1 * MIB, 64 * MIB), (100 * MIB, 100 * MIB), (35 * 2**30, 256 * MIB)],
)
def test_the_test_file_is_one_checkpoint_within_bounds(
    checkpoint: int | None, test_bytes: int
) -> None:
    assert preflight.default_test_bytes(checkpoint) == test_bytes


@pytest.mark.parametrize(
    ("checkpoint", "volumes", "test_bytes"),
    [
        # The reference run's L1: 3 checkpoints of 15.3 MiB, an emptyDir sized to them.
        (16_000_000, [48_000_000], 24_000_000),
        (16_000_000, [48_000_000, 400_000], 4 * MIB),  # a tiny data volume: the least fitted
        (100 * MIB, [None, 900 * MIB], 100 * MIB),  # room enough: one checkpoint
        (None, [None], 256 * MIB),
    ],
)
def test_the_test_file_fits_within_half_of_each_volume_as_sized(
    checkpoint: int | None, volumes: list[int | None], test_bytes: int
) -> None:
    """The kubelet evicts a pod whose emptyDir holds more than its sizeLimit."""
    assert preflight.default_test_bytes(checkpoint, volumes) == test_bytes


def test_without_a_gpu_reading_the_check_is_skipped_with_the_reason() -> None:
    check = preflight.check_gpu(UnavailableProbe("NVML not usable: no driver"), 2048)

    assert check.status == preflight.SKIPPED
    assert check.message == "no GPU reading: NVML not usable: no driver"


def test_storage_below_the_bandwidth_floor_fails(node: dict[str, Path]) -> None:
    code, result = run(node, "--min-write-mbps", "1e9")

    assert code == preflight.ExitCode.BANDWIDTH
    assert result["failure"] == preflight.Failure.STORAGE_SLOW
    slow = checks(result, preflight.BANDWIDTH)["l1"]
    assert slow["status"] == preflight.FAIL
    assert slow["figures"]["min_write_mb_per_s"] == 1e9
    assert "below the floor" in slow["message"]


def test_the_floors_come_from_the_flags_else_the_nodes_environment(
    node: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    unfloored = ["--test-size", "4Mi", "--margin", "1Mi"]
    monkeypatch.setenv(preflight.MIN_WRITE_ENV, "1e9")
    monkeypatch.setenv(preflight.MIN_READ_ENV, "0.5")
    code = preflight.main(unfloored)
    result = json.loads((node["state"] / files.PREFLIGHT_FILENAME).read_text())
    figures = checks(result, preflight.BANDWIDTH)["l1"]["figures"]
    assert code == preflight.ExitCode.BANDWIDTH
    assert (figures["min_write_mb_per_s"], figures["min_read_mb_per_s"]) == (1e9, 0.5)
    # A flag wins over the environment.
    assert preflight.main([*unfloored, "--min-write-mbps", "0.5"]) == preflight.ExitCode.OK
    monkeypatch.delenv(preflight.MIN_WRITE_ENV)
    monkeypatch.delenv(preflight.MIN_READ_ENV)
    preflight.main(unfloored)
    result = json.loads((node["state"] / files.PREFLIGHT_FILENAME).read_text())
    figures = checks(result, preflight.BANDWIDTH)["l1"]["figures"]
    assert (figures["min_write_mb_per_s"], figures["min_read_mb_per_s"]) == (
        preflight.DEFAULT_MIN_WRITE_MBPS,
        preflight.DEFAULT_MIN_READ_MBPS,
    )


@pytest.mark.parametrize("value", ["fast", "-1", "nan"])
def test_an_invalid_floor_in_the_environment_is_a_usage_error(
    node: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    value: str,
) -> None:
    monkeypatch.setenv(preflight.MIN_WRITE_ENV, value)
    with pytest.raises(SystemExit) as exited:
        preflight.main(["--test-size", "4Mi"])
    assert exited.value.code == preflight.ExitCode.USAGE
    assert f"{preflight.MIN_WRITE_ENV}={value!r}: a bandwidth in MB/s" in capsys.readouterr().err


def test_several_failures_are_all_reported_and_the_exit_code_is_the_first_class(
    node: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(preflight.INJECT_ENV, preflight.INJECT_CORRUPT_READBACK)
    node["gpu"].write_text(json.dumps({"ghost_mib": 30000}))

    code, result = run(node, "--min-read-mbps", "1e9")

    assert code == preflight.ExitCode.STORAGE_INTEGRITY
    failures = {c["failure"] for c in result["checks"] if c["status"] == preflight.FAIL}
    assert failures == {
        preflight.Failure.STORAGE_CORRUPT,
        preflight.Failure.GPU_MEMORY_HELD,
        preflight.Failure.STORAGE_SLOW,
    }
    assert len(result["message"]) <= preflight.MESSAGE_LIMIT


@pytest.mark.parametrize(
    ("variable", "value", "error"),
    [
        (preflight.INJECT_ENV, "corrupt-everything", "known faults: corrupt-readback"),
        (env.STATE_DIR, "/proc/version/state", "mount the state volume into this step"),
    ],
    ids=["unknown-fault", "state-volume-missing"],
)
def test_misconfiguration_is_a_usage_error_that_says_what_is_wrong(
    node: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    error: str,
) -> None:
    monkeypatch.setenv(variable, value)

    with pytest.raises(SystemExit) as exit_info:
        preflight.main(QUICK)

    assert exit_info.value.code == preflight.ExitCode.USAGE
    assert error in capsys.readouterr().err
