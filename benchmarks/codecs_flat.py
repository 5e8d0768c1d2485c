"""Flat encoding against per-parameter encoding: one rank's encode + pack + decode time per step
and bytes, for the codecs on the gradients of a model, in one process (no network).

    .venv/bin/python benchmarks/codecs_flat.py [--repeats 5] [--width 4]

The model is ``vgg16`` at ``model.width=W`` on 32×32 RGB images with 2 classes (the shapes of
the testbed's ``vgg`` job: 13 conv + 3 FC, 32 tensors, all in one 25 MiB DDP bucket). Per
parameter: one :class:`~polytrain.comm.exchange.Unit` per tensor (what every codec did before
flat encoding, and what quantisers did until they took per-segment scales); flat: the units
:func:`~polytrain.comm.exchange.units` makes (one for the bucket). Each step encodes every unit
(error feedback, ``entropy=zstd``), packs it and decodes it once (a real step decodes W ranks'
payloads). Both ways run in one process, interleaved step by step, one torch thread, fixed random
gradients; the first 2 steps of each are warm-up. Median (min–max) over ``--repeats`` steps.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import fmt_spread, write_results  # noqa: E402

from polytrain.comm.codecs.engine import Engine  # noqa: E402
from polytrain.comm.exchange import Item, Unit, units  # noqa: E402
from polytrain.comm.options import CodecOptions  # noqa: E402
from polytrain.models.vgg import BLOCKS, hidden_width  # noqa: E402

CASES = {"topk+onebit 1% zstd": {"compression": "topk+onebit", "ratio": 0.01},
         "topk 1% zstd": {"compression": "topk", "ratio": 0.01},
         "dgc 1% zstd": {"compression": "dgc", "ratio": 0.01},
         "onebit zstd": {"compression": "onebit"},
         "onebit row zstd": {"compression": "onebit", "scale": "row"},
         "qsgd 4 levels zstd": {"compression": "qsgd", "levels": 4},
         "terngrad zstd": {"compression": "terngrad"}}


def vgg_shapes(width: int, classes: int = 2) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    c = 3
    for block in BLOCKS:
        for m in block:
            shapes += [(m * width, c, 3, 3), (m * width,)]
            c = m * width
    h = hidden_width(width, 3)
    return [*shapes, (h, 8 * width * 49), (h,), (h, h), (h,), (classes, h), (classes,)]


def step(engine: Engine, items: list[Item], flat: bool) -> tuple[float, int]:
    t = time.perf_counter()
    us = units(engine, items) if flat else [Unit([it]) for it in items]
    bufs = [u.encode(engine) for u in us]
    for u, b in zip(us, bufs, strict=True):
        engine.decode(u.first.index, u.name, b, u.shape, parts=u.parts)
    for it in items:
        engine.done(it.index)
    return time.perf_counter() - t, sum(b.numel() for b in bufs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--width", type=int, default=4)
    a = p.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    shapes = vgg_shapes(a.width)
    items = [Item(i, f"p{i}", torch.randn(s, generator=gen)) for i, s in enumerate(shapes)]
    rows = []
    for case, opts in CASES.items():
        engines = {flat: Engine.from_options(CodecOptions(entropy="zstd", **opts), 4, 0, 0)  # type: ignore[arg-type]
                   for flat in (False, True)}
        times: dict[bool, list[float]] = {False: [], True: []}
        sizes: dict[bool, int] = {}
        for r in range(a.repeats + 2):
            for flat in ((False, True) if r % 2 == 0 else (True, False)):
                s, n = step(engines[flat], items, flat)
                if r >= 2:
                    times[flat].append(1e3 * s)
                    sizes[flat] = n
        per, flat_ms = times[False], times[True]
        rows.append({"case": case, "per-parameter ms/step": fmt_spread(per, 1),
                     "flat ms/step": fmt_spread(flat_ms, 1),
                     "speed-up": f"{sorted(per)[len(per) // 2] / sorted(flat_ms)[len(flat_ms) // 2]:.1f}x",
                     "per-parameter bytes": f"{sizes[False]:,}", "flat bytes": f"{sizes[True]:,}"})
        print(rows[-1], flush=True)
    n = sum(torch.Size(s).numel() for s in shapes)
    write_results("codecs_flat", rows, list(rows[0]),
                  notes=f"vgg16 width {a.width} gradients ({n:,} entries in {len(shapes)} tensors, one "
                        f"bucket), one rank's encode + pack + decode per step, error feedback and zstd on, "
                        f"one torch thread, {a.repeats} interleaved steps after 2 warm-up; median (min–max).")


if __name__ == "__main__":
    main()
