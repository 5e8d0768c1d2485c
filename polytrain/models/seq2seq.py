"""`seq2seq-lstm`: a GNMT-like encoder–decoder LSTM as a Sequential of single-tensor children.

A sample of T tokens is split at S = T - T//2: the encoder reads x[:S] (the "source"), the decoder
reads x[S:] (its own inputs, i.e. the targets shifted right — teacher forcing) and predicts the
next token at each of its L = T//2 positions, y[S:]. The output is (B, L, V); ``task_loss``
scores it against the last L targets y[:, -L:].

One tensor carries everything between children, concatenated along TIME: z is (B, T, H) with
positions [0, S) holding the encoder side and [S, T) the decoder side.

    embed      (B, T) long -> (B, T, H): source embedding for [0, S), target embedding for [S, T)
    enc1..encN z -> z: LSTM over z[:, :S] (enc1 bidirectional, as in GNMT); z[:, S:] passes through
    bridge     z -> z: projects the top encoder outputs into the attention memory M = z[:, :S]
    dec1..decN z -> z: for the decoder stream s = z[:, S:], dot-product attention over M gives a
               context c (B, L, H); LSTM over [s, c] (B, L, 2H); M passes through unchanged
    head       z -> (B, L, V): Linear on z[:, S:]

Honesty: M depends on x[:S] only; the decoder LSTMs are causal and their attention reads only M,
so the prediction at decoder position t depends on x[:t+1] and never on the target y[t] = x[t+1].
Layers from the third on (per side) add a residual connection, as in GNMT.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from polytrain.data import DataSpec
from polytrain.models.registry import ModelEntry, register_model


class Seq2SeqOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    layers: int = Field(2, ge=1, le=16, description="LSTM layers per side")
    hidden: int = Field(128, ge=2, multiple_of=2, description="LSTM width (even: bidirectional)")


def split_point(t: int) -> int:
    """S: the encoder reads positions [0, S), the decoder predicts at [S, T) (T//2 of them)."""
    return t - t // 2


class Embed(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        # Drawn in _init, not here: Embedding's own N(0,1) init on the meta device (parameter
        # counting) loads torch's meta kernels, ~2.5 s.
        self.src = nn.Embedding.from_pretrained(torch.empty(vocab, hidden), freeze=False)
        self.tgt = nn.Embedding.from_pretrained(torch.empty(vocab, hidden), freeze=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, H)
        s = split_point(x.shape[1])
        return torch.cat([self.src(x[:, :s]), self.tgt(x[:, s:])], dim=1)


class EncoderLayer(nn.Module):
    def __init__(self, hidden: int, bidirectional: bool, residual: bool) -> None:
        super().__init__()
        size = hidden // 2 if bidirectional else hidden  # two directions concatenate to H
        self.lstm = nn.LSTM(hidden, size, batch_first=True, bidirectional=bidirectional)
        self.residual = residual

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        s = split_point(z.shape[1])
        src = z[:, :s]
        h, _ = self.lstm(src)
        return torch.cat([h + src if self.residual else h, z[:, s:]], dim=1)


class Bridge(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.memory = nn.Linear(hidden, hidden)

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        s = split_point(z.shape[1])
        return torch.cat([torch.tanh(self.memory(z[:, :s])), z[:, s:]], dim=1)


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, residual: bool) -> None:
        super().__init__()
        self.lstm = nn.LSTM(2 * hidden, hidden, batch_first=True)
        self.residual = residual

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        s = split_point(z.shape[1])
        memory, stream = z[:, :s], z[:, s:]  # (B, S, H), (B, L, H)
        scores = stream @ memory.transpose(1, 2) / math.sqrt(z.shape[2])  # (B, L, S)
        context = scores.softmax(dim=-1) @ memory  # (B, L, H)
        h, _ = self.lstm(torch.cat([stream, context], dim=-1))
        return torch.cat([memory, h + stream if self.residual else h], dim=1)


class Head(nn.Module):
    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.out = nn.Linear(hidden, vocab)

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T//2, V)
        return self.out(z[:, split_point(z.shape[1]) :])


def _check(spec: DataSpec, _: Seq2SeqOptions) -> str | None:
    if spec.input_dtype != "long" or len(spec.input_shape) != 1:
        return "it needs token inputs (T,) of integer ids"
    if spec.input_shape[0] < 2:
        return "it needs sequences of at least 2 tokens (half source, half target)"
    return None


def build_seq2seq(spec: DataSpec, o: Seq2SeqOptions) -> nn.Sequential:
    vocab, h = spec.num_classes, o.hidden
    embed = Embed(vocab, h)
    layers: OrderedDict[str, nn.Module] = OrderedDict(embed=embed)
    for i in range(o.layers):
        layers[f"enc{i + 1}"] = EncoderLayer(h, bidirectional=i == 0, residual=i >= 2)
    layers["bridge"] = Bridge(h)
    for i in range(o.layers):
        layers[f"dec{i + 1}"] = DecoderLayer(h, residual=i >= 2)
    layers["head"] = Head(h, vocab)
    model = nn.Sequential(layers)
    if not embed.src.weight.is_meta:  # meta: only counting parameters
        for table in (embed.src, embed.tgt):
            nn.init.normal_(table.weight)  # nn.Embedding's default N(0, 1)
    return model


register_model(
    ModelEntry(
        name="seq2seq-lstm",
        description="GNMT-like encoder–decoder LSTM with attention; predicts the second half",
        Options=Seq2SeqOptions,
        tasks=("lm",),
        factory=build_seq2seq,
        default_dataset="chars",
        check=_check,
    )
)
