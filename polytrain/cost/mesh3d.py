"""Three-dimensional layouts (t, p, d): tensor parallelism within a host, pipeline and data across.

Megatron-LM's cost (Narayanan et al., SC'21, §3), priced from the profile's layers:

- ranks: rank = (replica·p + stage)·t + shard, so a tensor group is t consecutive ranks of one host;
- blocks cut uniformly into p·v chunks (chunk c on rank c mod p: v = 1 for 1F1B, v ≥ 2 for the
  interleaved schedule), the layers before the first block on the first chunk, those after the
  last block on the last; every layer's work split t ways;
- per micro-batch of b = B/(d·m) samples, each block all-reduces its (b, s, h) activations twice in
  forward and twice in backward over its tensor group (twice more when recomputed), on the
  intra-host link; each chunk boundary on another rank sends b·s·h elements, 1/t of them per
  shard (the scatter/gather of §4.1), forward and backward;
- a step: m + (p − 1)/v micro-batches' time of the slowest rank (the bubble (p − 1)/(v·m)), then
  each rank's gradients all-reduced over its d replicas (all t·p groups of a host share its NIC),
  then the optimizer on the rank's parameters;
- memory per rank: the model state of its chunks (`cost.memory.state_bytes`, 1/t of each layer)
  and, per (chunk, micro-batch) the schedule's own orders keep in flight at the rank's peak, that
  chunk's activations (`cost.memory.transformer_activation_bytes`); with recomputation one block's
  full set on top while it is recomputed.
"""

from __future__ import annotations

import functools

from polytrain.cost.cluster import Cluster
from polytrain.cost.estimate import tp_layers
from polytrain.cost.memory import element_bytes, transformer_activation_bytes
from polytrain.cost.network import allreduce_s, intra_link, nic_link
from polytrain.cost.scene import Estimate, Scene, Span
from polytrain.cost.simulate import schedule_orders
from polytrain.schedules.registry import in_flight


@functools.lru_cache(maxsize=1024)
def _orders_peaks(schedule: str, stages: int, microbatches: int, virtual: int) -> tuple[int, ...]:
    return tuple(in_flight(schedule_orders(schedule, stages, microbatches, virtual)))


def peak_in_flight(schedule: str, stages: int, microbatches: int, virtual: int) -> tuple[int, ...]:
    """Per rank, the (chunk, micro-batch) activations in flight at its peak under the schedule's
    own orders. Past 2p micro-batches a schedule that bounds them (1F1B, interleaved) holds no
    more; one that does not (GPipe) holds all m·v: the orders are built for at most 2p."""
    if stages == 1:
        return (virtual,)
    m = min(microbatches, 2 * stages)
    peaks = _orders_peaks(schedule, stages, m, virtual)
    if m == microbatches or max(peaks) < m * virtual:
        return peaks
    return tuple(microbatches * virtual for _ in peaks)


@functools.lru_cache(maxsize=4096)
def _dp_allreduce_s(nbytes: float, t: int, p: int, d: int, cluster: Cluster, share: int) -> float:
    """All-reduce over the d replicas of one rank (rank = (replica·p + stage)·t + shard)."""
    return allreduce_s(nbytes, [k * p * t for k in range(d)], cluster, nic_share=share)


def chunks_of(scene: Scene, chunks: int) -> list[tuple[int, int]] | str:
    """[lo, hi) layer bounds of ``chunks`` uniform chunks of the blocks, or why there are none."""
    blocks = tp_layers(scene.profile)
    if not blocks or len(blocks) % chunks:
        return f"{len(blocks)} transformer blocks do not split into {chunks} equal chunks"
    per = len(blocks) // chunks
    bounds = [(blocks[0] + c * per, blocks[0] + (c + 1) * per) for c in range(chunks)]
    bounds[0] = (0, bounds[0][1])
    bounds[-1] = (bounds[-1][0], scene.layers)
    return bounds


def mesh3d(scene: Scene, t: int, p: int, d: int, microbatches: int, schedule: str = "1f1b",
           virtual: int = 1) -> Estimate | str:
    """One step of the (t, p, d) layout with ``microbatches`` per replica (× ``grad_accum``)."""
    prof, cl = scene.profile, scene.cluster
    m = microbatches * scene.grad_accum
    v = max(1, virtual)
    micro = scene.batch / d / m
    bounds = chunks_of(scene, p * v)
    if isinstance(bounds, str):
        return bounds
    shape = scene.transformer
    elem = element_bytes(scene.precision)
    world = t * p * d
    # per chunk and micro-batch: compute, its blocks' tensor-parallel all-reduces, its boundary
    tp_ranks = range(t)
    block_msg = 0.0
    if shape and t > 1:
        s, h, _ = shape
        block_msg = allreduce_s(s * h * micro * elem, tp_ranks, cl)
    crosses = cl.host_of(0) != cl.host_of(t) if p > 1 else False
    link = nic_link(cl, t) if crosses else intra_link(cl)
    boundary = link.p2p_s(shape[0] * shape[1] * micro * elem / t) if shape and p > 1 else 0.0
    blocks = set(tp_layers(prof))
    per_rank = [0.0] * p
    tp_comm = 0.0
    for c, (lo, hi) in enumerate(bounds):
        f, b = scene.fb(lo, hi, micro, split=t)
        n_blocks = sum(1 for i in range(lo, hi) if i in blocks)
        comm_f = 2 * n_blocks * block_msg
        comm_b = (4 if scene.recompute else 2) * n_blocks * block_msg
        tp_comm += comm_f + comm_b
        edges = (c > 0) + (c < len(bounds) - 1)
        per_rank[c % p] += f + b + comm_f + comm_b + 2 * edges * boundary
    slowest = max(per_rank)
    pipe = slowest * (m + (p - 1) / v)
    # data-parallel gradient all-reduce of each rank's shard; all of a host's groups at once
    rank_params = [sum(prof.layers[i].param_bytes for c, (lo, hi) in enumerate(bounds) if c % p == r
                       for i in range(lo, hi)) / t for r in range(p)]
    grad_per_fp32 = scene.state[1]
    share = max(1, min(cl.procs_per_host, t * p))
    sync = _dp_allreduce_s(max(rank_params) * grad_per_fp32, t, p, d, cl, share) if d > 1 else 0.0
    opt = scene.optimizer_s(max(rank_params))
    step = pipe + sync + opt
    # memory: the rank's state, its chunks' activations in flight, a recomputed block's full set
    peaks = peak_in_flight(schedule, p, m, v)
    mem = 0.0
    for r in range(p):
        mine = [bc for c, bc in enumerate(bounds) if c % p == r]
        state = sum(scene.state_bytes(lo, hi, t) for lo, hi in mine)
        acts = max(scene.activations(lo, hi, micro * scene.grad_accum, t) for lo, hi in mine)
        extra = 0.0
        if scene.recompute and shape:
            extra = transformer_activation_bytes(shape[0], micro, shape[1], shape[2], t, False, elem)
        mem = max(mem, state + peaks[r] * acts + extra)
    spans = (Span(0, "compute", "forward", 0.0, pipe, f"{m} micro-batches"),
             Span(0, "comm", "comm", pipe, pipe + sync, "dp all-reduce"),
             Span(0, "compute", "optimizer", pipe + sync, step))
    act_bytes = shape[0] * shape[1] * micro * elem if shape else 0.0
    tp_bytes = d * p * t * 2 * (t - 1) / t * act_bytes * m * (6 if scene.recompute else 4) * len(blocks) / p
    pp_bytes = d * t * 2 * (p * v - 1) * m * act_bytes / t
    dp_bytes = 2 * (d - 1) * sum(rank_params) * grad_per_fp32 * t if d > 1 else 0.0
    again = [r.forward_flops if scene.recompute and i in blocks else 0.0 for i, r in enumerate(prof.layers)]
    flops = sum(r.forward_flops + r.backward_flops + x
                for r, x in zip(prof.layers, again, strict=True)) * scene.batch / prof.batch_size
    detail = {"layout": {"t": t, "p": p, "d": d}, "microbatch": micro, "microbatches": m, "virtual": v,
              "bubble": round((p - 1) / (v * m), 4), "tp_comm_s": tp_comm * m / p, "dp_allreduce_s": sync,
              "model_tflops_per_rank": flops / step / world / 1e12 if flops else None}
    return Estimate(step, int(mem + scene.memory()), tp_bytes + pp_bytes + dp_bytes,
                    (pp_bytes + dp_bytes) / max(1, cl.hosts) if cl.hosts > 1 else 0.0, spans, detail)


#: micro-batch sizes (samples) and virtual stages the planner tries for each (t, p, d)
MICRO_SIZES = (1, 2, 4, 8)
VIRTUAL = (1, 2, 4)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def layouts(scene: Scene) -> list[dict[str, int | str]]:
    """Mesh options of every (t, p, d) on the cluster's world: t a divisor of the heads within a
    host, p a divisor of the blocks, d the rest dividing the batch; per layout each micro-batch
    size of `MICRO_SIZES` that divides the replica's batch, 1F1B and the interleaved schedule
    (v chunks per rank where the blocks split p·v ways and m is a multiple of p), the layers
    per chunk of `chunks_of` pinned as ``partition`` so that ``mesh`` runs the cut priced."""
    cl, prof = scene.cluster, scene.profile
    shape = scene.transformer
    heads = shape[2] if shape else 1
    blocks = len(tp_layers(prof))
    out: list[dict[str, int | str]] = []
    for t in _divisors(cl.procs_per_host):
        if heads % t:
            continue
        for p in _divisors(blocks) if blocks else [1]:
            if cl.world % (t * p):
                continue
            d = cl.world // (t * p)
            if scene.batch % d:
                continue
            replica = scene.batch // d
            for size in MICRO_SIZES:
                if replica % size:
                    continue
                m = replica // size
                for v in VIRTUAL:
                    if v > 1 and (p == 1 or blocks % (p * v) or m % p):
                        continue
                    opts: dict[str, int | str] = {"dp": d, "pp": p, "tp": t, "microbatches": m}
                    cut = chunks_of(scene, p * v)
                    if p > 1 and not isinstance(cut, str):  # the cut priced is the cut run
                        opts["partition"] = ",".join(str(hi - lo) for lo, hi in cut)
                    if v > 1:
                        opts.update(schedule="interleaved-1f1b", virtual_stages=v)
                    out.append(opts)
    return out
