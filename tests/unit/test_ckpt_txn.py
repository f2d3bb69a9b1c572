"""Writing checkpoints as transactions: layout, durability order, failures, replacement."""

from __future__ import annotations

import errno
import json
import mmap
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.ckpt import (
    MANIFEST_FILENAME,
    SHA256,
    CheckpointTransaction,
    CheckpointWriteError,
    Contents,
    UnknownHashAlgorithmError,
    hash_file,
    scan,
    verify,
)
from trainguard.ckpt.layout import O_DIRECT

pytestmark = pytest.mark.unit


def write_checkpoint(root: Path, step: int, payload: bytes = b"payload") -> Path:
    with CheckpointTransaction(root, step, metadata={"k": "v"}) as txn:
        txn.write_file("model.bin", payload)
        with txn.create("sub/opt.bin") as writer:
            writer.write(payload[:3])
            writer.write(memoryview(payload)[3:])
        return txn.commit().path


def test_commit_produces_a_verified_step_directory(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, 12)
    assert path == tmp_path / "step-00000012"
    result = verify(path)
    assert result.ok, result.reasons
    assert result.manifest is not None
    assert [entry.path for entry in result.manifest.files] == ["model.bin", "sub/opt.bin"]
    assert result.manifest.metadata == {"k": "v"}
    assert result.manifest.contents is Contents.FULL
    entry = result.manifest.files[0]
    assert hash_file(path / "model.bin", result.manifest.hash_algorithm) == (7, entry.hash)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000012"]


def test_nothing_is_visible_before_commit(tmp_path: Path) -> None:
    txn = CheckpointTransaction(tmp_path, 3)
    txn.write_file("a.bin", b"x")
    visible = scan(tmp_path)
    assert visible.valid == () and visible.invalid == ()
    assert visible.partial == (txn.tmp_dir,)
    txn.abort()
    assert list(tmp_path.iterdir()) == []


def test_exception_inside_the_block_aborts(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), CheckpointTransaction(tmp_path, 3) as txn:
        txn.write_file("a.bin", b"x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_manifest_is_written_after_every_file_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        events.append("fsync:" + Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real_fsync(fd)

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("rename:" + Path(dst).name)
        real_rename(src, dst)

    # One os module serves every part of the package: patching it records them all.
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    with CheckpointTransaction(tmp_path, 1) as txn:
        txn.write_file("a.bin", b"a")
        txn.write_file("b.bin", b"b")
        tmp_name = txn.tmp_dir.name
        txn.commit()
    assert events == [
        "fsync:a.bin",
        "fsync:b.bin",
        f"fsync:{tmp_name}",
        f"fsync:{MANIFEST_FILENAME}",
        f"fsync:{tmp_name}",
        "rename:step-00000001",
        f"fsync:{tmp_path.name}",
    ]


@pytest.mark.parametrize("failing", ["pwrite", "fsync", "close"])
def test_io_errors_propagate_and_leave_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    previous = write_checkpoint(tmp_path, 1)
    real = getattr(os, failing)

    def broken(fd: int, *args: object) -> object:
        # Fail only on checkpoint data files, as a full or broken disk would.
        if os.readlink(f"/proc/self/fd/{fd}").endswith("model.bin"):
            if failing == "close":
                real(fd)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, *args)

    monkeypatch.setattr(os, failing, broken)
    with pytest.raises(OSError) as raised, CheckpointTransaction(tmp_path, 2) as txn:
        txn.write_file("model.bin", b"new")
        txn.commit()
    assert raised.value.errno == errno.EIO
    monkeypatch.undo()
    after = scan(tmp_path)
    assert [v.path for v in after.valid] == [previous]
    assert after.partial == () and after.invalid == ()


def test_misuse_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnknownHashAlgorithmError):
        CheckpointTransaction(tmp_path, 1, algorithm="crc0")
    assert list(tmp_path.iterdir()) == []
    with CheckpointTransaction(tmp_path, 1) as txn:
        writer = txn.create("a.bin")
        with pytest.raises(CheckpointWriteError, match="already part"):
            txn.create("a.bin")
        with pytest.raises(CheckpointWriteError, match="still open"):
            txn.commit()
        writer.close()
        with pytest.raises(CheckpointWriteError, match="already closed"):
            writer.write(b"late")
        txn.commit()
        with pytest.raises(CheckpointWriteError, match="already committed"):
            txn.create("b.bin")


def test_a_valid_checkpoint_of_the_same_step_is_replaced(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 5, b"old-old")
    path = write_checkpoint(tmp_path, 5, b"new-new")
    assert (path / "model.bin").read_bytes() == b"new-new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000005"]


def test_an_invalid_checkpoint_of_the_same_step_is_quarantined_not_deleted(
    tmp_path: Path,
) -> None:
    broken = write_checkpoint(tmp_path, 5)
    (broken / "model.bin").write_bytes(b"garbage")
    with CheckpointTransaction(tmp_path, 5) as txn:
        txn.write_file("model.bin", b"fresh")
        committed = txn.commit()
    assert committed.quarantined is not None
    assert (committed.quarantined / "model.bin").read_bytes() == b"garbage"
    result = scan(tmp_path)
    assert [v.step for v in result.valid] == [5]
    assert result.quarantined == (committed.quarantined,)


def test_other_hash_algorithms_are_recorded_by_name(tmp_path: Path) -> None:
    with CheckpointTransaction(tmp_path, 1, algorithm=SHA256) as txn:
        txn.write_file("a.bin", b"abc")
        committed = txn.commit()
    manifest = json.loads((committed.path / MANIFEST_FILENAME).read_text())
    assert manifest["hash_algorithm"] == "sha256"
    assert manifest["files"][0]["hash"].startswith("ba7816bf")
    assert verify(committed.path).ok


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a disk that fills up."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_fails_loudly_and_keeps_the_previous(tiny_disk: Path) -> None:
    previous = write_checkpoint(tiny_disk, 1, b"x" * 300_000)
    with pytest.raises(OSError) as raised:
        write_checkpoint(tiny_disk, 2, b"y" * 900_000)
    assert raised.value.errno == errno.ENOSPC
    after = scan(tiny_disk)
    assert [v.path for v in after.valid] == [previous]
    assert after.partial == ()


def _page_aligned(data: bytes) -> mmap.mmap:
    """A writable, page-aligned copy of `data` (anonymous mmap memory is page-aligned)."""
    buffer = mmap.mmap(-1, len(data))
    buffer[:] = data
    return buffer


def _record_open_flags(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    flags: list[int] = []
    real_open = os.open

    def recording(path: str | os.PathLike[str], flag: int, *args: int, **kwargs: int) -> int:
        flags.append(flag)
        return real_open(path, flag, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording)
    return flags


def test_aligned_buffers_are_written_with_o_direct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = bytes(range(256)) * 64 + b"tail"  # 16 KiB aligned part, then an unaligned tail
    flags = _record_open_flags(monkeypatch)
    with CheckpointTransaction(tmp_path, 1) as txn:
        writer = txn.create("big.bin", direct=True)
        assert writer.direct
        writer.write(_page_aligned(payload))
        writer.close()
        # Read-only or misaligned data still works, through the page cache.
        with txn.create("mixed.bin", direct=True) as mixed:
            mixed.write(b"header")
            mixed.write(_page_aligned(payload))
        committed = txn.commit()
    assert any(flag & O_DIRECT for flag in flags)
    assert (committed.path / "big.bin").read_bytes() == payload
    assert (committed.path / "mixed.bin").read_bytes() == b"header" + payload
    assert verify(committed.path).ok


def test_filesystems_without_o_direct_fall_back_to_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def no_direct(path: str | os.PathLike[str], flag: int, *args: int, **kwargs: int) -> int:
        if flag & O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flag, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_direct)
    payload = bytes(8192)
    with CheckpointTransaction(tmp_path, 1) as txn:
        with txn.create("a.bin", direct=True) as writer:
            assert not writer.direct
            writer.write(_page_aligned(payload))
        committed = txn.commit()
    assert (committed.path / "a.bin").read_bytes() == payload

    def denied(path: str | os.PathLike[str], flag: int, *args: int, **kwargs: int) -> int:
        if flag & O_DIRECT:
            raise OSError(errno.EACCES, "Permission denied")
        return real_open(path, flag, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(PermissionError), CheckpointTransaction(tmp_path, 2) as txn:
        txn.create("a.bin", direct=True)
