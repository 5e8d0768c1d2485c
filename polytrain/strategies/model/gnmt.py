"""``gnmt``: GNMT-style model parallelism of `seq2seq-lstm` — one LSTM layer per rank, wave-front
execution over time (Wu et al. 2016; 000 §IV).

Stage s holds one LSTM layer (the embedding joins the first, the bridge the last encoder layer,
the head the last decoder layer), like ``layerwise --set partition=2,2,1,2`` for two layers per
side. Unlike layerwise, a batch does not cross a stage whole: its time axis is cut into
``chunks`` pieces per side and a stage passes chunk k on as soon as it is done, so layer i works
on chunk k while layer i+1 works on chunk k−1:

    time →      t0   t1   t2   t3   t4   t5
    stage 0     c0   c1   c2   c3                 (forward; backward runs the same in reverse,
    stage 1          c0   c1   c2   c3             last chunk first, with the LSTM state's
    stage 2               c0   c1   c2   c3        gradient carried back chunk to chunk)

Two places need a whole side first, as in GNMT: the bidirectional first encoder layer (its
backward direction starts at the end of the source) and the decoder's attention (it reads the
whole encoder output). Gradients equal one backward over the whole batch, so gnmt equals
``layerwise`` (and ``single``) on the same model.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.models import seq2seq as s2s
from polytrain.models.partition import Partition, cut
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, StepFn, run_loop
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Strategy
from polytrain.strategies.model.gnmt_chunks import ChunkChild, Chunks, Ready, chunked
from polytrain.strategies.model.layerwise import utilisation
from polytrain.strategies.pipeline.activations_wire import gather_stages


class GnmtOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    chunks: int = Field(4, ge=1, description="time chunks per side (source, target)")


def lstm_partition(model: nn.Sequential) -> Partition:
    """One stage per LSTM child; other children join the neighbouring LSTM's stage."""
    starts = [i for i, c in enumerate(model.children()) if isinstance(c, s2s.EncoderLayer | s2s.DecoderLayer)]
    if not starts:
        raise ConfigError("Strategy 'gnmt' needs the seq2seq-lstm model (--model seq2seq-lstm).")
    bounds = [0, *starts[1:], len(model)]
    return Partition(tuple(b - a for a, b in itertools.pairwise(bounds)))


class GnmtStage:
    """This rank's children as chunk runners, and the chunk traffic with its neighbours."""

    def __init__(self, layers: nn.Sequential, index: int, count: int, ctx: RankContext,
                 chunks: Chunks, hidden: int, vocab: int) -> None:
        self.layers, self.index, self.count, self.ctx = layers, index, count, ctx
        self.chunks, self.hidden, self.vocab = chunks, hidden, vocab
        self.runners: list[ChunkChild] = [chunked(c, chunks) for c in layers.children()]
        self.pending: list[tuple[object, torch.Tensor]] = []

    def _send(self, t: torch.Tensor, dst: int, op: str) -> None:
        t = t.detach().contiguous()
        self.pending.append((self.ctx.comm.isend(t, dst, op=op), t))

    def _recv(self, rows: int, k: int, src: int, op: str) -> torch.Tensor:
        a, e = self.chunks.bounds[k]
        buf = torch.empty(rows, e - a, self.hidden)
        with self.ctx.recorder.span(f"recv_{op}", cat="comm"):
            self.ctx.comm.recv(buf, src, op=op)
        return buf

    def flush(self) -> None:
        with self.ctx.recorder.span("send_wait", cat="comm"):
            for work, _ in self.pending:
                work.wait()  # type: ignore[attr-defined]
        self.pending.clear()

    def _chain(self, k: int, x: torch.Tensor | None, backward: bool) -> Ready:
        ready: Ready = [(k, x)]
        runners = reversed(self.runners) if backward else self.runners
        for r in runners:
            nxt: Ready = []
            for j, t in ready:
                nxt += r.backward(j, t) if backward else r.forward(j, t)  # type: ignore[arg-type]
            ready = nxt
        return ready

    def forward(self, tokens: torch.Tensor, step: int, op: str = "activation") -> dict[int, torch.Tensor]:
        """All chunks through this stage; the last stage returns its logits per decoder chunk."""
        for r in self.runners:
            r.reset()
        rows, logits = tokens.shape[0], {}
        for k, (a, e) in enumerate(self.chunks.bounds):
            x = tokens[:, a:e] if self.index == 0 else self._recv(rows, k, self.index - 1, op)
            training = torch.is_grad_enabled()  # evaluation is not counted as busy time
            with self.ctx.recorder.span("forward" if training else "eval_forward",
                                        cat="compute" if training else "eval", step=step, mb=k):
                ready = self._chain(k, x, backward=False)
            for j, out in ready:
                if self.index == self.count - 1:
                    logits[j] = out
                else:
                    self._send(out, self.index + 1, op)  # type: ignore[arg-type]
        self.flush()
        return logits  # type: ignore[return-value]

    def backward(self, rows: int, grads: dict[int, torch.Tensor], step: int) -> None:
        """Chunks in reverse order; ``grads``: the last stage's logits gradients."""
        last = self.index == self.count - 1
        for k in reversed(range(len(self.chunks.bounds))):
            g = grads.get(k) if last else self._recv(rows, k, self.index + 1, "gradient")
            with self.ctx.recorder.span("backward", step=step, mb=k):
                ready = self._chain(k, g, backward=True)
            if self.index > 0:
                for _, gin in ready:
                    self._send(gin, self.index - 1, "gradient")  # type: ignore[arg-type]
        self.flush()

    @torch.no_grad()
    def infer(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.forward(x, 0, op="eval_activation")
        rows, length = x.shape[0], self.chunks.seq_len - self.chunks.split
        out = (torch.cat([logits[k] for k in sorted(logits)], dim=1) if logits
               else torch.empty(rows, length, self.vocab))
        self.ctx.comm.broadcast(out, self.count - 1, op="eval_logits")
        return out


class _Eval(nn.Module):
    def __init__(self, stage: GnmtStage) -> None:
        super().__init__()
        self.stage, self.layers = stage, stage.layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage.infer(x)


def gnmt_step(job: Job, stage: GnmtStage, optimizer: torch.optim.Optimizer) -> StepFn:
    def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
        optimizer.zero_grad(set_to_none=True)
        logits = stage.forward(x, i)
        grads: dict[int, torch.Tensor] = {}
        loss = torch.zeros(1)
        if stage.index == stage.count - 1:
            leaves = {k: t.detach().requires_grad_() for k, t in logits.items()}
            full = job.loss(torch.cat([leaves[k] for k in sorted(leaves)], dim=1), y)
            full.backward()
            grads = {k: t.grad for k, t in leaves.items() if t.grad is not None}
            loss = full.detach().reshape(1)
        stage.backward(x.shape[0], grads, i)
        with stage.ctx.recorder.span("optimizer", step=i):
            optimizer.step()
        stage.ctx.comm.broadcast(loss, stage.count - 1, op="loss")
        return float(loss)

    return step


class Gnmt(Strategy):
    name = "gnmt"
    supports = Supports(lr_schedule=True)
    family = "model"
    summary = "GNMT: one LSTM layer per rank, wave-front over time chunks (seq2seq-lstm)"
    Options = GnmtOptions

    def check(self, cfg: JobConfig, world: int) -> None:
        if cfg.model != "seq2seq-lstm":
            raise ConfigError(
                f"Strategy 'gnmt' runs the layers of seq2seq-lstm, not --model {cfg.model}. "
                "Fix: --model seq2seq-lstm --dataset chars."
            )
        layers = int(cfg.model_options.get("layers", 2))
        if world != 2 * layers:
            raise ConfigError(
                f"Strategy 'gnmt' puts one LSTM layer on each rank: seq2seq-lstm with "
                f"layers={layers} has {2 * layers} (encoder and decoder), but --procs is {world}. "
                f"Fix: --procs {2 * layers}"
                + (f", or --set model.layers={world // 2}." if world % 2 == 0 else ".")
            )

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: GnmtOptions = self.options  # type: ignore[assignment]
        full = job.build_model().to(ctx.device)
        state = full.state_dict()
        partition = lstm_partition(full)
        partition.check(len(full), ctx.world)
        pieces = cut(full, partition)
        embed = full.get_submodule("embed")
        if not isinstance(embed, s2s.Embed):
            raise ConfigError("Strategy 'gnmt' needs the seq2seq-lstm model (--model seq2seq-lstm).")
        chunks = Chunks(job.spec.input_shape[0], opts.chunks)
        stage = GnmtStage(pieces[ctx.rank], ctx.rank, ctx.world, ctx, chunks,
                          hidden=embed.src.embedding_dim, vocab=embed.src.num_embeddings)
        optimizer = job.make_optimizer(stage.layers.parameters())
        spec = LoopSpec(model=stage.layers, optimizer=optimizer, step_fn=gnmt_step(job, stage, optimizer),
                        replicated=False, eval_model=_Eval(stage))
        result = run_loop(job, ctx, spec)
        keys: Sequence[Sequence[str]] = [list(p.state_dict()) for p in pieces]
        result.model_state = gather_stages(ctx.comm, ctx.rank, stage.layers.state_dict(), keys,
                                           {k: v.shape for k, v in state.items()},
                                           {k: v.dtype for k, v in state.items()})
        util = utilisation(ctx, result.wall_s)
        result.strategy_metrics.update({"partition": partition.to_json(), "chunks": chunks.bounds})
        if util is not None:
            result.strategy_metrics.update({"utilisation_per_rank": util,
                                            "mean_utilisation": sum(util) / len(util)})
        return result
