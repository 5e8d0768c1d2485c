"""Per-layer profile of a model on this machine: what PipeDream's planner needs (seed 003 §3.2).

For each child layer of an ``nn.Sequential``: forward time, backward time (input and weight
gradients), the bytes of its output (the activation a stage boundary after it would send) and
of its parameters. Times are the fastest of ``repeats`` runs after ``warmup`` runs, on one batch
of the size the pipeline will process (a micro-batch for gpipe/1f1b, a mini-batch for pipedream).

Profiling leaves the model as it found it: each layer is profiled on a deep copy (batch-norm
statistics and gradients untouched) inside ``torch.random.fork_rng`` (dropout draws do not shift
the training run's random stream).

`boundary_metas` is the cheap sibling every rank runs: one no-grad forward in eval mode that
gives the shape and dtype of every layer's output, so each stage knows the size of what it will
receive without exchanging shapes.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from polytrain.errors import ConfigError
from polytrain.models.partition import LayerCost, layers_of


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of one tensor crossing a stage boundary."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorMeta:
        return cls(tuple(t.shape), t.dtype)


@dataclass(frozen=True)
class LayerProfile:
    """One layer measured on one batch: seconds, output and parameter bytes."""

    index: int
    name: str
    forward_s: float
    backward_s: float
    activation_bytes: int
    param_bytes: int
    output: TensorMeta

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s

    def cost(self) -> LayerCost:
        return LayerCost(self.name, self.compute_s, self.activation_bytes, self.param_bytes)


def _one_tensor(name: str, index: int, out: object) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise ConfigError(
            f"Layer {index} ('{name}') returns a {type(out).__name__}, not one tensor. Rule: a "
            "pipeline cuts between layers and sends one tensor across, so each layer must map one "
            "tensor to one tensor. Fix: wrap the layers that pass tuples into one module."
        )
    return out


@torch.no_grad()
def boundary_metas(model: nn.Module, sample: torch.Tensor) -> list[TensorMeta]:
    """Output shape and dtype of every layer for the batch ``sample`` (one dry forward).

    Eval mode and no grad: no batch-norm statistics move, no dropout draws, nothing is stored.
    """
    was = model.training
    model.eval()
    try:
        out, metas = sample, []
        for i, (name, layer) in enumerate(layers_of(model)):
            out = _one_tensor(name, i, layer(out))
            metas.append(TensorMeta.of(out))
        return metas
    finally:
        model.train(was)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_s(fn: Callable[[], None], device: torch.device, repeats: int) -> float:
    """The fastest of ``repeats`` runs: on a machine shared with other work the minimum is the
    stable figure (other processes only ever add time); the planner scales it by contention."""
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def _profile_layer(
    index: int, name: str, layer: nn.Module, inp: torch.Tensor, repeats: int, warmup: int
) -> tuple[LayerProfile, torch.Tensor]:
    layer = copy.deepcopy(layer)  # why: forward/backward here must not touch the real layer
    x = inp.detach().requires_grad_(inp.is_floating_point())
    out = _one_tensor(name, index, layer(x))
    grad = torch.randn_like(out) if out.is_floating_point() and out.requires_grad else None

    def forward() -> None:
        layer(x)

    def forward_backward() -> None:
        y = layer(x)
        if grad is not None:
            y.backward(grad)

    _median_s(forward_backward, inp.device, warmup)
    fwd = _median_s(forward, inp.device, repeats)
    both = _median_s(forward_backward, inp.device, repeats)
    params = sum(p.numel() * p.element_size() for p in layer.parameters())
    meta = TensorMeta.of(out)
    prof = LayerProfile(index, name, fwd, max(0.0, both - fwd), meta.nbytes, params, meta)
    return prof, out.detach()


def profile_layers(
    model: nn.Module, sample: torch.Tensor, repeats: int = 3, warmup: int = 1
) -> list[LayerProfile]:
    """Measure every layer of ``model`` on the batch ``sample`` (see the module docstring)."""
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"profile repeats={repeats}, warmup={warmup}: need repeats >= 1, warmup >= 0.")
    out = sample
    profiles = []
    with torch.random.fork_rng(devices=[sample.device] if sample.device.type == "cuda" else []):
        for i, (name, layer) in enumerate(layers_of(model)):
            prof, out = _profile_layer(i, name, layer, out, repeats, warmup)
            profiles.append(prof)
    return profiles


def format_profile(profiles: list[LayerProfile]) -> str:
    """A table: layer, forward/backward ms, activation and parameter KiB."""
    lines = [f"{'layer':<16} {'fwd ms':>8} {'bwd ms':>8} {'act KiB':>9} {'param KiB':>10}  output"]
    for p in profiles:
        lines.append(
            f"{p.index:>2} {p.name:<13} {p.forward_s * 1e3:>8.3f} {p.backward_s * 1e3:>8.3f} "
            f"{p.activation_bytes / 1024:>9.1f} {p.param_bytes / 1024:>10.1f}  {list(p.output.shape)}"
        )
    return "\n".join(lines) + "\n"


# --- the model profile the planner reads (`polytrain profile`) ---------------------------------------

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
    # a meta-device profile (`plan.meta`): matrix FLOPs and the bytes the other operators move
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


def _layers_or_whole(model: nn.Module) -> nn.Sequential:
    return model if isinstance(model, nn.Sequential) else nn.Sequential(OrderedDict(model=model))


def _fc_start(model: nn.Sequential) -> int | None:
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
    return _median_s(opt.step, next(model.parameters()).device, repeats)


def measure_profile(cfg: Any, repeats: int = 5, threads: int = 1) -> Profile:
    """Profile ``cfg``'s model (a JobConfig) at ``cfg.batch_size`` and at 1/8 of it, in this process."""
    from polytrain.runtime.job import Job

    torch.set_num_threads(threads)
    _reset_peak_rss()
    base = _rss_bytes()
    job = Job.from_config(cfg)
    model = _layers_or_whole(job.build_model())
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
        _fc_start(model),
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
