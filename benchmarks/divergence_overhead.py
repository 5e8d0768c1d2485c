"""What the divergence checks cost a step (issue 50, item 1), in one process, no launch.

Per step the shared loop calls ``DivergenceWatch.observe`` (a few float comparisons); before
each checkpoint and at the end ``check_param_bound`` (one ``amax`` per parameter tensor and one
host sync). Measured here against a plain step (forward, backward, Adam update) of the same
model and batch, so the fraction is what a run pays. Usage::

    python benchmarks/divergence_overhead.py [--repeats 7] [--steps 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import torch  # noqa: E402
from harness import alternating, fmt_spread, spread, write_results  # noqa: E402

from polytrain.config import load_config  # noqa: E402
from polytrain.runtime.divergence import DivergenceWatch, check_param_bound  # noqa: E402
from polytrain.runtime.job import Job  # noqa: E402


def _plain_step_s(job: Job, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> float:
    batches = job.batches()
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        x, y = batches.shard(i, 0, 1)
        opt.zero_grad(set_to_none=True)
        job.loss(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def _observe_s(cfg: object, steps: int) -> float:
    watch = DivergenceWatch(cfg)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        watch.observe(i, 2.0 / i)
    return (time.perf_counter() - t0) / steps


def _bound_s(model: torch.nn.Module, steps: int) -> float:
    t0 = time.perf_counter()
    for i in range(steps):
        check_param_bound(i, model, 1e6, 10)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in ("mlp", "cnn"):
        cfg = load_config(overrides={"model": name, "strategy": "single", "procs": 1})
        job = Job.from_config(cfg)
        model = job.build_model()
        opt = job.make_optimizer(model.parameters())
        times: dict[str, list[float]] = {"step": [], "observe": [], "bound": []}
        for _, what in alternating(list(times), args.repeats):
            if what == "step":
                times[what].append(_plain_step_s(job, model, opt, args.steps))
            elif what == "observe":
                times[what].append(_observe_s(cfg, args.steps * 10))
            else:
                times[what].append(_bound_s(model, args.steps))
        step = spread(times["step"])["median"]
        rows.append({"model": name, "params": sum(p.numel() for p in model.parameters()),
                     "step_ms": fmt_spread([t * 1e3 for t in times["step"]]),
                     "observe_us": fmt_spread([t * 1e6 for t in times["observe"]]),
                     "param_bound_us": fmt_spread([t * 1e6 for t in times["bound"]]),
                     "observe_share_pct": round(100 * spread(times["observe"])["median"] / step, 4),
                     "bound_share_of_one_step_pct": round(100 * spread(times["bound"])["median"] / step, 3),
                     "repeats": {k: v for k, v in times.items()}})
    write_results("divergence_overhead", rows,
                  ["model", "params", "step_ms", "observe_us", "param_bound_us", "observe_share_pct",
                   "bound_share_of_one_step_pct"],
                  notes="Median (min–max) of the repeats, one thread, batch 64 of digits. observe: "
                        "every step; param bound: once per checkpoint and at the end.")


if __name__ == "__main__":
    main()
