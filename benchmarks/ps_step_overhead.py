"""CPU cost of the shared loop's per-step work on a ``ps`` worker, against its compute.

The job of ``pipeline_runtime_ab.py --strategies ps`` (mlp 3×256 on digits, batch 64, 2 workers:
32 samples each): a worker's forward+backward, the divergence check as it was (``isfinite`` per
parameter tensor) and as it is (:func:`polytrain.runtime.divergence.all_finite`: a sum per
tensor), and the loop's tail after a step — the base tree's own ps loop recorded the step only;
the shared loop also checks the parameters, samples resources and reads the stop flag. Thread
CPU time (``time.thread_time``) per call, the fastest of ``--inner`` batches of ``--number``
calls in each repeat (CPU time hardly moves with the machine's load, wall time does); reported:
median (min–max) over ``--repeats``.

    python benchmarks/ps_step_overhead.py --repeats 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import fmt_spread, write_results  # noqa: E402

from polytrain.data import dataset_spec  # noqa: E402
from polytrain.metrics.recorder import Recorder  # noqa: E402
from polytrain.models import resolve_model  # noqa: E402
from polytrain.runtime import interrupt  # noqa: E402
from polytrain.runtime.divergence import all_finite, check_finite  # noqa: E402


def isfinite_check(tensors: Iterable[torch.Tensor | None]) -> bool:
    """The check before the change: one ``isfinite(...).all()`` per tensor."""
    flags = [torch.isfinite(t.detach()).all() for t in tensors if t is not None]
    return bool(torch.stack(flags).all()) if flags else True


def cpu_us(f: Callable[[], Any], number: int, inner: int) -> float:
    best = float("inf")
    for _ in range(inner):
        t = time.thread_time()
        for _ in range(number):
            f()
        best = min(best, (time.thread_time() - t) / number)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--number", type=int, default=200)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--name", default="ps_step_overhead")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as each of the 3 ranks on 2 cores gets (OMP_NUM_THREADS=2//3 -> 1)
    torch.manual_seed(1)
    model = resolve_model("mlp", dataset_spec("digits", {}), {"hidden": 256, "depth": 3})
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss_fn = torch.nn.CrossEntropyLoss()
    rec = Recorder(1, Path(tempfile.mkdtemp()) / "rank1.jsonl")
    rec.start_clock()
    step = [0]

    def compute() -> None:
        model.zero_grad(set_to_none=True)
        with rec.span("forward", step=1):
            loss = loss_fn(model(x), y)
        with rec.span("backward", step=1):
            loss.backward()

    def base_tail() -> None:  # the base tree's ps loop after a step: record it
        step[0] += 1
        rec.step(step[0], 0.5, samples=64 * step[0])

    def loop_tail() -> None:  # the shared loop after a step (no checkpoint, no eval, no progress)
        step[0] += 1
        check_finite(step[0], 0.5, model)
        rec.step(step[0], 0.5, samples=64 * step[0])
        rec.sample_resources(step=step[0])
        interrupt.stop_after(step[0], 10**9)

    cases: dict[str, Callable[[], Any]] = {
        "forward+backward (32 samples)": compute,
        "isfinite check (before)": lambda: isfinite_check(model.parameters()),
        "sum check (all_finite now)": lambda: all_finite(model.parameters()),
        "base ps loop tail": base_tail,
        "shared loop tail (now)": loop_tail,
    }
    per: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.repeats):
        for k, f in cases.items():
            per[k].append(cpu_us(f, args.number, args.inner))
    rec.close()
    rows = [{"case": k, "cpu_us_per_call": fmt_spread(v, 1), "values": v} for k, v in per.items()]
    notes = (f"mlp 3×256 (150,794 parameters in 8 tensors), one thread; thread CPU µs per call, the "
             f"fastest of {args.inner} batches of {args.number} calls per repeat, median (min–max) of "
             f"{args.repeats} repeats. 'base ps loop tail': the tree before issue 16 (its own ps "
             "loop recorded the step); 'shared loop tail': check_finite + step record + resources "
             "sample + stop flag, as polytrain.runtime.loop.run_loop does after each step.")
    write_results(args.name, rows, ["case", "cpu_us_per_call"], notes)


if __name__ == "__main__":
    main()
