"""Measured pipeline bubble of gpipe and 1f1b against the textbook (P-1)/(M+P-1).

The bubble is measured from the run's own timeline (idle stage-time / (stages x wall) per
mini-batch, see polytrain/strategies/pipeline/metrics.py). Balanced stages, two models: ``narrow``
(benchmarks/bubble_model.py: two 1.1 M multiply-add halves joined by a 64-float cut, so transfers
are nearly free, as the formula assumes) and ``wide`` (mlp with three hidden layers of width 1024,
cut after the second: 1.06 M vs 1.01 M multiply-adds, 1024 floats per sample cross the cut).
One rank per core: P=2 on the 2-core dev box. ``--stages 4`` runs P=4 (narrow only: four
blocks, ``model.stages=4``); on 2 cores the four ranks time-share them, which the replayed
bubble sees (the compute seconds each action took, preemption included) and the corrected
figure subtracts.

Runtime vs schedule. ``bubble_schedule`` replays the same schedule with the compute seconds each
action actually took in that run, free messages and no runtime (metrics.schedule_bubble): the
bubble the schedule itself implies for the compute this machine delivered (stage imbalance and
compute jitter included). measured - schedule = what the runtime and the transfers added.
``bubble_corrected`` = measured - (schedule - theory): the measured bubble less the compute-time
imbalance the replay attributes to the compute itself; its gap to theory is the runtime's share.

Micro-batch size. With ``--batch-size B`` the mini-batch is fixed and split M ways, so each action
shrinks as M grows (128 samples at B=1024, M=8) and the runtime's fixed cost per action (a message
packed, posted and received, ~0.1-0.5 ms on 2 cores) weighs more at large M. With
``--microbatch-size b`` every action does the same work at every M (B = b x M), which is how a
pipeline is run in practice (M raised at a fixed micro-batch to shrink the bubble).

    python benchmarks/pipeline_bubble.py [--steps 12] [--batch-size 1024 | --microbatch-size 512]
                                          [--microbatches 1,2,4,8] [--repeats 3]
                                          [--models narrow,wide] [--name NAME] [--stages 2]
    python benchmarks/pipeline_bubble.py --stages 4 --microbatches 1,2,3,4,5,6,7,8 --microbatch-size 256 \
        --repeats 5 --steps 10 --models narrow --strategies gpipe --name pipeline_bubble_p4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from harness import alternating, fmt_spread, write_results  # noqa: E402

# name -> (model, sets, what crosses the cut per sample)
MODELS = {
    "narrow": ("benchmarks.bubble_model:make", ["partition=6,6"], "64 floats"),
    "wide": ("mlp", ["model.depth=3", "model.hidden=1024", "partition=2,2"], "1024 floats"),
}


def batch_size(args: argparse.Namespace, microbatches: int) -> int:
    """The mini-batch of a run: ``--microbatch-size`` x M when given (every action does the same work
    as M grows), else the fixed ``--batch-size`` split M ways."""
    return args.microbatch_size * microbatches if args.microbatch_size else args.batch_size


def model_sets(model: str, stages: int) -> tuple[str, list[str]]:
    """The model and its sets for ``stages`` stages (narrow: one block per stage)."""
    name, sets, _ = MODELS[model]
    if stages == 2:
        return name, sets
    if model != "narrow":
        raise SystemExit(f"--stages {stages}: only the narrow model has a {stages}-stage form")
    return name, [f"model.stages={stages}", "partition=" + ",".join(["6"] * stages)]


def one_run(model: str, strategy: str, microbatches: int, steps: int, batch: int,
            out: Path, stages: int = 2) -> dict[str, Any]:
    import polytrain

    name, sets = model_sets(model, stages)
    summary = polytrain.train(
        strategy=strategy,
        procs=stages,
        model=name,
        dataset="digits",
        steps=steps,
        batch_size=batch,
        optimizer="momentum",
        lr=0.01,
        timeout_s=float(os.environ.get("BUBBLE_TIMEOUT_S", "60")),
        out=str(out),
        sets=[*sets, f"microbatches={microbatches}"],
    )
    return summary.to_dict()


def measure(model: str, strategy: str, microbatches: int, args: argparse.Namespace,
            runs: list[dict[str, Any]]) -> dict[str, object]:
    """One row from repeated runs: median (min–max), and the least disturbed (lowest bubble) one."""
    bubbles = [r["strategy_metrics"]["bubble_fraction"] for r in runs]
    best = runs[bubbles.index(min(bubbles))]
    m = best["strategy_metrics"]
    theory = m["bubble_fraction_theory"]
    waiting = m["bubble_fraction"] - m["overhead_fraction"]
    replayed = [r["strategy_metrics"]["bubble_fraction_schedule"] for r in runs]
    corrected = [b - (sch - theory) for b, sch in zip(bubbles, replayed, strict=True)]
    ops = m["op_s_per_stage"]
    per_step = statistics.median(r["strategy_metrics"]["bubble_fraction_median"] for r in runs)
    gap = (lambda v: (v - theory) / theory if theory else float("nan"))  # noqa: E731
    return {
        "model": model,
        "cut carries": MODELS[model][2],
        "strategy": strategy,
        "P": m["stages"],
        "M": microbatches,
        "batch": batch_size(args, microbatches),
        "repeats": len(runs),
        "bubble_best": min(bubbles),
        "bubble_median": statistics.median(bubbles),
        "bubble": fmt_spread(bubbles),
        "bubble_theory": theory,
        "relative_gap_best": gap(min(bubbles)),
        "raw_gap_median": gap(statistics.median(bubbles)),
        "bubble_corrected": fmt_spread(corrected),
        "corrected_gap_median": gap(statistics.median(corrected)),
        "corrected_gaps": [gap(c) for c in corrected],
        "per_step_median": per_step,
        "per_step_median_gap": gap(per_step),
        "overhead_best": m["overhead_fraction"],
        "dependency_bubble_best": waiting,
        "dependency_gap_best": gap(waiting),
        "bubble_schedule_best": m["bubble_fraction_schedule"],
        "bubble_schedule_median": statistics.median(replayed),
        "bubble_schedule": fmt_spread(replayed),
        "runtime_share_best": min(bubbles) - m["bubble_fraction_schedule"],
        "F_ms_per_stage": "/".join(f"{1000 * o['F']:.1f}" for o in ops),
        "B_ms_per_stage": "/".join(f"{1000 * o['B']:.1f}" for o in ops),
        "busy_s_per_stage": m["busy_s_per_stage"],
        "samples_per_s_best": best["throughput_samples_per_s"],
        "bubbles": bubbles,
        "replayed": replayed,
        "load_avg": [r["load_avg"] for r in runs],
        "load": fmt_spread([r["load_avg"] for r in runs], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--microbatch-size", type=int, default=0,
                    help="fixed micro-batch size: batch = this x M (overrides --batch-size)")
    ap.add_argument("--microbatches", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="narrow,wide")
    ap.add_argument("--strategies", default="gpipe,1f1b")
    ap.add_argument("--name", default="pipeline_bubble", help="results file name")
    ap.add_argument("--stages", type=int, default=2, help="pipeline stages P = ranks (4: narrow only)")
    args = ap.parse_args()
    cells = [(model, strategy, int(m)) for model in args.models.split(",")
             for strategy in args.strategies.split(",") for m in args.microbatches.split(",")]
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = {c: [] for c in cells}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (model, strategy, m) in alternating(cells, args.repeats):  # load drift hits all alike
            out = Path(tmp) / f"{model}-{strategy}-m{m}-{i}"
            run = one_run(model, strategy, m, args.steps, batch_size(args, m), out, args.stages)
            run["load_avg"] = os.getloadavg()[0]
            runs[(model, strategy, m)].append(run)
            sm = run["strategy_metrics"]
            print(f"repeat {i} {model} {strategy} M={m}: bubble {sm['bubble_fraction']:.3f} replayed "
                  f"{sm['bubble_fraction_schedule']:.3f} load {run['load_avg']:.1f}", flush=True)
    rows = [measure(model, strategy, m, args, runs[(model, strategy, m)]) for model, strategy, m in cells]
    notes = (
        "bubble: idle / (stages x wall) from the recorded forward/backward spans, summed over "
        f"mini-batches; median (min–max) and best of {args.repeats} interleaved runs (the host is "
        "shared: a descheduled rank shows up as bubble). bubble_corrected = bubble - "
        "(bubble_schedule - bubble_theory), per run: the measured bubble less the compute-time "
        "imbalance the replay finds; corrected_gap_median = its median's gap to theory; "
        "raw_gap_median = the raw median's. load: 1-min load average after each run. "
        "bubble_theory: (P-1)/(M+P-1). The gap is what the formula leaves out: "
        "transfers and waits for them, Python overhead per action, residual imbalance, a shared host. "
        "overhead: the part of the bubble that is the runtime's own time between actions (neither "
        "compute nor waiting for a message); dependency_bubble = bubble - overhead: the idle time the "
        "schedule's dependencies cause, which is what the formula models. per_step_median: the median "
        "over mini-batches of each mini-batch's own bubble (robust to a step the host stalled). "
        "bubble_schedule: the same schedule replayed with the compute seconds every action took in "
        "that run, free messages, no runtime (best run and median of runs): what the schedule "
        "implies for this machine's compute, stage imbalance and jitter included; runtime_share = "
        "bubble_best - bubble_schedule_best, the runtime's and the transfers' part. F_ms/B_ms: "
        "median compute ms of a forward/backward per stage (stage 0/stage 1) in the best run."
    )
    cols = [
        "model",
        "cut carries",
        "strategy",
        "P",
        "M",
        "batch",
        "repeats",
        "bubble_theory",
        "bubble",
        "raw_gap_median",
        "bubble_schedule",
        "bubble_corrected",
        "corrected_gap_median",
        "load",
        "bubble_best",
        "relative_gap_best",
        "bubble_schedule_best",
        "runtime_share_best",
        "per_step_median",
        "per_step_median_gap",
        "overhead_best",
        "dependency_bubble_best",
        "dependency_gap_best",
        "F_ms_per_stage",
        "B_ms_per_stage",
        "samples_per_s_best",
    ]
    write_results(args.name, rows, cols, notes)


if __name__ == "__main__":
    main()
