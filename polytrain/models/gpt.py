"""`gpt-mini`: a small GPT (nanoGPT-style, pre-LayerNorm, causal) for the `chars` data.

Children: ``embed`` (token + position) → ``block1`` … ``blockN`` → ``head`` (final LayerNorm + LM
head). Shapes: (B, T) long → (B, T, D) → … → (B, T, D) → (B, T, V).

Attention is written out with separate q/k/v/proj Linear layers (no nn.MultiheadAttention) and
derives its number of heads from ``q.out_features // head_dim``. A tensor-parallel strategy can
therefore give each rank whole heads — rows of q/k/v, columns of proj — and the module runs as
is on the shard; the ranks then sum their proj outputs (and add proj's bias once). The MLP splits
the same way (rows of fc, columns of proj).

``vocab`` (default: the dataset's vocabulary) sizes the token embedding only; the head still
scores the dataset's vocabulary. Ids beyond the data's are never looked up, so e.g. ``vocab=100000``
on ``chars`` gives a word-model-sized embedding whose gradient touches a few hundred rows a step.

Embedding and LM head are NOT tied: they live in different children, and a pipeline would have to
keep one parameter in sync across two stages.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from polytrain.data import DataSpec
from polytrain.models.registry import ModelEntry, register_model


class GptOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    n_layer: int = Field(2, ge=1, le=1024)
    n_head: int = Field(4, ge=1)
    d_model: int = Field(64, ge=1)
    seq_len: int | None = Field(None, ge=1, description="positions (default: the dataset's T)")
    vocab: int | None = Field(None, ge=1, description="token-embedding rows (default: the data's "
                              "vocabulary); larger gives a big, row-sparse embedding")


class Embed(nn.Module):
    """(B, T) token ids -> (B, T, D) token + learned position embeddings."""

    def __init__(self, vocab: int, seq_len: int, d_model: int) -> None:
        super().__init__()
        # Uninitialised here (from_pretrained skips Embedding's N(0,1) init, which on the meta
        # device costs ~2.5 s); _init draws the weights.
        self.tok = nn.Embedding.from_pretrained(torch.empty(vocab, d_model), freeze=False)
        self.pos = nn.Embedding.from_pretrained(torch.empty(seq_len, d_model), freeze=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)


class CausalSelfAttention(nn.Module):
    """(B, T, D) -> (B, T, D); heads = q.out_features // head_dim (see the module docstring)."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.head_dim = d_model // n_head
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        heads = self.q.out_features // self.head_dim

        def split(y: torch.Tensor) -> torch.Tensor:  # (B, T, h·hd) -> (B, h, T, hd)
            return y.view(b, t, heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, hd)
        return self.proj(y.transpose(1, 2).reshape(b, t, heads * self.head_dim))


class Mlp(nn.Module):
    """(B, T, D) -> Linear(4D) -> GELU -> Linear(D) -> (B, T, D)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(x)). (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = Mlp(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """(B, T, D) -> final LayerNorm -> Linear (no bias) -> (B, T, V) logits."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def _check(spec: DataSpec, o: GptOptions) -> str | None:
    if spec.input_dtype != "long" or len(spec.input_shape) != 1:
        return "it needs token inputs (T,) of integer ids"
    if o.d_model % o.n_head:
        return f"d_model={o.d_model} must be a multiple of n_head={o.n_head}"
    if o.seq_len is not None and o.seq_len < spec.input_shape[0]:
        return (
            f"seq_len={o.seq_len} is shorter than the dataset's sequences "
            f"({spec.input_shape[0]}); drop the option or raise it"
        )
    if o.vocab is not None and o.vocab < spec.num_classes:
        return (f"vocab={o.vocab} is smaller than the dataset's vocabulary ({spec.num_classes}); "
                "drop the option or raise it")
    return None


def _init(model: nn.Module, n_layer: int) -> None:
    if next(model.parameters()).is_meta:
        return  # only counting: normal_ on meta loads torch's meta kernels (~2.5 s, once)
    # GPT-2 init: N(0, 0.02); residual projections scaled by 1/√(2·n_layer) so the residual
    # stream's variance does not grow with depth.
    for name, p in model.named_parameters():
        if p.dim() == 1:
            continue  # biases stay 0, LayerNorm weights stay 1
        std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
        nn.init.normal_(p, 0.0, std)
    for m in model.modules():
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


def build_gpt_mini(spec: DataSpec, o: GptOptions) -> nn.Sequential:
    seq_len = o.seq_len or spec.input_shape[0]
    layers: OrderedDict[str, nn.Module] = OrderedDict(
        embed=Embed(o.vocab or spec.num_classes, seq_len, o.d_model))
    for i in range(o.n_layer):
        layers[f"block{i + 1}"] = Block(o.d_model, o.n_head)
    layers["head"] = Head(o.d_model, spec.num_classes)
    model = nn.Sequential(layers)
    _init(model, o.n_layer)
    return model


register_model(
    ModelEntry(
        name="gpt-mini",
        description="small causal transformer (pre-LN, explicit q/k/v heads), output (B, T, V)",
        Options=GptOptions,
        tasks=("lm",),
        factory=build_gpt_mini,
        default_dataset="chars",
        check=_check,
    )
)
