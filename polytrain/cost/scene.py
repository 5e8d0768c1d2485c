"""What the cost model prices: a `Scene` (a profile on a cluster, at a batch, with the job's
training flags) and what it returns, an `Estimate` (step time, peak memory per rank, bytes per
step and one predicted step's `Span` s).

A `Scene` prices compute: each layer's forward and backward at the batch a rank processes, times
the compute scale and the shared-core contention of the cluster (a meta-device profile's layers
on the cluster's device, `cost.meta_profile`), and memory from its parts (`cost.memory`): the
process's base, parameters, gradients, optimizer state, and the activations a rank keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polytrain.cost.cluster import Cluster
from polytrain.cost.memory import element_bytes, state_bytes, transformer_activation_bytes
from polytrain.cost.meta_profile import DEFAULT_EFFICIENCY, layer_seconds
from polytrain.cost.profile import OPTIMIZER_STATE, LayerRecord, Profile


@dataclass(frozen=True)
class Span:
    """One box of a predicted timeline: rank, lane (compute/comm), kind, [start, end), label."""

    rank: int
    lane: str
    kind: str
    start: float
    end: float
    label: str = ""


@dataclass(frozen=True)
class Estimate:
    step_s: float
    peak_memory_bytes: int
    bytes_per_step: float  # sent by all ranks together in one step
    nic_bytes_per_step: float  # the busiest host NIC, one direction (0 on one host)
    spans: tuple[Span, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scene:
    profile: Profile
    cluster: Cluster
    batch: int
    compute_scale: float = 1.0
    action_overhead_s: float = 0.0  # the pipeline executor's own time per forward or backward action
    pass_overhead_s: float = 0.0  # the other runtimes' own time per forward or backward pass
    # the forward's own scale where it differs from the backward's (a training step's forward runs
    # slower against its profile than its backward does); None: ``compute_scale``
    forward_scale: float | None = None
    # a parameter server's own time per worker request (receiving it, handing it to the serving
    # thread, answering it) beyond its messages and its update; a server takes its workers' one at a time
    ps_request_s: float = 0.0
    # the job's training flags: autocast precision (bf16/fp16: 16-bit activations, mixed-precision
    # model state, `cost.memory`), full activation recomputation, micro-steps per optimizer step
    precision: str = "fp32"
    recompute: bool = False
    grad_accum: int = 1
    # the share of the device's peak FLOP/s matrix work reaches (meta-device profiles only)
    efficiency: float = DEFAULT_EFFICIENCY

    @property
    def layers(self) -> int:
        return len(self.profile.layers)

    def _times(self, layer: LayerRecord, batch: float) -> tuple[float, float]:
        """A layer's (forward, backward) seconds at ``batch``: a counted (meta) layer priced on the
        cluster's device at the job's precision, a measured one from its times."""
        device = self.cluster.accelerator
        if not (layer.counted and device):
            return layer.times(batch, self.profile.batch_size)
        k = batch / self.profile.batch_size
        f = layer_seconds(device, self.precision, layer.forward_flops * k, layer.forward_bytes * k,
                          self.efficiency)
        b = layer_seconds(device, self.precision, layer.backward_flops * k, layer.backward_bytes * k,
                          self.efficiency)
        return f, b

    @property
    def transformer(self) -> tuple[int, int, int] | None:
        """(sequence, hidden, heads) of a profiled transformer, from its model options."""
        o = self.profile.model_options
        if not all(o.get(k) for k in ("seq_len", "d_model", "n_head")):
            return None
        return int(o["seq_len"]), int(o["d_model"]), int(o["n_head"])

    def fb(self, lo: int, hi: int, batch: float, busy: int = 1, split: int = 1) -> tuple[float, float]:
        """(forward, backward) seconds of layers [lo, hi) at ``batch`` samples, ``busy`` ranks
        computing at once, each layer's work divided ``split`` ways (tensor / column split)."""
        slow = self.cluster.contention(busy)
        kf = (self.compute_scale if self.forward_scale is None else self.forward_scale) * slow
        kb = self.compute_scale * slow
        f = b = 0.0
        for layer in self.profile.layers[lo:hi]:
            lf, lb = self._times(layer, batch)
            # a split layer's share of the work shrinks; its per-call fixed time does not
            lf = layer.forward_fixed_s + (lf - layer.forward_fixed_s) / split
            lb = layer.backward_fixed_s + (lb - layer.backward_fixed_s) / split
            if self.recompute:  # activation checkpointing: the forward again in backward
                lb += lf
            f, b = f + lf * kf, b + lb * kb
        return f, b

    def pass_fb(self, lo: int, hi: int, batch: float, busy: int = 1, split: int = 1) -> tuple[float, float]:
        """`fb` of one forward and one backward pass, each with the runtime's per-pass overhead."""
        f, b = self.fb(lo, hi, batch, busy, split)
        extra = self.pass_overhead_s * self.cluster.contention(busy)
        return f + extra, b + extra

    def action_fb(self, lo: int, hi: int, batch: float, neighbours: int = 1) -> tuple[float, float]:
        """`fb` of one pipeline forward and backward action, on a core of its own (the pipeline
        simulation shares the cores), plus the executor's own time per action for each neighbouring
        stage the action exchanges a message with (``action_overhead_s`` is measured on a
        two-stage pipeline, where every action has one; a middle stage's have two)."""
        f, b = self.fb(lo, hi, batch)
        extra = self.action_overhead_s * max(1, neighbours)
        return f + extra, b + extra

    def layer_fb(self, i: int, batch: float, busy: int = 1, split: int = 1) -> tuple[float, float]:
        return self.fb(i, i + 1, batch, busy, split)

    def activations(self, lo: int, hi: int, batch: float, split: int = 1) -> float:
        """Bytes layers [lo, hi) keep for backward at ``batch`` samples (one micro-step of
        ``grad_accum``): a measured profile's layer outputs; a counted transformer's blocks as
        Korthikanti et al. (`cost.memory`), split ``split`` ways by tensor parallelism."""
        batch = batch / self.grad_accum
        layers = self.profile.layers[lo:hi]
        shape = self.transformer
        if not (shape and any(r.counted for r in layers)):
            return sum(layer.activation_bytes for layer in layers) * batch / self.profile.batch_size
        s, h, a = shape
        elem = element_bytes(self.precision)
        out = 0.0
        for r in layers:
            if r.kind == "Block":
                out += transformer_activation_bytes(s, batch, h, a, split, self.recompute, elem)
            else:  # embedding / head output, its columns split
                out += r.activation_bytes * elem / 4 * batch / self.profile.batch_size / split
        return out

    @property
    def state(self) -> tuple[float, float, float]:
        """(parameter, gradient, optimizer) bytes per fp32 byte the profile counts of parameters."""
        sb = state_bytes(self.precision, OPTIMIZER_STATE.get(self.profile.optimizer, 2))
        return sb.param / 4, sb.grad / 4, sb.optimizer / 4

    def state_bytes(self, lo: int, hi: int, split: int = 1) -> float:
        """Parameters + gradients + optimizer state of layers [lo, hi), 1/``split`` of each."""
        layers = self.profile.layers[lo:hi]
        if self.precision == "fp32":  # the profile's own optimizer bytes
            return sum(2 * layer.param_bytes + layer.optimizer_bytes for layer in layers) / split
        return sum(layer.param_bytes for layer in layers) * sum(self.state) / split

    def optimizer_s(self, param_bytes: float) -> float:
        device = self.cluster.accelerator
        if device and any(r.counted for r in self.profile.layers):  # memory-bound: state read and written
            return 2 * param_bytes * sum(self.state) / device.memory_bytes_per_s
        total = max(1, self.profile.param_bytes)
        return self.profile.optimizer_s * param_bytes / total * self.compute_scale

    def memory(self, *parts: float) -> int:
        return int(self.profile.base_memory_bytes + self.profile.runtime_memory_bytes + sum(parts))


def phases(rank: int, t0: float, items: list[tuple[str, str, float, str]]) -> tuple[list[Span], float]:
    """Consecutive spans from ``t0``: (lane, kind, seconds, label) each."""
    out, t = [], t0
    for lane, kind, dur, label in items:
        if dur > 0:
            out.append(Span(rank, lane, kind, t, t + dur, label))
        t += dur
    return out, t



def counted(profile: Profile) -> bool:
    """Whether ``profile`` was counted on the meta device (`cost.meta_profile`): a model planned at scale."""
    return any(r.counted for r in profile.layers)
