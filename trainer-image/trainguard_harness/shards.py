"""Token shards: the data format of the reference trainer, a reader, and a synthetic generator.

Format: every `*.bin` file in the data directory, in name order, is one shard: a flat array
of little-endian unsigned 16-bit token ids (so a vocabulary of at most 65536), no header: the
same layout as nanoGPT's `train.bin`. A shard of N tokens is 2N bytes.

`TokenStream` reads consecutive windows of `batch_size * block_size + 1` tokens, shard after
shard, wrapping around at the end (a new epoch). Its position is a checkpoint component, so a
resumed run reads exactly the batches an uninterrupted run would have read. With several
data-parallel ranks each batch is `world_size` consecutive windows and rank r reads the r-th:
the position is the same on every rank, so rank 0's checkpoint resumes them all.

Generate synthetic shards (a learnable Markov chain) for tests and the demo::

    python -m trainguard_harness.shards --out /trainguard/data --shards 4 --tokens 1000000
"""

from __future__ import annotations

import argparse
import array
import os
import random
import sys
from pathlib import Path
from typing import Any

import torch

SHARD_SUFFIX = ".bin"
TOKEN_BYTES = 2
MAX_VOCAB = 1 << 16
# Each token is followed by one of this many likely successors: learnable, not trivial.
SUCCESSORS = 4


def shard_paths(data_dir: str | os.PathLike[str]) -> list[Path]:
    """The shards of a data directory, in order."""
    return sorted(path for path in Path(data_dir).glob(f"*{SHARD_SUFFIX}") if path.is_file())


def _require_little_endian() -> None:
    # Shards are little-endian and read without conversion; every GPU host platform is too.
    if sys.byteorder != "little":
        raise RuntimeError("token shards are little-endian; this host is not")


def write_shard(path: Path, tokens: array.array[int]) -> None:
    """Write one shard (`tokens` is an array of type 'H')."""
    _require_little_endian()
    path.write_bytes(tokens.tobytes())


def write_synthetic_shards(
    out: str | os.PathLike[str],
    *,
    shards: int = 2,
    tokens_per_shard: int = 65_536,
    vocab_size: int = 256,
    seed: int = 0,
) -> list[Path]:
    """Write `shards` shards of a random Markov chain over `vocab_size` tokens; return them."""
    if not 2 <= vocab_size <= MAX_VOCAB:
        raise ValueError(f"vocab_size must be within 2..{MAX_VOCAB}")
    rng = random.Random(seed)
    successors = [[rng.randrange(vocab_size) for _ in range(SUCCESSORS)] for _ in range(vocab_size)]
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    token = 0
    paths = []
    for index in range(shards):
        tokens = array.array("H")
        for _ in range(tokens_per_shard):
            token = rng.choice(successors[token])
            tokens.append(token)
        path = directory / f"shard-{index:05d}{SHARD_SUFFIX}"
        write_shard(path, tokens)
        paths.append(path)
    return paths


class TokenStream:
    """Consecutive (input, target) batches from the shards, with a resumable position."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        batch_size: int,
        block_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        _require_little_endian()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} of a world of {world_size}")
        self.rank, self.world_size = rank, world_size
        self.paths = shard_paths(data_dir)
        self.window = batch_size * block_size + 1
        self.batch_size, self.block_size = batch_size, block_size
        if not self.paths:
            raise FileNotFoundError(f"no *{SHARD_SUFFIX} shards in {data_dir}")
        self.sizes = [path.stat().st_size // TOKEN_BYTES for path in self.paths]
        if max(self.sizes) < self.window:
            raise ValueError(f"every shard is shorter than one batch ({self.window} tokens)")
        self.shard, self.offset, self.epoch = 0, 0, 0

    def state_dict(self) -> dict[str, Any]:
        """The read position (a checkpoint component)."""
        return {"shard": self.shard, "offset": self.offset, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved read position."""
        self.shard, self.offset, self.epoch = state["shard"], state["offset"], state["epoch"]

    def _advance_to_fitting_shard(self) -> None:
        while self.offset + self.window > self.sizes[self.shard]:
            self.shard, self.offset = self.shard + 1, 0
            if self.shard == len(self.paths):
                self.shard, self.epoch = 0, self.epoch + 1

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (inputs, targets), each of shape (batch_size, block_size), dtype int64.

        This rank's window of the next `world_size` windows (all of them for one rank).
        """
        data = bytearray()
        for rank in range(self.world_size):
            self._advance_to_fitting_shard()
            if rank == self.rank:
                with self.paths[self.shard].open("rb") as handle:
                    handle.seek(self.offset * TOKEN_BYTES)
                    data = bytearray(handle.read(self.window * TOKEN_BYTES))
            self.offset += self.window - 1
        # int16 then a mask: uint16 arithmetic is not supported by every torch version.
        tokens = torch.frombuffer(data, dtype=torch.int16).to(torch.int64) & 0xFFFF
        shape = (self.batch_size, self.block_size)
        return tokens[:-1].view(shape), tokens[1:].view(shape)


def main(argv: list[str] | None = None) -> int:
    """Command line: write synthetic shards."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="data directory to write into")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=65_536, help="tokens per shard")
    parser.add_argument("--vocab-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = write_synthetic_shards(
        args.out,
        shards=args.shards,
        tokens_per_shard=args.tokens,
        vocab_size=args.vocab_size,
        seed=args.seed,
    )
    print(f"wrote {len(paths)} shards of {args.tokens} tokens to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
