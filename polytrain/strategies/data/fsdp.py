"""``fsdp``: PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``), the anchor users know for
sharded data parallelism (Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
Parallel", VLDB 2023; FSDP2 shards each parameter on dim 0 as a DTensor).

Each layer (child module) is one ``fully_shard`` group by default (``wrap=layer``), the root a
last one for the parameters no layer owns; ``wrap=model`` makes the whole model one group.
``reshard_after_forward=true`` (default) frees a layer's gathered parameters after its forward and
gathers them again for backward (ZeRO stage 3); ``false`` keeps them until backward (stage 2's
memory for parameters, one all-gather per step fewer).

FSDP2 calls ``torch.distributed`` itself, not polytrain's communicator; its all-gathers and
reduce-scatters are counted at the same ring rates through a counting view of
``torch.distributed`` installed into FSDP2's collectives module (as ``allreduce`` does for
PyTorch's PowerSGD hook), so ``bytes_sent`` stays measured.

Training features: ``--precision bf16|fp16`` is FSDP2's ``MixedPrecisionPolicy`` (parameters
gathered and gradients reduce-scattered in that dtype, fp32 sharded parameters as the master
weights) with the forward under autocast, as ``single`` runs it; fp16's ``GradScaler`` reads the
DTensor gradients, and DTensor's own handler of the unscale op all-reduces the found-inf flag over
the mesh (4 bytes a step, outside polytrain's count), so every rank skips the same steps.
``--grad-accum K`` turns gradient sync off (``set_requires_gradient_sync(False)``) for all but the
last micro-step; ``--clip-grad-norm X`` sums the squares of each rank's local gradient shards
(:mod:`polytrain.runtime.clip`, one counted all-reduce). ``--activation-checkpointing`` wraps
each block's forward in a non-reentrant checkpoint before ``fully_shard`` (the order torch
recommends); FSDP2's pre-backward hook gathers the layer before its recomputation.

Checkpoints: each rank writes the local shards of its DTensor parameters and optimizer state
(``rank<r>.pt``, tensors only) and rank 0 the consolidated ``model.pt``; a resume copies the shards
back in place and rebuilds the optimizer's DTensor state from them, so it continues bit for bit.
It needs the same ``--procs`` and ``wrap`` (the same shards).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from polytrain.comm.accounted import Comm
from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime import recompute
from polytrain.runtime.checkpoint import CheckpointStore
from polytrain.runtime.clip import GradSplit, local
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import (
    LoopSpec,
    commit_with_model,
    newest_checkpoint,
    plain_step,
    run_loop,
)
from polytrain.runtime.precision import DTYPES, Precision
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.data.allreduce import check_divisible
from polytrain.strategies.data.zero import optimizer_state_bytes, peak_memory
from polytrain.strategies.data.zero_units import layers_of

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene


class FsdpOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reshard_after_forward: bool = Field(True, description="free a layer's gathered parameters after "
                                        "its forward and gather them again for backward")
    wrap: Literal["layer", "model"] = Field("layer", description="one fully_shard group per layer "
                                            "(child module), or one for the whole model")


class _CountingCollectives:
    """``torch.distributed`` as FSDP2's collectives see it, each all-gather and reduce-scatter
    counted on ``comm`` at ring rates (W−1 chunks of the shard to the successor)."""

    def __init__(self, real: Any, comm: Comm) -> None:
        self._real, self._comm = real, comm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def all_gather_single(self, out: torch.Tensor, inp: torch.Tensor, *a: Any, **k: Any) -> Any:
        self._count("allgather", inp)
        return self._real.all_gather_single(out, inp, *a, **k)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              *a: Any, **k: Any) -> Any:
        self._count("reducescatter", output)
        return self._real.reduce_scatter_single(output, input, *a, **k)

    def all_reduce(self, tensor: torch.Tensor, *a: Any, **k: Any) -> Any:
        self._comm._count_ring_allreduce(tensor, "allreduce")
        return self._real.all_reduce(tensor, *a, **k)

    def _count(self, op: str, t: torch.Tensor) -> None:
        c = self._comm
        if c.world > 1:
            c.record(op, (c.rank + 1) % c.world, (c.world - 1) * t.numel() * t.element_size())


def count_fsdp_traffic(comm: Comm) -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    real = getattr(_fsdp_collectives.dist, "_real", _fsdp_collectives.dist)  # never wrap twice
    _fsdp_collectives.dist = _CountingCollectives(real, comm)  # type: ignore[assignment]


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else local(t)


def _full(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state_dict (collective: every rank gathers every DTensor)."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()}


def save_fsdp(job: Job, ctx: RankContext, model: nn.Module, optimizer: torch.optim.Optimizer,
              amp: Precision | None, step: int) -> None:
    """Collective: every rank writes its local shards and optimizer state, rank 0 also the
    consolidated ``model.pt``, then rank 0 seals the checkpoint."""
    opt = optimizer.state_dict()
    ctx.checkpoints.write_rank(step, ctx.rank, {
        "step": torch.tensor(step), "rng": torch.get_rng_state(),
        "model": {k: local(v).detach().clone() for k, v in model.state_dict().items()},
        "optimizer": {"param_groups": opt["param_groups"],
                      "state": {i: {k: local(v).clone() if isinstance(v, torch.Tensor) else v
                                    for k, v in st.items()} for i, st in opt["state"].items()}},
        "precision": amp.state() if amp is not None else {}})
    commit_with_model(job, ctx, step, _full(model))


def restore_fsdp(ctx: RankContext, model: nn.Module, optimizer: torch.optim.Optimizer,
                 amp: Precision | None) -> int:
    """Copy this rank's saved shards back into its DTensors; rebuild the optimizer's state as
    DTensors laid out like their parameters."""
    from torch.distributed.tensor import DTensor

    ckpt = newest_checkpoint(ctx)
    state = CheckpointStore.load_rank(ckpt, ctx.rank)
    with torch.no_grad():
        for k, v in model.state_dict().items():
            saved = state["model"][k]
            if local(v).shape != saved.shape:
                raise ConfigError(f"Checkpoint {ckpt} holds shards of another layout ({k}: "
                                  f"{tuple(saved.shape)}, here {tuple(local(v).shape)}); resume "
                                  "with the --procs and wrap it was written with.")
            local(v).copy_(saved)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    opt = state["optimizer"]
    for i, st in opt["state"].items():
        p = params[int(i)]
        for k, v in st.items():
            if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.dim() > 0:
                st[k] = DTensor.from_local(v, p.device_mesh, p.placements, shape=p.shape,
                                           stride=p.stride())
    optimizer.load_state_dict(opt)
    if amp is not None:
        amp.load_state(state.get("precision", {}))
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def fsdp_held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of this rank's local shards of parameters, gradients and optimizer state."""
    def nbytes(ts: Any) -> int:
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    params = list(model.parameters())
    state = [_local(v) for p in params for v in optimizer.state.get(p, {}).values()
             if isinstance(v, torch.Tensor)]
    per_elem = [t for t in state if t is not None and t.dim() > 0]
    return {"params": nbytes(_local(p) for p in params),
            "grads": nbytes(_local(p.grad) for p in params),
            "optimizer": nbytes(per_elem),
            "optimizer_scalars": nbytes(t for t in state if t is not None and t.dim() == 0)}


class Fsdp(Strategy):
    name = "fsdp"
    family = "data"
    summary = "PyTorch FSDP2 (fully_shard per layer): parameters, gradients, optimizer state sharded"
    Options = FsdpOptions
    supports = Supports(lr_schedule=True, clip=True, grad_accum=True, precision=True,
                        recompute=True)
    exact = True

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        w = scene.cluster.world
        if w >= 2 and scene.batch % w == 0:
            yield w, {}
            yield w, {"reshard_after_forward": False}

    def price(self, scene: Scene, world: int) -> Estimate | str:
        """ZeRO stage 3 with FSDP2's default prefetch of the next layer (``wrap=layer``)."""
        from polytrain.cost.sharded import sharded

        o: FsdpOptions = self.options  # type: ignore[assignment]
        if o.wrap == "model":
            return "the planner prices fsdp per layer (wrap=layer) only"
        return sharded(scene, world, 3, prefetch=True, keep_gathered=not o.reshard_after_forward,
                       reduce_each_micro=False)  # gradient sync off but the last micro-step

    def check(self, cfg: JobConfig, world: int) -> None:
        check_divisible(cfg, world, self.name)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        opts: FsdpOptions = self.options  # type: ignore[assignment]
        model = job.build_model().to(ctx.device)
        blocks = recompute.apply(model, job.config.activation_checkpointing)  # before fully_shard
        count_fsdp_traffic(ctx.comm)
        low = DTYPES[job.config.precision]
        policy = (MixedPrecisionPolicy() if low == torch.float32 else
                  MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low))
        if opts.wrap == "layer":
            for layer in layers_of(model):
                if any(True for _ in layer.parameters()):
                    fully_shard(layer, reshard_after_forward=opts.reshard_after_forward,
                                mp_policy=policy)
        fully_shard(model, reshard_after_forward=opts.reshard_after_forward, mp_policy=policy)
        optimizer = job.make_optimizer(model.parameters())
        step = plain_step(job, ctx, model, optimizer, split=GradSplit(ctx.comm))
        amp: Precision | None = getattr(step, "precision", None)
        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=step,
                        part=ctx.rank, parts=ctx.world, replicated=False,
                        save=lambda i: save_fsdp(job, ctx, model, optimizer, amp, i),
                        restore=lambda: restore_fsdp(ctx, model, optimizer, amp),
                        metrics={"wrap": opts.wrap, "reshard_after_forward": opts.reshard_after_forward,
                                 "recomputed_blocks": blocks})
        result = run_loop(job, ctx, spec)  # every rank evaluates: a forward gathers collectively
        result.strategy_metrics.update({
            "params_total": sum(p.numel() for p in model.parameters()),
            "optimizer_bytes_per_param": optimizer_state_bytes(job.config),
            "held_bytes": fsdp_held_bytes(model, optimizer), **peak_memory(ctx.device)})
        if result.model_state is not None:
            full = _full(model)  # collective on every rank
            result.model_state = full if ctx.is_leader else None
        return result
