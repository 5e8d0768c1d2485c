"""The children of `seq2seq-lstm`, run one time chunk at a time (for ``gnmt``'s wave-front).

The sequence [0, T) is cut into chunks aligned at the encoder/decoder split S: ``Chunks.bounds``
lists (start, end) per chunk, source chunks first. Each child here wraps one zoo child and runs
it chunk by chunk with the same arithmetic as its ``forward`` on the whole sequence:

    Embed         source chunk: src table; decoder chunk: tgt table
    EncoderLayer  source chunk: LSTM from the previous chunk's (h, c) (+ residual); decoder: as is
                  bidirectional (enc1): needs the whole source — buffers, emits all at the last one
    Bridge        source chunk: tanh(Linear); decoder chunk: as is
    DecoderLayer  source chunk: as is, and kept as attention memory M; decoder chunk: attention
                  over M, then LSTM from the previous chunk's (h, c) (+ residual)
    Head          decoder chunk: logits (B, len, V); source chunk: nothing

``forward(k, x)`` returns the output chunks that became ready (in increasing order);
``backward(k, grad)`` is called with output chunks' gradients in decreasing order and returns the
input chunks' gradients that became ready (decreasing). Each chunk is its own autograd graph: its
inputs and carried LSTM state are fresh leaves, and the state's gradient flows back to the
previous chunk by hand — so chunk k's backward can run while the next layer works on k−1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from polytrain.models import seq2seq as s2s
from polytrain.strategies.model.shard_collectives import shard_bounds

Ready = list[tuple[int, torch.Tensor | None]]


@dataclass(frozen=True)
class Chunks:
    """Time chunks of a (B, T) sample: ``source`` chunks of [0, S), then ``target`` of [S, T)."""

    seq_len: int
    per_side: int

    @property
    def split(self) -> int:
        return s2s.split_point(self.seq_len)

    @property
    def bounds(self) -> list[tuple[int, int]]:
        s, t = self.split, self.seq_len
        src = shard_bounds(s, min(self.per_side, s))
        tgt = [(s + a, s + b) for a, b in shard_bounds(t - s, min(self.per_side, t - s))]
        return src + tgt

    @property
    def sources(self) -> int:
        return min(self.per_side, self.split)

    def is_source(self, k: int) -> bool:
        return k < self.sources


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().requires_grad_(x.is_floating_point() and torch.is_grad_enabled())


def _zeros_like_grad(x: torch.Tensor) -> torch.Tensor:
    return x.grad if x.grad is not None else torch.zeros_like(x)


class ChunkChild:
    """Base: per-chunk graphs (inputs, outputs) and the backward bookkeeping."""

    def __init__(self, chunks: Chunks) -> None:
        self.chunks = chunks
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}  # k -> (leaf, out)

    def reset(self) -> None:
        self.saved.clear()

    def forward(self, k: int, x: torch.Tensor) -> Ready:
        leaf = _leaf(x)
        out = self.compute(k, leaf)
        self.saved[k] = (leaf, out)
        return [] if out is None else [(k, out)]

    def compute(self, k: int, x: torch.Tensor) -> torch.Tensor | None:
        raise NotImplementedError

    def backward(self, k: int, grad: torch.Tensor | None) -> Ready:
        leaf, out = self.saved.pop(k)
        if out is not None and grad is not None and out.requires_grad:
            out.backward(grad)
        return [(k, _zeros_like_grad(leaf) if leaf.is_floating_point() else None)]


class EmbedChunks(ChunkChild):
    def __init__(self, chunks: Chunks, m: s2s.Embed) -> None:
        super().__init__(chunks)
        self.m = m

    def compute(self, k: int, x: torch.Tensor) -> torch.Tensor:  # (B, len) -> (B, len, H)
        return self.m.src(x) if self.chunks.is_source(k) else self.m.tgt(x)


class BridgeChunks(ChunkChild):
    def __init__(self, chunks: Chunks, m: s2s.Bridge) -> None:
        super().__init__(chunks)
        self.m = m

    def compute(self, k: int, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.m.memory(x)) if self.chunks.is_source(k) else x


class HeadChunks(ChunkChild):
    def __init__(self, chunks: Chunks, m: s2s.Head) -> None:
        super().__init__(chunks)
        self.m = m

    def compute(self, k: int, x: torch.Tensor) -> torch.Tensor | None:
        return None if self.chunks.is_source(k) else self.m.out(x)  # (B, len, V)


class RecurrentChunks(ChunkChild):
    """An LSTM over the chunks of one side, carrying (h, c) from chunk to chunk."""

    def __init__(self, chunks: Chunks, lstm: nn.LSTM, residual: bool) -> None:
        super().__init__(chunks)
        self.lstm, self.residual = lstm, residual
        self.state_in: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.state_out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.carry: tuple[torch.Tensor, torch.Tensor] | None = None

    def reset(self) -> None:
        super().reset()
        self.state_in.clear()
        self.state_out.clear()
        self.carry = None

    def runs_on(self, k: int) -> bool:
        raise NotImplementedError

    def lstm_input(self, k: int, x: torch.Tensor) -> torch.Tensor:
        return x

    def compute(self, k: int, x: torch.Tensor) -> torch.Tensor:
        if not self.runs_on(k):
            return x
        state = None
        if self.carry is not None:
            state = (_leaf(self.carry[0]), _leaf(self.carry[1]))
            self.state_in[k] = state
        h, (hn, cn) = self.lstm(self.lstm_input(k, x), state)
        self.state_out[k] = (hn, cn)
        self.carry = (hn, cn)
        return h + x if self.residual else h

    def backward(self, k: int, grad: torch.Tensor | None) -> Ready:
        leaf, out = self.saved.pop(k)
        if not self.runs_on(k):
            g = grad if grad is not None else torch.zeros_like(leaf)
            return [(k, g + leaf.grad if leaf.grad is not None else g)]
        assert out is not None  # a chunk this LSTM ran on has an output
        tensors = [out]
        grads = [grad if grad is not None else torch.zeros_like(out)]
        nxt = self.state_in.pop(k + 1, None)  # the next chunk's state leaves hold d(hn), d(cn)
        hn, cn = self.state_out.pop(k)
        if nxt is not None and nxt[0].grad is not None:
            tensors += [hn, cn]
            grads += [nxt[0].grad, _zeros_like_grad(nxt[1])]
        torch.autograd.backward(tensors, grads)
        return [(k, _zeros_like_grad(leaf))]


class EncoderChunks(RecurrentChunks):
    def __init__(self, chunks: Chunks, m: s2s.EncoderLayer) -> None:
        super().__init__(chunks, m.lstm, m.residual)

    def runs_on(self, k: int) -> bool:
        return self.chunks.is_source(k)


class DecoderChunks(RecurrentChunks):
    """Source chunks pass through and become the attention memory M (their leaves collect the
    attention's gradient, added to the pass-through gradient in ``backward``)."""

    def __init__(self, chunks: Chunks, m: s2s.DecoderLayer) -> None:
        super().__init__(chunks, m.lstm, m.residual)
        self.memory: list[torch.Tensor] = []

    def reset(self) -> None:
        super().reset()
        self.memory = []

    def runs_on(self, k: int) -> bool:
        return not self.chunks.is_source(k)

    def compute(self, k: int, x: torch.Tensor) -> torch.Tensor:
        if self.chunks.is_source(k):
            self.memory.append(x)  # x is this chunk's input leaf
        return super().compute(k, x)

    def lstm_input(self, k: int, x: torch.Tensor) -> torch.Tensor:
        memory = torch.cat(self.memory, dim=1)  # (B, S, H)
        scores = x @ memory.transpose(1, 2) / math.sqrt(x.shape[2])  # (B, len, S)
        return torch.cat([x, scores.softmax(dim=-1) @ memory], dim=-1)  # (B, len, 2H)


class BidirectionalChunks(ChunkChild):
    """GNMT's bidirectional first encoder layer: the backward direction needs the whole source,
    so it waits for every source chunk (forward) and every source gradient (backward)."""

    def __init__(self, chunks: Chunks, m: s2s.EncoderLayer) -> None:
        super().__init__(chunks)
        self.m = m
        self.grads: dict[int, torch.Tensor] = {}
        self.whole: torch.Tensor | None = None

    def reset(self) -> None:
        super().reset()
        self.grads.clear()
        self.whole = None

    def forward(self, k: int, x: torch.Tensor) -> Ready:
        leaf = _leaf(x)
        self.saved[k] = (leaf, None)
        if not self.chunks.is_source(k):
            return [(k, leaf)]
        if k < self.chunks.sources - 1:
            return []
        src = torch.cat([self.saved[j][0] for j in range(self.chunks.sources)], dim=1)
        h, _ = self.m.lstm(src)
        self.whole = h + src if self.m.residual else h
        b = self.chunks.bounds
        return [(j, self.whole[:, a:e]) for j, (a, e) in enumerate(b[: self.chunks.sources])]

    def backward(self, k: int, grad: torch.Tensor | None) -> Ready:
        leaf, _ = self.saved[k]
        if not self.chunks.is_source(k):
            self.saved.pop(k)
            return [(k, grad if grad is not None else torch.zeros_like(leaf))]
        self.grads[k] = grad if grad is not None else torch.zeros_like(leaf)
        if k > 0:
            return []
        assert self.whole is not None
        self.whole.backward(torch.cat([self.grads[j] for j in range(self.chunks.sources)], dim=1))
        leaves = [self.saved.pop(j)[0] for j in range(self.chunks.sources)]
        return [(j, _zeros_like_grad(leaves[j])) for j in reversed(range(self.chunks.sources))]


def chunked(child: nn.Module, chunks: Chunks) -> ChunkChild:
    """The chunk runner of a seq2seq-lstm child."""
    if isinstance(child, s2s.Embed):
        return EmbedChunks(chunks, child)
    if isinstance(child, s2s.EncoderLayer):
        if child.lstm.bidirectional:
            return BidirectionalChunks(chunks, child)
        return EncoderChunks(chunks, child)
    if isinstance(child, s2s.Bridge):
        return BridgeChunks(chunks, child)
    if isinstance(child, s2s.DecoderLayer):
        return DecoderChunks(chunks, child)
    if isinstance(child, s2s.Head):
        return HeadChunks(chunks, child)
    raise TypeError(f"gnmt cannot run {type(child).__name__} chunk by chunk")
