"""A small GPT-style language model (pre-norm transformer decoder, tied embeddings).

Sizes range from `tiny` (trains on a CPU in seconds, used by the tests) to GPT-2 small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    """Model dimensions."""

    vocab_size: int = 256
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError("n_embd must be a multiple of n_head")


PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(),
    "small": GPTConfig(vocab_size=50_304, block_size=512, n_layer=6, n_head=8, n_embd=512),
    "gpt2": GPTConfig(vocab_size=50_304, block_size=1024, n_layer=12, n_head=12, n_embd=768),
}


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention over earlier positions only."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend; x is (batch, time, channels)."""
        batch, time, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        heads = (batch, time, self.n_head, channels // self.n_head)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(batch, time, channels)
        out: torch.Tensor = self.resid_dropout(self.proj(y))
        return out


class Block(nn.Module):
    """Pre-norm attention and MLP with residual connections."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd),
            nn.GELU(),
            nn.Linear(4 * config.n_embd, config.n_embd),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    """The language model: token and position embeddings, blocks, tied output head."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied: fewer parameters, standard for GPT
        self.apply(self._init_weights)
        for name, parameter in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                # Residual projections scaled down with depth (GPT-2).
                nn.init.normal_(parameter, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of predicting `targets` from `idx` (both (batch, time))."""
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
