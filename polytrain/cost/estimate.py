"""Per-strategy estimates of the data-parallel, parameter-server and tensor-parallel families.

Every estimator reads a `Scene` (profile, cluster, global batch, compute scale) and returns an
`Estimate` (`cost.scene`). Communication comes from `cost.network`; pipelines are priced in
`cost.pipeline` (with `cost.simulate`), sharded data parallelism in `cost.sharded`, 3-D meshes in
`cost.mesh3d`.
"""

from __future__ import annotations

from polytrain.cost.cluster import Cluster
from polytrain.cost.codecs import CodecPrice
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
from polytrain.cost.profile import Profile
from polytrain.cost.scene import Estimate, Scene, Span, phases
from polytrain.runtime.sharding import ParamInfo, make_plan

BYTES = 4  # float32 parameters, gradients and activations

# --- data parallelism ------------------------------------------------------------------------------


def single(scene: Scene) -> Estimate:
    n = scene.layers
    f, b = scene.pass_fb(0, n, scene.batch)
    opt = scene.optimizer_s(scene.profile.param_bytes)
    spans, end = phases(
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
    """DDP: backward overlapped with bucketed all-reduces (`cost.network.ddp_overlap`); with a codec, the
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
    spans, _ = phases(
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
    spans, end = phases(0, 0.0, [
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
    spans, end = phases(
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
    """Bytes per server of the real shard plan (`runtime.sharding.make_plan`)."""
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
        spans, step = phases(servers, 0.0, items)
    else:
        solo = [
            ("compute", "forward", f, "F"),
            ("compute", "backward", b, "B"),
            ("comm", "comm", traffic.solo_s, "push"),
            ("comm", "comm", scene.ps_request_s, "server request"),
            ("comm", "comm", traffic.solo_s, "pull"),
        ]
        spans, step = phases(servers, 0.0, solo)
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
    spans, step = phases(0, 0.0, items)
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
    spans, step = phases(0, 0.0, items)
    split_state = sum(scene.state_bytes(i, i + 1, tp if i in blocks else 1) for i in range(n))
    mem = scene.memory(split_state, scene.activations(0, n, batch))
    acts = sum(prof.layers[i].activation_bytes * batch / prof.batch_size for i in blocks)
    sent = dp * tp * 4 * 2 * (tp - 1) / tp * acts + (2 * (dp - 1) * shard_p * tp if dp > 1 else 0.0)
    return Estimate(step, mem, sent, 0.0 if cl.hosts <= 1 else sent / cl.hosts, tuple(spans))
