"""The model profile the planner reads (`polytrain profile`): per layer its times, activation
and parameter bytes at the profiled batch, plus the optimizer step, the process's memory and the
measured α–β of the links (`Profile`, saved as JSON); `measure_profile` measures one on this
machine, `median_of` combines repeated measurements.

The per-layer timing itself is `cost.layer_profile` (what PipeDream's planner reads).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from polytrain.cost.layer_profile import fastest_s, profile_layers
from polytrain.errors import ConfigError
from polytrain.models.partition import layers_of

OPTIMIZER_STATE = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}  # state tensors per parameter


@dataclass(frozen=True)
class LayerRecord:
    """One layer at the profile's batch size: seconds, bytes, and the fixed part of its times.

    Time at batch b: ``fixed + (full − fixed)·b/B`` (two measured batch sizes fit the line), so
    small per-rank batches keep their per-call overhead instead of shrinking to nothing.
    """

    name: str
    kind: str  # the layer's class name (Block, Sequential, Linear, ...)
    forward_s: float
    backward_s: float
    forward_fixed_s: float
    backward_fixed_s: float
    activation_bytes: int  # output at batch B
    param_bytes: int
    optimizer_bytes: int
    # a meta-device profile (`cost.meta_profile`): matrix FLOPs and the bytes the other operators move
    # (fp32 elements), forward and backward, at batch B; the cost model prices them on the
    # cluster's device (0: a measured profile, priced from its times)
    forward_flops: float = 0.0
    backward_flops: float = 0.0
    forward_bytes: float = 0.0
    backward_bytes: float = 0.0

    @property
    def counted(self) -> bool:
        """Whether the layer's work was counted on the meta device rather than timed."""
        return self.forward_flops > 0 or self.forward_bytes > 0

    def times(self, batch: float, full: int) -> tuple[float, float]:
        """(forward, backward) seconds at ``batch`` samples (the profile was taken at ``full``)."""
        f = self.forward_fixed_s + (self.forward_s - self.forward_fixed_s) * batch / full
        b = self.backward_fixed_s + (self.backward_s - self.backward_fixed_s) * batch / full
        return f, b


@dataclass(frozen=True)
class Profile:
    """What the planner knows of one model on one device; a JSON file, reusable offline."""

    model: str
    dataset: str
    batch_size: int
    optimizer: str
    layers: tuple[LayerRecord, ...]
    params: tuple[tuple[str, tuple[int, ...]], ...]  # (name, shape): the PS shard plans' input
    input_bytes: int  # one batch of inputs
    optimizer_s: float  # one optimizer step over the whole model
    base_memory_bytes: int  # resident bytes of a process before it builds the model
    fc_start: int | None  # first of the trailing fully connected layers (owt), None: none
    model_options: dict[str, Any] = field(default_factory=dict)
    data_options: dict[str, Any] = field(default_factory=dict)
    comm: dict[str, dict[str, float]] = field(default_factory=dict)  # p2p / allreduce: alpha_s, bytes_per_s
    device: str = "cpu"
    threads: int = 1
    task: str = "classify"  # the dataset's task (classify | lm)
    # resident bytes a training process holds beyond the fresh process and the modelled tensors
    # (its dataset, the allocator/autograd working set of forward and backward): the peak RSS
    # growth while profiling minus parameters, gradients, activations and one input batch
    runtime_memory_bytes: int = 0

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    @property
    def forward_backward_s(self) -> float:
        """Forward + backward seconds over all layers at the profile's batch: how fast it ran."""
        return sum(layer.forward_s + layer.backward_s for layer in self.layers)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["params"] = [[n, list(s)] for n, s in self.params]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        data = dict(data)
        data["layers"] = tuple(LayerRecord(**r) for r in data["layers"])
        data["params"] = tuple((n, tuple(s)) for n, s in data["params"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: Path) -> Profile:
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"Cannot read profile '{path}' ({e}). Fix: write one with "
                "polytrain profile --model M --dataset D --batch-size B --out FILE."
            ) from None


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _reset_peak_rss() -> None:
    """Reset this process's VmHWM (Linux: write 5 to clear_refs); ignored where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, ValueError, StopIteration):
        return _rss_bytes()


def layers_or_whole(model: nn.Module) -> nn.Sequential:
    return model if isinstance(model, nn.Sequential) else nn.Sequential(OrderedDict(model=model))


def fc_start(model: nn.Sequential) -> int | None:
    """Where the trailing fully connected children begin (what owt cuts), None: no such run or
    nothing before it."""
    from polytrain.models.layers import trailing_fc_start

    start = trailing_fc_start(model)
    return start if 0 < start < len(model) else None


def _optimizer_s(model: nn.Module, make: Callable[[Any], torch.optim.Optimizer], repeats: int) -> float:
    model = copy.deepcopy(model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt = make(model.parameters())
    opt.step()  # creates the state
    return fastest_s(opt.step, next(model.parameters()).device, repeats)


def measure_profile(cfg: Any, repeats: int = 5, threads: int = 1) -> Profile:
    """Profile ``cfg``'s model (a JobConfig) at ``cfg.batch_size`` and at 1/8 of it, in this process."""
    from polytrain.runtime.job import Job

    torch.set_num_threads(threads)
    _reset_peak_rss()
    base = _rss_bytes()
    job = Job.from_config(cfg)
    model = layers_or_whole(job.build_model())
    x = job.dataset.x_train
    big = x[: cfg.batch_size]
    if big.shape[0] < cfg.batch_size:  # a batch larger than the data: repeat rows
        big = x[torch.arange(cfg.batch_size) % x.shape[0]]
    small = big[: max(1, cfg.batch_size // 8)]
    full = profile_layers(model, big, repeats)
    part = profile_layers(model, small, repeats)
    grown = _peak_rss_bytes() - base
    state = OPTIMIZER_STATE.get(cfg.optimizer, 2)
    scale = cfg.batch_size / small.shape[0]
    records = []
    for (name, layer), f, s in zip(layers_of(model), full, part, strict=True):
        records.append(
            LayerRecord(
                name,
                type(layer).__name__,
                f.forward_s,
                f.backward_s,
                _fixed(f.forward_s, s.forward_s, scale),
                _fixed(f.backward_s, s.backward_s, scale),
                f.activation_bytes,
                f.param_bytes,
                state * f.param_bytes,
            )
        )
    return Profile(
        cfg.model,
        cfg.dataset,
        cfg.batch_size,
        cfg.optimizer,
        tuple(records),
        tuple((n, tuple(p.shape)) for n, p in model.named_parameters()),
        int(big.numel() * big.element_size()),
        _optimizer_s(model, job.make_optimizer, repeats),
        base,
        fc_start(model),
        dict(cfg.model_options),
        dict(cfg.data_options),
        device=str(big.device),
        threads=threads,
        task=job.spec.task,
        runtime_memory_bytes=max(
            0,
            grown
            - sum(2 * f.param_bytes + f.activation_bytes for f in full)
            - int(big.numel() * big.element_size()),
        ),
    )


def _fixed(full_s: float, small_s: float, ratio: float) -> float:
    """Intercept of the line through (B, full_s) and (B/ratio, small_s), kept within [0, full_s]."""
    if ratio <= 1:
        return 0.0
    slope_times_b = (full_s - small_s) * ratio / (ratio - 1)  # slope · B
    return min(full_s, max(0.0, full_s - slope_times_b))


def median_of(profiles: list[Profile]) -> Profile:
    """One profile from several of the same model taken at different times: each layer's four times,
    the optimizer step and each α–β figure are the median over them (the rest is the first's).

    On a machine whose speed moves (a shared VM, a busy host) one profile is a snapshot; the median
    of snapshots spread over the time a job runs prices that job better than any one of them.
    """
    if not profiles:
        raise ConfigError("median_of needs at least one profile. Fix: pass the profiles to combine.")
    first = profiles[0]
    names = [r.name for r in first.layers]
    for p in profiles[1:]:
        if (p.model, p.batch_size, [r.name for r in p.layers]) != (first.model, first.batch_size, names):
            raise ConfigError(
                f"Cannot combine a profile of '{p.model}' at batch {p.batch_size} with one of "
                f"'{first.model}' at batch {first.batch_size}: the median needs the same model, batch "
                "and layers. Fix: combine profiles of one model and batch size only."
            )

    def med(values: list[float]) -> float:
        return float(statistics.median(values))

    def layer(i: int) -> LayerRecord:
        recs = [p.layers[i] for p in profiles]
        return replace(
            first.layers[i],
            forward_s=med([r.forward_s for r in recs]),
            backward_s=med([r.backward_s for r in recs]),
            forward_fixed_s=med([r.forward_fixed_s for r in recs]),
            backward_fixed_s=med([r.backward_fixed_s for r in recs]),
        )

    layers = tuple(layer(i) for i in range(len(first.layers)))
    comm = {
        kind: {k: med([p.comm[kind][k] for p in profiles if k in p.comm.get(kind, {})]) for k in fields}
        for kind, fields in first.comm.items()
        if all(isinstance(v, int | float) for v in fields.values())
    }
    return replace(first, layers=layers, optimizer_s=med([p.optimizer_s for p in profiles]),
                   comm={**first.comm, **comm})
