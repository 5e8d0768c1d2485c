"""The cost model of sharded data parallelism: ZeRO stages 1–3 (``zero``) and FSDP2 (``fsdp``).

Time: a step is ``grad_accum`` micro-steps of B/(W·k) samples each, then the optimizer on 1/W of
the parameters. Stages 1–2: backward overlaps the gradient reduce-scatters as DDP's buckets overlap
its all-reduces (`cost.network.ddp_overlap`; a ring reduce-scatter moves half an all-reduce's bytes, so it
takes half its time); after the optimizer they all-gather the updated parameters. Stage 3 (and
FSDP2) instead all-gathers each layer before its forward and again before its backward, in every
micro-step (the gathered layer is freed after use), and reduce-scatters each layer's gradient when
its backward is done. The gathers and the reduce-scatters cross the same links: one link carries
them in the order they are issued (`_on_one_link`), so in backward a layer's gradient and the next
layer's parameters share its bandwidth. Without prefetch a layer waits for its gather; with it, the
next layer's gather is issued as this layer's compute starts. Stages 2–3 reduce-scatter after every
micro-step (the shard accumulates); stage 1 and FSDP2 (gradient sync off for all but the last
micro-step) only after the last.

Bytes on the wire: the parameters in their compute precision (16-bit under bf16/fp16, which the
runtimes gather; `Scene.state`), the gradients in theirs. All ranks together per micro-step and
step, Ψ the parameters' bytes and Γ the gradients': stages 1–2 send (W−1)·(Γ + Ψ) (what a ring
all-reduce sends), stage 3 (W−1)·(2Ψ + Γ) (one more all-gather), each gather and each reduce-scatter
repeated per micro-step where it happens per micro-step.

Memory per rank, fp32, K bytes of optimizer state per parameter byte (the profile's
``optimizer_bytes``): stage 1 holds 2Ψ + K/W, stage 2 Ψ + (Ψ + K)/W, stage 3 (2Ψ + K)/W. Stage 2
adds a unit's gradient twice (``p.grad`` and the flat copy it reduce-scatters, up to ``bucket_mb``
each): with units as large as the model it peaks above stage 1. Stage 3 adds, while a layer runs, its gathered
parameters and its gradient buffer, the next layer's parameters under prefetch, and one unit's
gradient in flight. FSDP2 without resharding after forward keeps every layer gathered from its
forward to its backward (Ψ more); with gradient sync off over several micro-steps it accumulates
the full, unsharded gradient (Γ more). Activations (one micro-step's) are on top of each.
"""

from __future__ import annotations

from polytrain.cost.estimate import ring_nic_bytes
from polytrain.cost.network import allreduce_s, ddp_overlap, group_allgather_s
from polytrain.cost.scene import Estimate, Scene, Span


def _on_one_link(compute: list[float], gathers: list[float], reduces: list[float],
                 prefetch: bool) -> tuple[float, float]:
    """(seconds until layer i's ``compute[i]`` and every collective are done, seconds the link is
    busy), layers in execution order. Layer i runs after its gather (``gathers[i]``); its
    reduce-scatter (``reduces[i]``) is issued when it ends. One link serves the collectives one
    after another in the order they are issued: with ``prefetch`` the next layer's gather as this
    layer's compute starts, else after this layer's reduce-scatter."""
    n = len(compute)
    ready = [0.0] * n
    link = ready[0] = gathers[0] if n else 0.0
    t = 0.0
    for i in range(n):
        start = max(t, ready[i])
        if prefetch and i + 1 < n:
            link = ready[i + 1] = max(link, start) + gathers[i + 1]
        t = start + compute[i]
        link = max(link, t) + reduces[i]
        if not prefetch and i + 1 < n:
            link = ready[i + 1] = max(link, t) + gathers[i + 1]
    return max(t, link), sum(gathers) + sum(reduces)


def sharded(scene: Scene, world: int, stage: int, bucket_mb: float = 25.0, prefetch: bool = False,
            keep_gathered: bool = False, reduce_each_micro: bool = True) -> Estimate:
    """One step of ZeRO ``stage`` on ``world`` ranks. ``keep_gathered``: stage 3 that keeps a
    layer's gathered parameters from its forward to its backward (FSDP2's
    ``reshard_after_forward=False``: no backward gather). ``reduce_each_micro``: under
    ``grad_accum`` the gradients are reduce-scattered after every micro-step (ZeRO stages 2–3),
    else after the last only (stage 1, FSDP2's ``set_requires_gradient_sync(False)``)."""
    n, cl, layers = scene.layers, scene.cluster, scene.profile.layers
    ranks = range(world)
    k = scene.grad_accum
    micro = scene.batch / world / k
    kp, kg, _ = scene.state  # bytes per fp32 parameter byte: the parameters' and gradients' widths
    p = scene.profile.param_bytes
    f0, extra = scene.pass_fb(0, 0, micro, busy=world)
    fb = [scene.layer_fb(i, micro, busy=world) for i in range(n)]
    again = stage == 3 and not keep_gathered  # gathered again for backward
    gathers = [group_allgather_s(kp * r.param_bytes, ranks, cl) if stage == 3 else 0.0 for r in layers]
    f, _ = _on_one_link([x[0] for x in fb], gathers, [0.0] * n, prefetch)
    f += f0
    b = [x[1] for x in reversed(fb)]  # backward order: last layer first
    b[0] += extra
    grads = [kg * layers[n - 1 - j].param_bytes for j in range(n)]
    back_gathers = list(reversed(gathers)) if again else [0.0] * n
    if stage == 3:  # a ring reduce-scatter costs what a ring all-gather of the same bytes does
        reduces = [group_allgather_s(g, ranks, cl) for g in grads]
        last, busy = _on_one_link(b, back_gathers, reduces, prefetch)
        units = sum(1 for g in grads if g)
        between = _on_one_link(b, back_gathers, reduces if reduce_each_micro else [0.0] * n, prefetch)[0]
    else:
        bucket = int(bucket_mb * 2**20)
        last, buckets = ddp_overlap(0.0, [(x, int(g)) for x, g in zip(b, grads, strict=True)],
                                    lambda s: allreduce_s(s, ranks, cl) / 2, bucket)
        busy, units = sum(u.end_s - u.start_s for u in buckets), len(buckets)
        between = last if reduce_each_micro else sum(b)
    opt = scene.optimizer_s(p / world)
    gather_all = group_allgather_s(kp * p, ranks, cl) if stage < 3 else 0.0
    done = (k - 1) * (f + between) + f + last
    spans = [Span(0, "compute", "forward", 0.0, f, "F"), Span(0, "compute", "backward", f, f + sum(b), "B"),
             Span(0, "comm", "comm", f, f + last, "gathers and reduce-scatters" if stage == 3
                  else "reduce-scatters"),
             Span(0, "compute", "optimizer", done, done + opt)]
    if gather_all:
        spans.append(Span(0, "comm", "comm", done + opt, done + opt + gather_all, "all-gather"))
    # bytes every rank contributes per step (each collective moves (W−1)/W of it per rank)
    gathered = k * (2 if again else 1) * kp * p if stage == 3 else kp * p
    moved = gathered + (k if reduce_each_micro else 1) * kg * p
    reduce_s = busy - (sum(back_gathers) if stage == 3 else 0.0)  # a micro-step's reduce-scatters
    detail = {"stage": stage, "units": units, "micro_steps": k,
              "compute_s": k * (f0 + sum(x[0] for x in fb) + sum(b)),
              "gathers_s": k * (sum(gathers) + sum(back_gathers)) + gather_all,
              "reduce_scatters_s": (k if reduce_each_micro else 1) * reduce_s}
    return Estimate(done + opt + gather_all,
                    _memory(scene, world, stage, bucket_mb, prefetch, keep_gathered,
                            accumulates=stage == 3 and k > 1 and not reduce_each_micro),
                    (world - 1) * moved, ring_nic_bytes(moved, world, cl) / 2, tuple(spans), detail)


def _memory(scene: Scene, world: int, stage: int, bucket_mb: float, prefetch: bool,
            keep_gathered: bool, accumulates: bool = False) -> int:
    layers = scene.profile.layers
    fp32 = scene.profile.param_bytes
    kp, kg, ko = scene.state  # bytes per fp32 parameter byte (`cost.memory.state_bytes`)
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
    if accumulates:  # gradient sync off between micro-steps: the full gradient accumulates
        transient += g
    return scene.memory((p + g + k) / world, transient, act)
