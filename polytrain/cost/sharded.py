"""The cost model of sharded data parallelism: ZeRO stages 1–3 (``zero``) and FSDP2 (``fsdp``).

Time: backward overlaps the gradient reduce-scatters as DDP's buckets overlap its all-reduces
(`cost.ddp_overlap`; a ring reduce-scatter moves half an all-reduce's bytes, so it takes half its
time). The optimizer then updates 1/W of the parameters. Stages 1–2 all-gather the updated
parameters after it. Stage 3 (and FSDP2) instead all-gathers each layer before its forward and
again before its backward. Without prefetch a layer waits for its gather; with it, the next
layer's gather overlaps this layer's compute.

Bytes, all ranks together per step: 2(W−1)·Ψ at stages 1–2 (what a ring all-reduce sends), 3(W−1)·Ψ
at stage 3 (one more all-gather), Ψ the parameter bytes.

Memory per rank, fp32, K bytes of optimizer state per parameter byte (the profile's
``optimizer_bytes``): stage 1 holds 2Ψ + K/W, stage 2 Ψ + (Ψ + K)/W, stage 3 (2Ψ + K)/W. Stage 2
adds a unit's gradient twice (``p.grad`` and the flat copy it reduce-scatters, up to ``bucket_mb``
each): with units as large as the model it peaks above stage 1. Stage 3 adds, while a layer runs, its gathered
parameters and its gradient buffer, the next layer's parameters under prefetch, and one unit's
gradient in flight. FSDP2 without resharding after forward keeps every layer gathered from its
forward to its backward (Ψ more). Activations are on top of each.
"""

from __future__ import annotations

from polytrain.cost.estimate import Estimate, Scene, Span, ring_nic_bytes
from polytrain.cost.network import allreduce_s, ddp_overlap, group_allgather_s


def _gathered_compute(compute: list[float], gathers: list[float], prefetch: bool) -> float:
    """Seconds to run ``compute[i]`` after gathering layer i: in sequence, or with the next
    gather overlapping this layer's compute (prefetch)."""
    if not prefetch:
        return sum(compute) + sum(gathers)
    nxt = [*gathers[1:], 0.0]
    return gathers[0] + sum(max(c, g) for c, g in zip(compute, nxt, strict=True))


def sharded(scene: Scene, world: int, stage: int, bucket_mb: float = 25.0, prefetch: bool = False,
            keep_gathered: bool = False) -> Estimate:
    """One step of ZeRO ``stage`` on ``world`` ranks. ``keep_gathered``: stage 3 that keeps a
    layer's gathered parameters from its forward to its backward (FSDP2's
    ``reshard_after_forward=False``: no backward gather)."""
    n, cl, layers = scene.layers, scene.cluster, scene.profile.layers
    ranks = range(world)
    per_rank = scene.batch / world
    p = scene.profile.param_bytes
    f, extra = scene.pass_fb(0, 0, per_rank, busy=world)
    fb = [scene.layer_fb(i, per_rank, busy=world) for i in range(n)]
    gathers = [group_allgather_s(r.param_bytes, ranks, cl) if stage == 3 else 0.0 for r in layers]
    f += _gathered_compute([x[0] for x in fb], gathers, prefetch)
    again = stage == 3 and not keep_gathered  # gathered again for backward
    b = [x[1] for x in reversed(fb)]  # backward order: last layer first
    if again:  # the gathers' wait spread over the layers, in proportion to their compute
        back = _gathered_compute(b, list(reversed(gathers)), prefetch)
        b = [x * back / max(sum(b), 1e-12) for x in b]
    backward = [(b[j] + (extra if j == 0 else 0.0), layers[n - 1 - j].param_bytes) for j in range(n)]
    bucket = int(bucket_mb * 2**20) if stage < 3 else 1  # stage 3: one unit per layer
    done, units = ddp_overlap(f, backward, lambda s: allreduce_s(s, ranks, cl) / 2, bucket)
    opt = scene.optimizer_s(p / world)
    gather_all = group_allgather_s(p, ranks, cl) if stage < 3 else 0.0
    spans = [Span(0, "compute", "forward", 0.0, f, "F"), Span(0, "compute", "backward", f, f + sum(b), "B")]
    spans += [Span(0, "comm", "comm", u.start_s, u.end_s, f"reduce-scatter {i}") for i, u in enumerate(units)]
    spans.append(Span(0, "compute", "optimizer", done, done + opt))
    if gather_all:
        spans.append(Span(0, "comm", "comm", done + opt, done + opt + gather_all, "all-gather"))
    return Estimate(done + opt + gather_all, _memory(scene, world, stage, bucket_mb, prefetch, keep_gathered),
                    (3 if again else 2) * (world - 1) * p,
                    ring_nic_bytes(p, world, cl) * (1.5 if again else 1.0), tuple(spans),
                    {"stage": stage, "units": len(units)})


def _memory(scene: Scene, world: int, stage: int, bucket_mb: float, prefetch: bool,
            keep_gathered: bool) -> int:
    layers = scene.profile.layers
    fp32 = scene.profile.param_bytes
    kp, kg, ko = scene.state  # bytes per fp32 parameter byte (`plan.memory.state_bytes`)
    p, g = kp * fp32, kg * fp32
    k = sum(r.optimizer_bytes for r in layers) if scene.precision == "fp32" else ko * fp32
    act = scene.activations(0, scene.layers, scene.batch / world)
    if stage == 1:
        return scene.memory(p + g + k / world, act)
    if stage == 2:
        return scene.memory(p + (g + k) / world, 2 * min(g, bucket_mb * 2**20), act)
    biggest = max((r.param_bytes for r in layers), default=0) * kp
    transient = biggest * (3 + (1 if prefetch else 0))  # gathered, its gradient, one in flight
    if keep_gathered:
        transient += p
    return scene.memory((p + g + k) / world, transient, act)
