"""Small language models with attention written three other ways, for ``tensor``'s plans:

- :class:`SeparateLM`: q/k/v projections apart (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``),
  ``num_heads`` and ``head_dim`` attributes, heads counted with ``view(B, T, -1, head_dim)`` as
  Hugging Face models do (the attribute rewrite alone splits it) and an ``fc1``/``fc2`` MLP;
- :class:`OddNamesLM`: fused ``wqkv``, output ``proj_out``, head count ``nh``: nothing polytrain
  recognises by name, so the user names them in ``tp_plan``;
- :class:`OpaqueLM`: a head count and standard names, but a head size read from the projection
  (``c_attn.in_features // n_head``): no local rewrite reproduces it, so it is refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SeparateAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = heads, d // heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d) for _ in range(3))
        self.o_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


class FusedAttention(nn.Module):
    """``wqkv``/``proj_out``/``nh`` (OddNamesLM), or ``c_attn``/``c_proj``/``n_head`` with the
    head size taken from ``c_attn.in_features`` (OpaqueLM)."""

    def __init__(self, d: int, heads: int, odd: bool) -> None:
        super().__init__()
        self.odd = odd
        if odd:
            self.wqkv, self.proj_out, self.nh = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
        else:
            self.c_attn, self.c_proj, self.n_head = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        if self.odd:
            qkv, heads, out = self.wqkv(x), self.nh, self.proj_out
            size = qkv.shape[-1] // 3 // heads
        else:
            qkv, heads, out = self.c_attn(x), self.n_head, self.c_proj
            size = self.c_attn.in_features // heads
        q, k, v = (z.reshape(b, t, heads, size).transpose(1, 2) for z in qkv.chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out(y.transpose(1, 2).reshape(b, t, heads * size))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, kind: str) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = (SeparateAttention(d, heads) if kind == "separate"
                     else FusedAttention(d, heads, odd=kind == "odd"))
        self.mlp = nn.Sequential()
        self.mlp.fc1, self.mlp.act, self.mlp.fc2 = nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class LM(nn.Module):
    kind = "separate"

    def __init__(self, vocab_size: int = 50, block_size: int = 16, d: int = 16, heads: int = 4,
                 layers: int = 2) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab_size, d), nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList(Block(d, heads, self.kind) for _ in range(layers))
        self.head = nn.Linear(d, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class SeparateLM(LM):
    kind = "separate"


class OddNamesLM(LM):
    kind = "odd"


class OpaqueLM(LM):
    kind = "opaque"
