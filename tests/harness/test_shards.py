"""Token shards: the on-disk format, batches, and a resumable read position."""

from __future__ import annotations

import array
from pathlib import Path

import pytest
import torch

from trainguard_harness.shards import TokenStream, main, shard_paths, write_shard

pytestmark = pytest.mark.unit


def test_shards_are_little_endian_uint16_without_header(tmp_path: Path) -> None:
    write_shard(tmp_path / "a.bin", array.array("H", [1, 258, 65535]))
    assert (tmp_path / "a.bin").read_bytes() == bytes([1, 0, 2, 1, 255, 255])


def test_batches_follow_the_stream_across_shards_and_epochs(tmp_path: Path) -> None:
    write_shard(tmp_path / "s0.bin", array.array("H", range(0, 20)))
    write_shard(tmp_path / "s1.bin", array.array("H", range(100, 110)))
    (tmp_path / "notes.txt").write_text("ignored")
    stream = TokenStream(tmp_path, batch_size=2, block_size=3)  # windows of 7 tokens
    x, y = stream.next_batch()
    assert x.tolist() == [[0, 1, 2], [3, 4, 5]] and y.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert x.dtype == torch.int64
    firsts = [stream.next_batch()[0][0, 0].item() for _ in range(4)]
    # 6..12, 12..18, then s0 has too few tokens left: s1 100..106, then wrap to s0 (epoch 1).
    assert firsts == [6, 12, 100, 0]
    assert stream.state_dict() == {"shard": 0, "offset": 6, "epoch": 1}
    with pytest.raises(ValueError):
        TokenStream(tmp_path, batch_size=4, block_size=8)


def test_position_resumes_exactly(tmp_path: Path) -> None:
    main(["--out", str(tmp_path), "--shards", "3", "--tokens", "500", "--seed", "1"])
    assert [p.name for p in shard_paths(tmp_path)] == [f"shard-0000{i}.bin" for i in range(3)]
    first = TokenStream(tmp_path, batch_size=4, block_size=16)
    for _ in range(9):
        first.next_batch()
    saved = first.state_dict()
    expected = [first.next_batch()[0] for _ in range(5)]
    second = TokenStream(tmp_path, batch_size=4, block_size=16)
    second.load_state_dict(saved)
    assert all(torch.equal(a, second.next_batch()[0]) for a in expected)


def test_no_shards_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        TokenStream(tmp_path, batch_size=1, block_size=1)
