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

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from polytrain.config import JobConfig
from polytrain.data import DataSpec, dataset_spec
from polytrain.errors import ConfigError
from polytrain.models.call import call_of, placeholder_targets, token_inputs
from polytrain.models.gpt import CausalSelfAttention
from polytrain.models.registry import build_model, is_user_model
from polytrain.models.user import UserModule
from polytrain.runtime.clip import sharded_split
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, plain_step, run_loop
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.model.megatron import ShardDims, check_heads, shard_transformer
from polytrain.strategies.model.shard_collectives import Evaluating, Wire, gather_state
from polytrain.strategies.model.tp_attention import local_comms
from polytrain.strategies.model.tp_plan import apply_plan, derive_plan, parse_plan, unchunk

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene


class TensorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tp_plan: str = Field("auto", description=(
        "auto: gpt-mini's Megatron split, or a plan derived for standard attention and MLP "
        "blocks; or MODULE_PATTERN:colwise|rowwise|qkv|heads,... (as DTensor's "
        "parallelize_module; heads on an attention module)"))


def shard_model(model: nn.Module, wire: Wire, tp_plan: str, spec: DataSpec | None = None
                ) -> tuple[ShardDims, ShardDims]:
    """gpt-mini blocks by Megatron's split; any other model by ``tp_plan`` (derived for 'auto').
    ``spec``: the data, whose example batch feeds the attention proofs."""
    if tp_plan == "auto" and any(isinstance(m, CausalSelfAttention) for m in model.modules()):
        return shard_transformer(model, wire), {}
    root, prefix = (model[0], "0.") if isinstance(model, UserModule) else (model, "")
    plan = derive_plan(root) if tp_plan == "auto" else parse_plan(tp_plan)
    example = None
    if spec is not None:
        from polytrain.models.trace_export import example_batch

        x = example_batch(spec).to(next(model.parameters()).device)
        example = (lambda _m: model(x, placeholder_targets(x, token_inputs(x)))  # noqa: E731
                   if call_of(model).kind == "targets" else model(x))
    dims, chunked = apply_plan(root, plan, wire, example)
    return ({prefix + k: v for k, v in dims.items()}, {prefix + k: v for k, v in chunked.items()})

def check_plan(cfg: JobConfig, degree: int, tp_plan: str) -> None:
    """A user model: the plan applied (and its attention proven) on the launcher, before launch."""
    if is_user_model(cfg.model):
        spec = dataset_spec(cfg.dataset, cfg.data_options)
        model = build_model(cfg.model, spec, cfg.model_options)
        shard_model(model, Wire(local_comms(degree)[0]), tp_plan, spec)


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
    supports = Supports(lr_schedule=True, clip=True, grad_accum=True, precision=True)
    family = "model"
    exact = True
    summary = "Megatron tensor parallelism: heads and MLP columns split, f/g all-reduces"
    Options = TensorOptions

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        from polytrain.cost import estimate as est

        w, prof = scene.cluster.world, scene.profile
        if w in (2, 4) and est.tp_layers(prof) and int(prof.model_options.get("n_head", 4)) % w == 0:
            yield w, {}

    def price(self, scene: Scene, world: int) -> Estimate | str:
        from polytrain.cost import estimate as est

        return est.tensor(scene, world)

    def check(self, cfg: JobConfig, world: int) -> None:
        check_transformer(cfg, world, self.name)
        opts: TensorOptions = self.options  # type: ignore[assignment]
        check_plan(cfg, world, opts.tp_plan)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        model = job.build_model().to(ctx.device)
        full_shapes = {k: v.shape for k, v in model.state_dict().items()}
        wire = Wire(ctx.comm, ctx.recorder)
        opts: TensorOptions = self.options  # type: ignore[assignment]
        dims, chunked = shard_model(model, wire, opts.tp_plan, job.spec)
        optimizer = job.make_optimizer(model.parameters())
        step = plain_step(job, ctx, model, optimizer, split=sharded_split(ctx.comm, model, dims, ctx.world))
        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=step, replicated=False,
                        eval_model=Evaluating(model, wire))
        result = run_loop(job, ctx, spec)
        full = gather_state(wire, model.state_dict(), dims, full_shapes)
        for key, chunks in chunked.items():  # along the dim it was split (Conv1D: 1)
            full[key] = unchunk(full[key].movedim(dims[key], 0), ctx.world, chunks
                                ).movedim(0, dims[key]).contiguous()
        result.model_state = full if ctx.is_leader else None
        steps = max(result.steps, 1)
        result.strategy_metrics.update({
            "tp": ctx.world,
            "allreduces_per_step": wire.calls.get("tp_allreduce", 0) / steps,
            "sharded_parameters": len(dims),
        })
        return result
