"""From ``--set partition=...`` to the Partition every rank of a pipeline job uses.

``uniform``, ``params`` and explicit counts are computed on every rank (deterministic). ``time`` and
``auto`` need a profile measured on this machine: rank 0 measures it (`cost.profile`), plans, and
broadcasts the plan, because timings differ from rank to rank and all stages must agree.
``auto`` runs PipeDream's planner: one replica per stage, or (``replicate=true``, gpipe/1f1b) any
number of data-parallel replicas per stage, as the planner finds fastest for the link.
A measured partition is stored with every checkpoint; a resumed or restarted run reuses it
instead of measuring again (a new profile could cut elsewhere, and the checkpoint's per-stage
state would not fit).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from polytrain.cost.layer_profile import profile_layers
from polytrain.models.partition import (
    Partition,
    balanced,
    check_cuttable,
    layers_of,
    pipedream_plan,
    uniform,
)
from polytrain.runtime.job import RankContext
from polytrain.strategies.pipeline.options import PARTITION_MODES, PipelineOptions, check_replicas

PLAN_NAME = "pipeline.partition"  # in each checkpoint's meta.json (see CheckpointStore.plans)


def _param_bytes(layer: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in layer.parameters())


def _measured_plan(
    opts: PipelineOptions, model: nn.Module, ranks: int, sample: torch.Tensor
) -> dict[str, Any]:
    """Profile on this rank and plan (``time`` or ``auto``); JSON for the broadcast."""
    profiles = profile_layers(model, sample)
    bandwidth = opts.link_gbps * 1e9 / 8
    if opts.partition == "time":
        part = balanced([p.compute_s for p in profiles], ranks)
        predicted = None
    else:
        plan = pipedream_plan([p.cost() for p in profiles], ranks, bandwidth, replicate=opts.replicate)
        part, predicted = plan.partition, plan.period_s
    return {
        "counts": list(part.counts),
        "replicas": list(part.replicas),
        "profile_ms": [round(p.compute_s * 1e3, 4) for p in profiles],
        "predicted_period_ms": None if predicted is None else round(predicted * 1e3, 4),
    }


def resolve_partition(
    opts: PipelineOptions, model: nn.Module, ctx: RankContext, sample: torch.Tensor, strategy: str
) -> tuple[Partition, dict[str, Any]]:
    """(partition, what to report about how it was chosen) — identical on every rank."""
    ranks, mode = ctx.world, opts.partition
    explicit = None if mode in PARTITION_MODES else Partition.parse(mode)
    layers = check_cuttable(model, ranks if explicit is None else explicit.stages)
    info: dict[str, Any] = {}
    if mode == "uniform" or ranks == 1:  # one stage: nothing to plan, nothing to measure
        part = uniform(layers, ranks)
    elif mode == "params":
        part = balanced([_param_bytes(layer) for _, layer in layers_of(model)], ranks)
    elif mode in ("time", "auto"):
        decided = None
        if ctx.is_leader:  # a resumed run keeps its partition (the checkpoint's layout needs it)
            decided = ctx.checkpoints.stored_plan(PLAN_NAME) if ctx.resume else None
            if decided is not None:
                decided["from_checkpoint"] = True
            else:
                decided = _measured_plan(opts, model, ranks, sample)
        decided = ctx.comm.broadcast_json(decided, src=0)
        ctx.checkpoints.plans[PLAN_NAME] = {k: v for k, v in decided.items() if k != "from_checkpoint"}
        part = Partition(tuple(decided.pop("counts")), tuple(decided.pop("replicas")))
        info = {k: v for k, v in decided.items() if v is not None}
    else:
        assert explicit is not None
        part = explicit
    part.check(layers, ranks)
    check_replicas(part, strategy)
    return part, info
