"""``ddnn``: a distributed deep neural network over end devices, an edge and a cloud, with an exit
at each tier (Teerapittayanon et al. 2017; 000 §V). The network is :mod:`.ddnn_net`'s (built
from the dataset's image shape; ``--model`` is not used).

    ranks   0: cloud    1: edge (and the local aggregator)    2 … E+1: end devices 0 … E−1

Training (every step, the whole batch; each device reads only its strip of the images):
devices send features f_e and exit scores s_e to the edge; the edge computes the local and edge
exits and sends its features g to the cloud; the cloud's exit closes the forward pass. Backward
returns d(g) to the edge and d(f_e), d(s_e) to each device; each tier updates its own layers on
the weighted sum of the three exits' losses (``weights``).

Inference (evaluation): the edge aggregates the device scores (local exit); samples whose
normalised entropy is below ``threshold`` leave there. Only for the others does the edge ask the
devices for their features (a row mask), computes the edge exit, and sends the still-unsure rows
to the cloud, which answers with their logits. eval.accuracy is the accuracy of the exits taken;
strategy_metrics add the exit fractions, accuracy and bytes per tier (training and inference),
and the same evaluation with the ``missing`` end devices switched off.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, StepFn, run_loop
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Strategy
from polytrain.strategies.hybrid.ddnn_tiers import CloudTier, DeviceTier, EdgeTier, Tier, TierSetup
from polytrain.strategies.pipeline.activations_wire import gather_stages


class DdnnOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    threshold: float = Field(0.5, ge=0, le=1, description="normalised entropy below which a sample exits")
    weights: str = Field("1,1,1", description="loss weights of the local, edge and cloud exits")
    aggregation: Literal["avg", "max"] = "avg"
    channels: int = Field(8, ge=1)
    hidden: int = Field(64, ge=1)
    missing: str = Field("last", description="end devices off in the second evaluation: 'last', "
                                             "'none' or indices like '0,2'")

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: str) -> str:
        try:
            w = [float(x) for x in v.split(",")]
        except ValueError:
            w = []
        if len(w) != 3 or min(w) < 0 or sum(w) == 0:
            raise ValueError("weights are three non-negative numbers, not all 0: local,edge,cloud "
                             "(e.g. 1,1,1 or 0.5,0.5,1)")
        return v

    def loss_weights(self) -> tuple[float, float, float]:
        a, b, c = (float(x) for x in self.weights.split(","))
        return a, b, c

    def missing_devices(self, devices: int) -> list[int]:
        if self.missing == "none":
            return []
        if self.missing == "last":
            if devices <= 1:
                raise ConfigError(
                    f"Strategy 'ddnn': missing='last' with {devices} end device switches off every "
                    "device in the second evaluation. Rule: at least one device left. Fix: --set "
                    "missing=none, or --procs 4 or more (2 end devices or more)."
                )
            return [devices - 1]
        try:
            out = sorted({int(x) for x in self.missing.split(",")})
        except ValueError:
            out = [-1]
        if not out or min(out) < 0 or max(out) >= devices or len(out) == devices:
            raise ConfigError(
                f"Strategy 'ddnn': missing={self.missing!r} with {devices} end devices. Rule: "
                f"distinct device indices 0..{devices - 1}, at least one device left, or 'last' / "
                "'none'. Fix: e.g. --set missing=0."
            )
        return out


class Ddnn(Strategy):
    name = "ddnn"
    supports = Supports(lr_schedule=True)
    family = "hybrid"
    summary = "DDNN: end devices, edge and cloud tiers with early exits by prediction entropy"
    Options = DdnnOptions

    @property
    def opts(self) -> DdnnOptions:
        return self.options  # type: ignore[return-value]

    def roles(self, world: int) -> list[str]:
        return ["cloud", "edge", *[f"device{e}" for e in range(max(0, world - 2))]][:world]

    def check(self, cfg: JobConfig, world: int) -> None:
        if world < 3:
            raise ConfigError(
                f"Strategy 'ddnn' needs a cloud, an edge and at least one end device: --procs 3 "
                f"or more (got {world}). Ranks: 0 cloud, 1 edge, 2.. end devices."
            )
        self.opts.missing_devices(world - 2)
        from polytrain.data import dataset_spec

        spec = dataset_spec(cfg.dataset, cfg.data_options)
        if spec.input_dtype != "float" or len(spec.input_shape) != 3 or spec.input_shape[2] < world - 2:
            raise ConfigError(
                f"Strategy 'ddnn' gives each of its {world - 2} end devices a vertical strip of an "
                f"image, so it needs image data at least {world - 2} pixels wide; dataset "
                f"'{cfg.dataset}' has inputs {spec.input_shape} {spec.input_dtype}. Fix: --dataset "
                "digits or synthetic-images."
            )

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        o = self.opts
        setup = TierSetup.make(job, ctx, o.channels, o.hidden, o.loss_weights(), o.aggregation,
                               o.threshold)
        tier = {0: CloudTier, 1: EdgeTier}.get(ctx.rank, DeviceTier)(setup)
        optimizer = job.make_optimizer(tier.module.parameters())
        spec = LoopSpec(model=tier.module, optimizer=optimizer, step_fn=_step(tier, optimizer),
                        replicated=False, eval_model=_Infer(tier))
        result = run_loop(job, ctx, spec)  # its final evaluation: every device present
        full_stats = tier.take_stats()
        missing = o.missing_devices(setup.devices)
        tier.missing = set(missing)
        missing_eval = job.evaluate(_Infer(tier))
        miss_stats = tier.take_stats()
        result.model_state = gather_stages(ctx.comm, ctx.rank, tier.module.state_dict(), setup.keys,
                                           setup.shapes, setup.dtypes)
        gathered = ctx.comm.gather_json({"rank": ctx.rank, "by_op": ctx.comm.by_op(),
                                         "full": full_stats, "missing": miss_stats})
        if gathered is not None:
            result.strategy_metrics = _metrics(o, setup, gathered, missing, missing_eval,
                                               job.dataset.x_test.shape[0])
        return result


class _Infer(nn.Module):
    def __init__(self, tier: Tier) -> None:
        super().__init__()
        self.tier, self.layers = tier, tier.module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tier.infer(x)


def _step(tier: Tier, optimizer: torch.optim.Optimizer) -> StepFn:
    def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
        optimizer.zero_grad(set_to_none=True)
        partial = tier.train_step(x, y, i)
        with tier.ctx.recorder.span("optimizer", step=i):
            optimizer.step()
        total = torch.tensor([partial])
        tier.ctx.comm.all_reduce(total, op="loss")  # the weighted sum of the three exits' losses
        return float(total)

    return step


def _tier_of(rank: int) -> str:
    return "cloud" if rank == 0 else "edge" if rank == 1 else "devices"


def _tier_bytes(gathered: list[dict[str, Any]], ops: tuple[str, ...]) -> dict[str, int]:
    out = {"devices": 0, "edge": 0, "cloud": 0}
    for rec in gathered:
        out[_tier_of(rec["rank"])] += sum(v for k, v in rec["by_op"].items() if k in ops)
    return out


def _metrics(o: DdnnOptions, setup: TierSetup, gathered: list[dict[str, Any]], missing: list[int],
             missing_eval: dict[str, float], test_size: int) -> dict[str, Any]:
    edge = next(r for r in gathered if r["rank"] == 1)
    infer = _tier_bytes(gathered, ("eval_scores", "eval_mask", "eval_features", "eval_count",
                                   "eval_logits"))
    return {
        "devices": setup.devices,
        "threshold": o.threshold,
        "loss_weights": list(o.loss_weights()),
        "exit_fractions": edge["full"]["fractions"],
        "exit_accuracy": edge["full"]["accuracy"],
        "train_bytes_by_tier": _tier_bytes(gathered, ("features", "scores", "grad_features",
                                                      "grad_scores")),
        "inference_bytes_by_tier": infer,
        "inference_bytes_per_sample_by_tier": {k: v / max(1, 2 * test_size) for k, v in infer.items()},
        "missing_devices": missing,
        "missing_accuracy": missing_eval["accuracy"],
        "missing_exit_fractions": edge["missing"]["fractions"],
        "note": "inference bytes cover both evaluations (all devices, then with the missing ones)",
    }
