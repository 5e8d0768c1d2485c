"""Per-layer profile of a model on this machine: what PipeDream's planner needs (seed 003 §3.2).

For each child layer of an ``nn.Sequential``: forward time, backward time (input and weight
gradients), the bytes of its output (the activation a stage boundary after it would send) and
of its parameters. Times are the fastest of ``repeats`` runs after ``warmup`` runs, on one batch
of the size the pipeline will process (a micro-batch for gpipe/1f1b, a mini-batch for pipedream).

Profiling leaves the model as it found it: each layer is profiled on a deep copy (batch-norm
statistics and gradients untouched) inside ``torch.random.fork_rng`` (dropout draws do not shift
the training run's random stream).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from polytrain.errors import ConfigError
from polytrain.models.boundaries import TensorMeta, one_tensor
from polytrain.models.partition import LayerCost, layers_of


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fastest_s(fn: Callable[[], None], device: torch.device, repeats: int) -> float:
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
    out = one_tensor(name, index, layer(x))
    grad = torch.randn_like(out) if out.is_floating_point() and out.requires_grad else None

    def forward() -> None:
        layer(x)

    def forward_backward() -> None:
        y = layer(x)
        if grad is not None:
            y.backward(grad)

    fastest_s(forward_backward, inp.device, warmup)
    fwd = fastest_s(forward, inp.device, repeats)
    both = fastest_s(forward_backward, inp.device, repeats)
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
