"""``tensor``: Megatron-LM intra-layer model parallelism of a transformer (000 §IV).

All ``--procs`` T ranks form one tensor-parallel group and see the whole global batch (no data
parallelism here; ``mesh`` with ``dp``×``tp`` adds it). Each rank holds 1/T of every attention
(whole heads) and MLP (see :mod:`polytrain.strategies.model.megatron`); the embedding, the
LayerNorms and the LM head are replicated. Per block and step: 2 all-reduces of the (B, T, D)
activations in forward and 2 of their gradients in backward.

Evaluation runs the same parallel forward on every rank; model.pt is the full model, gathered
from the shards at the end (booked as ``gather_model`` bytes).
"""

from __future__ import annotations

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.models.registry import is_user_model
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, plain_step, run_loop
from polytrain.strategies.base import Strategy
from polytrain.strategies.model.megatron import check_heads, shard_transformer
from polytrain.strategies.model.wire import Evaluating, Wire, gather_state

TRANSFORMERS = ("gpt-mini",)


def check_transformer(cfg: JobConfig, degree: int, strategy: str) -> None:
    if not is_user_model(cfg.model) and cfg.model not in TRANSFORMERS:
        raise ConfigError(
            f"Strategy '{strategy}' splits transformer blocks (attention heads and MLPs), but "
            f"--model {cfg.model} has none. Valid models: {', '.join(TRANSFORMERS)} (or your own "
            "built from polytrain.models.gpt.Block). Fix: --model gpt-mini --dataset chars."
        )
    if cfg.model == "gpt-mini":
        check_heads(cfg.model_options, degree, strategy)


class Tensor(Strategy):
    name = "tensor"
    family = "model"
    summary = "Megatron tensor parallelism: heads and MLP columns split, f/g all-reduces"

    def check(self, cfg: JobConfig, world: int) -> None:
        check_transformer(cfg, world, self.name)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        model = job.build_model().to(ctx.device)
        full_shapes = {k: v.shape for k, v in model.state_dict().items()}
        wire = Wire(ctx.comm, ctx.recorder)
        dims = shard_transformer(model, wire)
        optimizer = job.make_optimizer(model.parameters())
        step = plain_step(job, ctx, model, optimizer)
        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=step, replicated=False,
                        eval_model=Evaluating(model, wire))
        result = run_loop(job, ctx, spec)
        full = gather_state(wire, model.state_dict(), dims, full_shapes)
        result.model_state = full if ctx.is_leader else None
        steps = max(result.steps, 1)
        result.strategy_metrics.update({
            "tp": ctx.world,
            "allreduces_per_step": wire.calls.get("tp_allreduce", 0) / steps,
            "sharded_parameters": len(dims),
        })
        return result
