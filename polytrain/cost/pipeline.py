"""Estimates of the stage-cutting strategies: gpipe, 1f1b, zb-h1, the virtual-stage schedules
(interleaved-1f1b, looped-bfs, zbv, dualpipev), pipedream, spectrain, layerwise, mesh dp×pp.

The partition is PipeDream's planner's (`models.partition.pipedream_plan`, one replica per stage) on
the profile's per-layer costs at the micro-batch size; the step is the registered schedule's own
orders replayed on a model clock (`cost.simulate.pipeline_step`; with V chunks per rank the
profile is cut into P·V chunks placed as the runtime places them, `schedule_virtual.chunk_rank`),
then — for mesh dp×pp — each rank's gradients all-reduced over its dp replicas, then the slowest
rank's optimizer step.
Rank layout as `runtime.layout.Layout` numbers it: rank = d·pp + s.
"""

from __future__ import annotations

from polytrain.cost.network import allreduce_s, p2p_s, refilled, shared_cores
from polytrain.cost.scene import Estimate, Scene, Span
from polytrain.cost.simulate import StageTimes, pipeline_step, schedule_orders
from polytrain.models.partition import LayerCost, Partition, balanced, pipedream_plan, uniform
from polytrain.schedules.registry import get_schedule, in_flight
from polytrain.schedules.virtual import chunk_rank

STASHING = {"pipedream": "stash", "spectrain": "predict"}


def plan_partition(scene: Scene, stages: int, micro: float, link_bps: float | None = None) -> Partition:
    """PipeDream's DP over the profile at ``micro`` samples, for ``link_bps`` (default: the
    cluster's NIC, or intra link on one host). A run with ``partition=auto`` plans for its own
    ``link_gbps`` option (10 Gbit/s unless set), whatever the network: pricing that run needs the
    cut it makes, not the one the planner would choose (`plan` pins its cut in the command)."""
    prof = scene.profile
    costs = [
        LayerCost(
            r.name,
            sum(scene.layer_fb(i, micro)),
            int(r.activation_bytes * micro / prof.batch_size),
            r.param_bytes,
        )
        for i, r in enumerate(prof.layers)
    ]
    link = link_bps or (scene.cluster.nic_bps if scene.cluster.hosts > 1 else scene.cluster.intra_bps)
    return pipedream_plan(costs, stages, link, replicate=False).partition


def run_partition(scene: Scene, stages: int, micro: float, partition: str, replicate: bool = False,
                  link_gbps: float = 10.0) -> Partition | None:
    """The cut the runtime makes for a pipeline's ``partition`` option
    (`strategies.pipeline.planning.resolve_partition`), from the profile at the micro-batch where
    the runtime measures one; None: the planner's own (replicated stages are not priced)."""
    prof, layers = scene.profile, scene.layers
    if partition == "uniform" or stages == 1:
        return uniform(layers, stages)
    if partition == "params":
        return balanced([r.param_bytes for r in prof.layers], stages)
    if partition == "time":
        return balanced([sum(scene.layer_fb(i, micro)) for i in range(layers)], stages)
    if partition == "auto":
        return None if replicate else plan_partition(scene, stages, micro, link_gbps * 1e9 / 8)
    return Partition.parse(partition)


def micro_batch(scene: Scene, flush: bool, microbatches: int, dp: int = 1) -> float:
    """Samples per micro-batch of one replica: flush schedules split B/dp into M, stream
    schedules (pipedream) take B/dp whole."""
    return scene.batch / dp / microbatches if flush else scene.batch / dp


def price_pipeline(scene: Scene, schedule: str, stages: int, microbatches: int, dp: int = 1,
                   partition: str = "auto", replicate: bool = False, link_gbps: float = 10.0,
                   virtual: int | None = None) -> Estimate:
    """A pipeline run with these options priced: its own cut (``partition``, over the P·V chunks
    of ``virtual`` chunks per rank; None: the schedule's default), then `pipeline`."""
    spec = get_schedule(schedule)
    micro = micro_batch(scene, spec.flush, microbatches, dp)
    chunks = stages * (virtual or spec.default_virtual)
    if spec.placement != "none" and partition == "auto":  # chunks cut auto as uniform (`chunks`)
        partition = "uniform"
    part = run_partition(scene, chunks, micro, partition, replicate, link_gbps)
    est, used = pipeline(scene, schedule, stages, microbatches, dp, part, virtual)
    return Estimate(est.step_s, est.peak_memory_bytes, est.bytes_per_step, est.nic_bytes_per_step,
                    est.spans, {**est.detail, "partition": str(used)})


def planned_partition(scene: Scene, schedule: str, stages: int, microbatches: int, dp: int = 1) -> str:
    """The planner's own cut for a candidate (PipeDream's DP on the cluster's link, over the
    schedule's P·V chunks), pinned in the command it recommends."""
    spec = get_schedule(schedule)
    micro = micro_batch(scene, spec.flush, microbatches, dp)
    return str(plan_partition(scene, stages * spec.default_virtual, micro))


def _stage_memory(scene: Scene, schedule: str, part: Partition, micro: float, count: int,
                  homes: list[int], virtual: int) -> int:
    """The largest rank's memory: the state of its chunks and, per (chunk, micro-batch) it holds
    at its peak (`in_flight` of the orders the runtime runs), its largest chunk's activations."""
    ranks = max(homes) + 1
    peaks = in_flight(schedule_orders(schedule, ranks, count, virtual))
    out = 0
    for r in range(ranks):
        mine = [c for c, h in enumerate(homes) if h == r]
        params = sum(r_.param_bytes for c in mine for r_ in scene.profile.layers[slice(*part.bounds[c])])
        extra = {"stash": (ranks - r - 1) * params, "predict": params}.get(STASHING.get(schedule, ""), 0)
        state = sum(scene.state_bytes(*part.bounds[c]) for c in mine)
        acts = max(scene.activations(*part.bounds[c], micro) for c in mine)
        out = max(out, scene.memory(state, peaks[r] * acts, extra))
    return out


def pipeline(
    scene: Scene,
    schedule: str,
    stages: int,
    microbatches: int,
    dp: int = 1,
    partition: Partition | None = None,
    virtual: int | None = None,
) -> tuple[Estimate, Partition]:
    """One pipeline of ``stages`` ranks (×``dp`` replicas), each holding ``virtual`` model chunks
    (None: the schedule's default; the partition cuts P·V chunks, placed as the runtime places
    them); flush schedules split B/dp into M micro-batches, stream schedules (pipedream) take B/dp
    per mini-batch."""
    prof, cl = scene.profile, scene.cluster
    spec = get_schedule(schedule)
    flush, v = spec.flush, virtual or spec.default_virtual
    chunks = stages * v
    homes = [chunk_rank(c, stages, spec.placement) for c in range(chunks)]
    batch = scene.batch / dp
    micro = micro_batch(scene, flush, microbatches, dp)
    part = partition or plan_partition(scene, chunks, micro)
    # each action exchanges a message with every neighbouring chunk on another rank
    fb = [scene.action_fb(a, b, micro, _remote(homes, c)) for c, (a, b) in enumerate(part.bounds)]
    acts = [prof.layers[b - 1].activation_bytes * micro / prof.batch_size for _, b in part.bounds[:-1]]
    remote = [homes[c] != homes[c + 1] for c in range(chunks - 1)]  # the V's turn: in memory
    chunk_params = [sum(r.param_bytes for r in prof.layers[a:b]) for a, b in part.bounds]
    stage_params = [sum(p for c, p in enumerate(chunk_params) if homes[c] == r) for r in range(stages)]
    # a stream schedule updates after every backward: the update is part of each backward
    updates = [0.0 if flush else scene.optimizer_s(p) for p in chunk_params]
    count = microbatches if flush else 1
    # shared cores: the simulation shares them among the stages computing at each moment (the dp
    # replicas run alongside, each pipeline gets 1/dp of them); each message's α waits on all W
    # ranks' contention, as every other pattern's messages do (`shared_cores`); a first pass finds
    # how many ranks compute at once on average, the second spaces a boundary's messages by the
    # sender's compute slowed by that
    cores = cl.cores / dp if cl.cores is not None else None
    link = shared_cores(cl, cl.world)
    busy = 1.0
    for _ in range(2):
        slow = cl.contention(busy)
        # a boundary's messages leave one per micro-batch, spaced by the sender's compute: a shaped
        # link's bucket refills only that long between them
        messages = tuple(p2p_s(x, homes[c], homes[c + 1], refilled(link, fb[c][0] * slow)) if remote[c]
                         else 0.0 for c, x in enumerate(acts))
        times = StageTimes(
            tuple(f for f, _ in fb),
            tuple(b + u for (_, b), u in zip(fb, updates, strict=True)),
            messages,
        )
        est = pipeline_step(schedule, times, count, cores, cl.wake_s, v)
        work = sum(e - s for row in est.timeline.values() for _, s, e in row)
        span = max((row[-1][2] for row in est.timeline.values() if row), default=0.0)
        busy = dp * work / span if span > 0 else 1.0
    sync = (
        max(
            allreduce_s(p, range(s, dp * stages, stages), cl, nic_share=min(cl.procs_per_host, stages))
            for s, p in enumerate(stage_params)
        )
        if dp > 1
        else 0.0
    )
    opt = max(scene.optimizer_s(p) for p in stage_params) if flush else 0.0
    step = est.step_s + sync + opt
    spans = [
        Span(s, "compute", "forward" if a.op == "F" else "backward", t0, t1, a.cell)
        for s, row in est.timeline.items()
        for a, t0, t1 in row
    ]
    end = max((sp.end for sp in spans), default=0.0)
    for s in range(stages):
        if sync:
            spans.append(Span(s, "comm", "comm", end, end + sync, "dp all-reduce"))
        if opt:
            spans.append(Span(s, "compute", "optimizer", end + sync, end + sync + opt))
    mem = _stage_memory(scene, schedule, part, micro, microbatches if flush else 2 * stages, homes, v)
    per_sample = [x / micro if remote[c] else 0.0 for c, x in enumerate(acts)]
    sent = dp * 2 * sum(per_sample) * batch + (2 * (dp - 1) * sum(stage_params) if dp > 1 else 0.0)
    nic = 0.0
    if cl.hosts > 1:
        crossing = [2 * x * batch if cl.host_of(homes[c]) != cl.host_of(homes[c + 1]) else 0.0
                    for c, x in enumerate(per_sample)]
        nic = max(crossing, default=0.0) + (2 * max(stage_params) if dp > 1 else 0.0)
    detail = {"partition": str(part), "bubble": round(est.bubble, 4), "microbatch": micro}
    return Estimate(step, mem, sent, nic, tuple(spans), detail), part


def _remote(homes: list[int], c: int) -> int:
    """How many of chunk ``c``'s neighbouring chunks sit on another rank."""
    return sum(0 <= n < len(homes) and homes[n] != homes[c] for n in (c - 1, c + 1))
