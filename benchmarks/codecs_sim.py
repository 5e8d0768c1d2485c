"""Does a codec train, in one process: W simulated ranks on gpt-mini with SGD, no network.

    .venv/bin/python benchmarks/codecs_sim.py [--steps 100] [--lr 0.3] [--cases "none,topk+onebit flat,..."]

Each step draws a global batch of 64 ``chars`` windows; rank r of W = 4 computes the gradient of
its 16, encodes it with its own :class:`~polytrain.comm.codecs.engine.Engine` (ratio 1 %, error
feedback on, no entropy coding: it does not change what is decoded) as ``allreduce`` does — one
flat unit per model (``flat``) or one per parameter (``per-parameter``, how every codec encoded
before flat encoding) — and the mean of the decoded gradients is the update: SGD with momentum
0.9, or plain SGD for ``dgc`` (its momentum correction keeps the momentum). Records the training
loss (rank 0's batch) every 20 steps and whether it diverged. A diagnosis of stability, not a
timing: one seed, one process.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import write_results  # noqa: E402

from polytrain.comm.codecs.engine import Engine  # noqa: E402
from polytrain.comm.exchange import Item, Unit, units  # noqa: E402
from polytrain.comm.options import CodecOptions  # noqa: E402
from polytrain.data import load_dataset, task_loss  # noqa: E402
from polytrain.models.registry import build_model  # noqa: E402

WORLD = 4


def train(codec: str, flat: bool, steps: int, lr: float) -> list[tuple[int, float]]:
    ds = load_dataset("chars", {}, seed=0)
    torch.manual_seed(0)
    model = build_model("gpt-mini", ds.spec, {})
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    opt = torch.optim.SGD(params, lr=lr, momentum=0.0 if codec.startswith("dgc") else 0.9)
    engines = ([Engine.from_options(CodecOptions(compression=codec, ratio=0.01, dgc_warmup=25), WORLD, r, 0)
                for r in range(WORLD)] if codec != "none" else [])
    gen = torch.Generator().manual_seed(0)
    losses: list[tuple[int, float]] = []
    for step in range(steps):
        idx = torch.randint(len(ds.x_train), (16 * WORLD,), generator=gen)
        mean = [torch.zeros_like(p) for p in params]
        first = 0.0
        for r in range(WORLD):
            model.zero_grad()
            part = idx[16 * r : 16 * (r + 1)]
            loss = task_loss(ds.spec, model(ds.x_train[part]), ds.y_train[part])
            loss.backward()
            first = float(loss.detach()) if r == 0 else first
            grads = [p.grad.detach().clone() for p in params if p.grad is not None]
            if not engines:
                for m, g in zip(mean, grads, strict=True):
                    m.add_(g, alpha=1 / WORLD)
                continue
            e = engines[r]
            items = [Item(i, n, g) for i, (n, g) in enumerate(zip(names, grads, strict=True))]
            for u in units(e, items) if flat else [Unit([it]) for it in items]:
                dec = e.decode(u.first.index, u.name, u.encode(e), u.shape, parts=u.parts)
                for it, d in zip(u.items, u.split(dec), strict=True):
                    mean[it.index].add_(d.view_as(mean[it.index]), alpha=1 / WORLD)
            for it in items:
                e.done(it.index)
        for p, m in zip(params, mean, strict=True):
            p.grad = m
        opt.step()
        if step % 20 == 0 or step == steps - 1 or not math.isfinite(first):
            losses.append((step, first))
            print(codec, "flat" if flat else "per-parameter", step, round(first, 3), flush=True)
        if not math.isfinite(first):
            break
    return losses


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--cases", default="none flat,topk flat,topk+onebit flat,topk+onebit per-parameter,"
                                      "dgc+onebit flat")
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for case in a.cases.split(","):
        codec, layout = case.split()
        losses = train(codec, layout == "flat", a.steps, a.lr)
        last = losses[-1][1]
        rows.append({"codec": codec, "layout": layout,
                     "training loss every 20 steps": " ".join(f"{s}:{v:.3g}" for s, v in losses),
                     "outcome": f"diverged at step {losses[-1][0]}" if not math.isfinite(last) or last > 10
                     else f"trains (loss {last:.3f} at step {losses[-1][0]})"})
    write_results("codecs_sim", rows, list(rows[0]),
                  notes=f"gpt-mini on chars, {WORLD} simulated ranks × 16, lr {a.lr}, {a.steps} steps, "
                        "seed 0, ratio 1 %, error feedback on; SGD momentum 0.9 (dgc: plain SGD, momentum "
                        "correction 0.9, warm-up over 25 encodings). One process, one thread.")


if __name__ == "__main__":
    main()
