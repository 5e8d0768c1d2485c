"""Per-strategy estimates: step time, peak memory per rank, bytes per step, one predicted step's spans.

Every estimator reads a `Scene` (profile, cluster, global batch, compute scale) and returns an
`Estimate`. Compute comes from the profile (per layer, at the batch the rank processes, times the
compute scale and the shared-core contention of the cluster); communication from `plan.cost`;
pipelines from `plan.simulate` (`estimate_pipe`). Memory per rank: the process's base, parameters,
gradients, optimizer state, and the activations it keeps (each layer's output, at its batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polytrain.cost.cluster import Cluster
from polytrain.cost.codecs import CodecPrice
from polytrain.cost.memory import element_bytes, state_bytes, transformer_activation_bytes
from polytrain.cost.meta_profile import DEFAULT_EFFICIENCY, layer_seconds
from polytrain.cost.network import (
    allreduce_s,
    buckets_of,
    ddp_overlap,
    direct_exchange_s,
    group_allgather_s,
    ps_traffic,
    refilled,
    tp_block_s,
)
from polytrain.cost.profile import OPTIMIZER_STATE, LayerRecord, Profile
from polytrain.runtime.sharding import ParamInfo, make_plan

BYTES = 4  # float32 parameters, gradients and activations


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
    # model state, `plan.memory`), full activation recomputation, micro-steps per optimizer step
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
        Korthikanti et al. (`plan.memory`), split ``split`` ways by tensor parallelism."""
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


def _phases(rank: int, t0: float, items: list[tuple[str, str, float, str]]) -> tuple[list[Span], float]:
    """Consecutive spans from ``t0``: (lane, kind, seconds, label) each."""
    out, t = [], t0
    for lane, kind, dur, label in items:
        if dur > 0:
            out.append(Span(rank, lane, kind, t, t + dur, label))
        t += dur
    return out, t


# --- data parallelism ------------------------------------------------------------------------------


def single(scene: Scene) -> Estimate:
    n = scene.layers
    f, b = scene.pass_fb(0, n, scene.batch)
    opt = scene.optimizer_s(scene.profile.param_bytes)
    spans, end = _phases(
        0,
        0.0,
        [("compute", "forward", f, "F"), ("compute", "backward", b, "B"), ("compute", "optimizer", opt, "")],
    )
    mem = scene.memory(scene.state_bytes(0, n), scene.activations(0, n, scene.batch))
    return Estimate(end, mem, 0.0, 0.0, tuple(spans))


def ring_nic_bytes(nbytes: float, world: int, cluster: Cluster) -> float:
    """Bytes a host NIC sends for one all-reduce of ``nbytes`` over all ranks (one ring edge)."""
    return 0.0 if cluster.hosts <= 1 else 2 * (world - 1) / world * nbytes


def allreduce(scene: Scene, world: int, bucket_mb: float = 25.0, codec: CodecPrice | None = None) -> Estimate:
    """DDP: backward overlapped with bucketed all-reduces (`cost.ddp_overlap`); with a codec, the
    hook's encode, exchange and decode after backward (the runtime's hook blocks)."""
    if codec is not None:
        return _compressed_allreduce(scene, world, codec)
    n, cl = scene.layers, scene.cluster
    per_rank = scene.batch / world
    f, extra = scene.pass_fb(0, 0, per_rank, busy=world)
    f += scene.fb(0, n, per_rank, busy=world)[0]
    backward = [
        (
            scene.layer_fb(i, per_rank, busy=world)[1] + (extra if i == n - 1 else 0.0),
            scene.profile.layers[i].param_bytes,
        )
        for i in reversed(range(n))
    ]
    ranks = range(world)
    done, buckets = ddp_overlap(f, backward, lambda s: allreduce_s(s, ranks, cl), int(bucket_mb * 2**20))
    opt = scene.optimizer_s(scene.profile.param_bytes)
    spans, _ = _phases(
        0, 0.0, [("compute", "forward", f, "F"), ("compute", "backward", sum(b for b, _ in backward), "B")]
    )
    spans += [Span(0, "comm", "comm", k.start_s, k.end_s, f"bucket {i}") for i, k in enumerate(buckets)]
    spans.append(Span(0, "compute", "optimizer", done, done + opt))
    p = scene.profile.param_bytes
    mem = scene.memory(scene.state_bytes(0, n), p, scene.activations(0, n, per_rank))  # + DDP buckets
    return Estimate(
        done + opt,
        mem,
        2 * (world - 1) * p,
        ring_nic_bytes(p, world, cl),
        tuple(spans),
        {"buckets": len(buckets)},
    )


def _compressed_allreduce(scene: Scene, world: int, c: CodecPrice) -> Estimate:
    """Forward, backward, then per step: encode, exchange (all-reduce of the payload if the codec
    is reducible, else all-gather of every rank's payload), decode (W payloads when gathered)."""
    n, cl = scene.layers, scene.cluster
    f, b = scene.pass_fb(0, n, scene.batch / world, busy=world)
    k = scene.compute_scale * cl.contention(world)
    ranks, buckets = range(world), 0
    if c.reducible:
        comm, sent = allreduce_s(c.payload_bytes, ranks, cl), 2 * (world - 1) * c.payload_bytes
        decode = k * c.decode_s
        nic = ring_nic_bytes(c.payload_bytes, world, cl)
    else:  # per DDP bucket: a frame (count + one length per part: a parameter, or the bucket) and sizes
        backward = [layer.param_bytes for layer in reversed(scene.profile.layers)]
        buckets = len(buckets_of(backward, 25 * 2**20))
        frame = c.payload_bytes + 4 * (buckets + (buckets if c.flat else len(scene.profile.params)))
        comm = group_allgather_s(world * frame, ranks, cl) + buckets * group_allgather_s(8 * world, ranks, cl)
        sent = world * (world - 1) * (frame + 8 * buckets)
        decode = k * c.decode_s * world
        nic = 0.0 if cl.hosts <= 1 else (world - 1) * (frame + 8 * buckets)
    opt = scene.optimizer_s(scene.profile.param_bytes)
    spans, end = _phases(0, 0.0, [
        ("compute", "forward", f, "F"), ("compute", "backward", b, "B"),
        ("compute", "other compute", k * c.encode_s, "encode"), ("comm", "comm", comm, c.compression),
        ("compute", "other compute", decode, "decode"), ("compute", "optimizer", opt, "")])
    acts = scene.activations(0, n, scene.batch / world)
    mem = scene.memory(scene.state_bytes(0, n), scene.profile.param_bytes, acts)
    return Estimate(end, mem, sent, nic, tuple(spans),
                    {"compression": c.compression, "payload_bytes": c.payload_bytes, "buckets": buckets,
                     "compression_ratio": round(c.ratio, 2), "encode_s": k * c.encode_s, "decode_s": decode})


def local_sgd(scene: Scene, world: int, period: int) -> Estimate:
    """Plain local steps; every ``period`` steps one all-reduce of the parameters (amortised);
    ``period`` 0 averages once, after the last step: no exchange in the steady step."""
    n, cl, p = scene.layers, scene.cluster, scene.profile.param_bytes
    f, b = scene.pass_fb(0, n, scene.batch / world, busy=world)
    opt = scene.optimizer_s(p)
    per = 1 / period if period > 0 else 0.0  # averages per step
    avg = allreduce_s(p, range(world), cl) * per
    spans, end = _phases(
        0,
        0.0,
        [
            ("compute", "forward", f, "F"),
            ("compute", "backward", b, "B"),
            ("compute", "optimizer", opt, ""),
            ("comm", "comm", avg, f"avg/{period}" if period else "avg at end"),
        ],
    )
    mem = scene.memory(scene.state_bytes(0, n), scene.activations(0, n, scene.batch / world))
    return Estimate(
        end, mem, 2 * (world - 1) * p * per, ring_nic_bytes(p, world, cl) * per, tuple(spans)
    )


# --- parameter servers -----------------------------------------------------------------------------


def shard_bytes(scene: Scene, sharding: str, servers: int) -> list[float]:
    """Bytes per server of the real shard plan (`strategies.ps.sharding.make_plan`)."""
    infos = [ParamInfo(name, shape) for name, shape in scene.profile.params]
    return [BYTES * s for s in make_plan(sharding, infos, servers).sizes()]


def ps(scene: Scene, world: int, servers: int, sharding: str, consistency: str) -> Estimate:
    """Servers are ranks 0..S−1, workers the rest; per step every worker pushes and pulls its shard
    of every server. BSP/k-of-n wait for the busiest link; async/SSP overlap workers' traffic."""
    n, cl, p = scene.layers, scene.cluster, scene.profile.param_bytes
    workers = world - servers
    sizes = shard_bytes(scene, sharding, servers)
    traffic = ps_traffic(sizes, range(servers), range(servers, world), cl)
    f, b = scene.pass_fb(0, n, scene.batch / workers, busy=workers)
    apply = scene.optimizer_s(max(sizes))
    if consistency in ("bsp", "k-of-n"):
        # the server sums every worker's push into its shard (one add per worker, each about one
        # SGD update of the shard) before it applies the update
        apply *= workers + 1
        items = [
            ("compute", "forward", f, "F"),
            ("compute", "backward", b, "B"),
            ("comm", "comm", traffic.phase_s, "push"),
            ("comm", "comm", workers * scene.ps_request_s, "server requests"),
            ("comm", "comm", apply, "server update"),
            ("comm", "comm", traffic.phase_s, "pull"),
        ]
        spans, step = _phases(servers, 0.0, items)
    else:
        solo = [
            ("compute", "forward", f, "F"),
            ("compute", "backward", b, "B"),
            ("comm", "comm", traffic.solo_s, "push"),
            ("comm", "comm", scene.ps_request_s, "server request"),
            ("comm", "comm", traffic.solo_s, "pull"),
        ]
        spans, step = _phases(servers, 0.0, solo)
        step = max(step, 2 * traffic.phase_s, (apply + scene.ps_request_s) * workers)
    worker_mem = scene.memory(
        scene.state_bytes(0, n) - sum(r.optimizer_bytes for r in scene.profile.layers),
        scene.activations(0, n, scene.batch / workers),
    )
    state_per_byte = 2 + sum(r.optimizer_bytes for r in scene.profile.layers) / max(1, p)
    server_mem = scene.memory(max(sizes) * state_per_byte)
    return Estimate(
        step,
        max(worker_mem, server_mem),
        traffic.bytes_per_step,
        max(traffic.nic_out + traffic.nic_in) if cl.hosts > 1 else 0.0,
        tuple(spans),
        {"shard_bytes": sizes},
    )


# --- one weird trick and tensor parallelism --------------------------------------------------------


def owt(scene: Scene, world: int) -> Estimate:
    """Conv part data-parallel on B/W; every FC layer's output columns split W ways, computed for all
    B; an all-gather after the conv part and after every FC layer; in backward a reduce-scatter of
    each gather but the last (the next layer's column shards each used all of it; the last gather's
    users all compute the same loss, so each keeps its own part), sent directly as the runtime
    does (`direct_exchange_s`); the conv gradients all-reduced after backward."""
    prof, cl = scene.profile, scene.cluster
    start, n, ranks = prof.fc_start or 0, scene.layers, range(world)
    cf, cb = scene.pass_fb(0, start, scene.batch / world, busy=world)
    gathered = [prof.layers[i].activation_bytes * scene.batch / prof.batch_size for i in range(start - 1, n)]
    # each gather (reduce-scatter) follows the compute of the layer whose output it moves: all the
    # time a shaped link's bucket has to refill in
    fc = [scene.layer_fb(i, scene.batch, busy=world, split=world) for i in range(start, n)]
    ff, fb_ = sum(f for f, _ in fc), sum(b for _, b in fc)
    idle_f, idle_b = [cf, *(f for f, _ in fc)], [cb, *(b for _, b in fc)]
    gather = sum(group_allgather_s(g, ranks, refilled(cl, t)) for g, t in zip(gathered, idle_f, strict=False))
    split = gathered[:-1]  # the gathers whose consumers are column shards
    scatter = sum(direct_exchange_s(g, ranks, refilled(cl, t)) for g, t in zip(split, idle_b, strict=False))
    conv_p = sum(r.param_bytes for r in prof.layers[:start])
    sync = allreduce_s(conv_p, ranks, cl)
    opt = scene.optimizer_s(conv_p + (prof.param_bytes - conv_p) / world)
    items = [
        ("compute", "forward", cf + ff, "F"),
        ("comm", "comm", gather, "gathers"),
        ("compute", "backward", cb + fb_, "B"),
        ("comm", "comm", scatter, "reduce-scatters"),
        ("comm", "comm", sync, "conv all-reduce"),
        ("compute", "optimizer", opt, ""),
    ]
    spans, step = _phases(0, 0.0, items)
    mem = scene.memory(
        scene.state_bytes(0, start),
        scene.state_bytes(start, n, world),
        scene.activations(0, start, scene.batch / world),
        scene.activations(start, n, scene.batch),
    )
    moved = sum(gathered) + sum(split) + 2 * conv_p  # each rank sends (W−1)/W of these
    sent = (world - 1) * moved
    nic = (world - 1) / world * moved if cl.hosts > 1 else 0.0
    return Estimate(step, mem, sent, nic, tuple(spans))


def tp_layers(profile: Profile) -> list[int]:
    """Indices of transformer blocks (the layers Megatron splits)."""
    return [i for i, r in enumerate(profile.layers) if r.kind == "Block"]


def tensor(scene: Scene, tp: int, dp: int = 1) -> Estimate:
    """Megatron over ``tp`` consecutive ranks on B/dp samples: blocks split tp ways with 2+2
    all-reduces of their (B, T, D) output; other layers replicated. ``dp`` > 1: the dp groups then
    all-reduce each shard's gradients (mesh dp×tp), after backward."""
    prof, cl, n = scene.profile, scene.cluster, scene.layers
    blocks, batch, world = set(tp_layers(prof)), scene.batch / dp, tp * dp
    f, b = scene.pass_fb(0, 0, batch, busy=world)  # the per-action overheads
    comm = 0.0
    for i in range(n):
        lf, lb = scene.layer_fb(i, batch, busy=world, split=tp if i in blocks else 1)
        f, b = f + lf, b + lb
        if i in blocks:
            act = prof.layers[i].activation_bytes * batch / prof.batch_size
            cf, cb = tp_block_s(act, range(tp), cl, compute_s=(lf, lb))
            comm += cf + cb
    shard_p = sum(r.param_bytes / (tp if i in blocks else 1) for i, r in enumerate(prof.layers))
    sync = (
        allreduce_s(shard_p, range(0, world, tp), cl, nic_share=min(cl.procs_per_host, tp)) if dp > 1 else 0.0
    )
    opt = scene.optimizer_s(shard_p)
    items = [
        ("compute", "forward", f, "F"),
        ("comm", "comm", comm / 2, "f/g"),
        ("compute", "backward", b, "B"),
        ("comm", "comm", comm / 2, "f/g"),
        ("comm", "comm", sync, "dp all-reduce"),
        ("compute", "optimizer", opt, ""),
    ]
    spans, step = _phases(0, 0.0, items)
    split_state = sum(scene.state_bytes(i, i + 1, tp if i in blocks else 1) for i in range(n))
    mem = scene.memory(split_state, scene.activations(0, n, batch))
    acts = sum(prof.layers[i].activation_bytes * batch / prof.batch_size for i in blocks)
    sent = dp * tp * 4 * 2 * (tp - 1) / tp * acts + (2 * (dp - 1) * shard_p * tp if dp > 1 else 0.0)
    return Estimate(step, mem, sent, 0.0 if cl.hosts <= 1 else sent / cl.hosts, tuple(spans))


def counted(profile: Profile) -> bool:
    """Whether ``profile`` was counted on the meta device (`plan.meta`): a model planned at scale."""
    return any(r.counted for r in profile.layers)
