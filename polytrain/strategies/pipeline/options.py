"""Options shared by the pipeline strategies and the checks made before any process starts."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from polytrain.config import JobConfig
from polytrain.data import dataset_spec
from polytrain.errors import ConfigError
from polytrain.models import resolve_model
from polytrain.models.partition import Partition, check_cuttable
from polytrain.strategies.pipeline.ties import refuse_ties

PARTITION_MODES = ("auto", "uniform", "params", "time")
REPLICA_SCHEDULES = ("gpipe", "1f1b", "zb-h1")  # the flush schedules
PARTITION_HELP = (
    "auto (PipeDream's planner on a measured profile), uniform (equal layer counts), params "
    "(balance parameter bytes), time (balance measured forward+backward time), or layer counts "
    "per stage such as 3,5,5,6, each optionally xR for R data-parallel replicas (3x2,5)"
)


class PipelineOptions(BaseModel):
    """``partition``: how layers are split over stages; ``link_gbps``: the link the planner assumes."""

    model_config = ConfigDict(extra="forbid")
    partition: str = "auto"
    replicate: bool = Field(
        False, description="let partition=auto replicate stages (data-parallel within a stage; gpipe/1f1b)"
    )
    link_gbps: float = Field(10.0, gt=0, description="link bandwidth (Gbit/s) assumed by partition=auto")
    heap: Literal["keep", "system"] = Field(
        "keep", description="keep: freed memory stays in the heap (no page faults per step; glibc); "
        "system: the C library's defaults"
    )

    @field_validator("partition", mode="before")
    @classmethod
    def _partition(cls, v: Any) -> str:
        if isinstance(v, (list, tuple)) or (isinstance(v, int) and not isinstance(v, bool)):
            v = ",".join(str(x) for x in (v if isinstance(v, (list, tuple)) else [v]))
        if not isinstance(v, str):
            raise ValueError(f"partition must be {PARTITION_HELP}")
        text = v.strip().lower()
        if text not in PARTITION_MODES:
            try:
                Partition.parse(text)
            except ConfigError as err:
                raise ValueError(str(err)) from None
        return text


class FlushOptions(PipelineOptions):
    """gpipe / 1f1b: M micro-batches per mini-batch, optional re-materialisation."""

    microbatches: int = Field(4, ge=1, description="micro-batches M per mini-batch (B % M == 0)")
    checkpoint: Literal["never", "except_last", "always"] = "never"


class AsyncOptions(PipelineOptions):
    """pipedream: ``vertical_sync``; ``trace_versions`` records the weight version of every action."""

    vertical_sync: bool = False
    trace_versions: bool = False


def meta_model(cfg: JobConfig) -> nn.Module | None:
    """The model built on the meta device (no memory), or None when a factory cannot do that."""
    spec = dataset_spec(cfg.dataset, cfg.data_options)
    try:
        with torch.device("meta"):
            return resolve_model(cfg.model, spec, cfg.model_options)
    except ConfigError:
        raise
    except Exception:  # e.g. a factory that loads weights: the ranks check the real model
        return None


def check_pipeline(opts: PipelineOptions, cfg: JobConfig, world: int, name: str) -> None:
    """Refuse, before any process starts, a pipeline job that cannot run (ConfigError)."""
    if opts.replicate and name not in REPLICA_SCHEDULES:
        raise ConfigError(
            f"--set replicate=true with '{name}'. Rule: replicated stages synchronise their "
            f"gradients at the flush, so only {' and '.join(REPLICA_SCHEDULES)} run them. Fix: drop "
            "replicate, or use --strategy 1f1b (or gpipe)."
        )
    model = meta_model(cfg)
    part = Partition.parse(opts.partition) if opts.partition not in PARTITION_MODES else None
    stages = world if part is None else part.stages
    layers = None if model is None else check_cuttable(model, stages)
    if name not in REPLICA_SCHEDULES:
        refuse_ties(model, cfg, name, "it updates each stage after every backward, on versions the "
                    "other stage never sees")
    if part is not None:
        if layers is not None:
            part.check(layers, world)
        check_replicas(part, name)


def check_replicas(part: Partition, name: str) -> None:
    """Replicated stages (data-parallel within a stage) run with the flush schedules only."""
    if name in REPLICA_SCHEDULES or all(r == 1 for r in part.replicas):
        return
    raise ConfigError(
        f"Partition {part} replicates stage(s) {[s for s, r in enumerate(part.replicas) if r > 1]} "
        f"under '{name}'. Rule: replicated stages synchronise their gradients at the flush, so "
        f"only {' and '.join(REPLICA_SCHEDULES)} run them; the asynchronous schedules update after "
        "every backward and run one rank per stage. Fix: --strategy 1f1b (or gpipe) with this "
        f"partition, or drop the xR suffixes: --set partition={','.join(map(str, part.counts))} "
        f"with --procs {part.stages}."
    )


def check_microbatches(name: str, cfg: JobConfig, microbatches: int) -> None:
    """B % M must be 0: every micro-batch has B/M samples, so their mean losses average exactly."""
    b, m = cfg.batch_size, microbatches
    if b % m:
        divisors = [d for d in range(1, b + 1) if b % d == 0 and d <= 4 * m]
        lower = max(m, b - b % m)
        raise ConfigError(
            f"Strategy '{name}' splits the global batch of {b} samples into {m} micro-batches. Rule: "
            f"--batch-size must be a multiple of microbatches. Fix: --batch-size {lower} or "
            f"{lower + m}, or --set microbatches=<a divisor of {b}: {', '.join(map(str, divisors))}>."
        )
