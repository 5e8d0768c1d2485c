"""Gradient codecs against uncompressed ``allreduce`` and PyTorch's PowerSGD hook, same job:
time to a target accuracy, throughput, bytes each rank sent per step, the codec's compression
ratio against float32 and its encode+decode time per step.

    .venv/bin/python benchmarks/codecs.py [--procs 2] [--steps 300] [--target 0.9] [--repeats 5]

Every repeat runs every case, the order reversed from repeat to repeat (interleaved); median
(min–max) over repeats. Time to accuracy: the first evaluation (every ``--eval-every`` steps, rank
0) at or above ``--target``, in seconds since the start barrier. Bytes: ``bytes_sent`` of the run
(polytrain's count at each send, every rank, the size exchange of variable-size payloads
included) per rank and step; "bytes reduction" divides uncompressed allreduce's median by the
case's. Ratio vs fp32 and codec time come from the codec's own report (``strategy_metrics.codec``:
float32 bytes of the gradients it was given / bytes of the payloads it produced; encode + decode
seconds on rank 0). SGD with momentum 0.9 everywhere; ``dgc`` keeps the momentum itself
(momentum correction), so its runs use SGD without momentum and ``dgc_momentum=0.9``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import alternating, fmt_spread, spread, write_results  # noqa: E402

CASES: list[tuple[str, tuple[str, ...]]] = [
    ("uncompressed", ()),
    ("powersgd rank 1", ("compression=powersgd", "powersgd_rank=1")),
    ("fp16", ("compression=fp16",)),
    ("topk 1%", ("compression=topk", "ratio=0.01")),
    ("topk+onebit 1% zstd", ("compression=topk+onebit", "ratio=0.01", "entropy=zstd")),
    ("dgc 1%", ("compression=dgc", "ratio=0.01", "dgc_warmup=50")),
    ("qsgd 4 levels", ("compression=qsgd", "levels=4")),
]


def one(label: str, sets: tuple[str, ...], seed: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    import polytrain

    momentum = 0.0 if label.startswith("dgc") else 0.9
    s = polytrain.train(strategy="allreduce", procs=a.procs, model=a.model, dataset="digits",
                        steps=a.steps, batch_size=64, optimizer="sgd", lr=a.lr, momentum=momentum,
                        seed=seed, eval_every=a.eval_every, out=str(out), sets=list(sets), report=False)
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    tta = next((e["t"] for e in evals if e["event"] == "eval" and e["accuracy"] >= a.target), None)
    codec = s["strategy_metrics"].get("codec", {})
    return {"tta_s": tta, "samples_per_s": s["throughput_samples_per_s"], "accuracy": s["eval"]["accuracy"],
            "bytes_per_rank_step": s["bytes_sent"] / a.procs / s["steps"],
            "ratio_vs_fp32": codec.get("ratio_vs_fp32"), "codec_ms": 1e3 * codec.get("codec_s_per_step", 0.0)}


def row(label: str, mine: list[dict[str, Any]], base_bytes: float, target: float) -> dict[str, Any]:
    reached = [r["tta_s"] for r in mine if r["tta_s"] is not None]
    b = spread([r["bytes_per_rank_step"] for r in mine])["median"]
    ratios = [r["ratio_vs_fp32"] for r in mine if r["ratio_vs_fp32"] is not None]
    return {"case": label, f"time to {target:.0%} s": fmt_spread(reached, 2) if reached else "never",
            "reached": f"{len(reached)}/{len(mine)}",
            "samples/s": fmt_spread([r["samples_per_s"] for r in mine], 0),
            "final accuracy": fmt_spread([r["accuracy"] for r in mine], 3),
            "bytes/step/rank": round(b), "bytes reduction": f"{base_bytes / b:.1f}x",
            "payload vs fp32": f"{spread(ratios)['median']:.1f}x" if ratios else "-",
            "codec ms/step": fmt_spread([r["codec_ms"] for r in mine], 2) if ratios else "-"}


def plot(runs: dict[str, list[dict[str, Any]]], target: float) -> None:
    """results/codecs.png: bytes per step and rank (log) against time to the target accuracy,
    one point per repeat, medians larger."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, mine in runs.items():
        pts = [(r["tta_s"], r["bytes_per_rank_step"]) for r in mine if r["tta_s"] is not None]
        if not pts:
            continue
        line = ax.scatter(*zip(*pts, strict=True), s=12, alpha=0.5)
        med = (spread([p[0] for p in pts])["median"], spread([p[1] for p in pts])["median"])
        ax.scatter(*med, s=70, color=line.get_facecolor()[0], label=label, edgecolors="black")
    ax.set_yscale("log")
    ax.set_xlabel(f"time to {target:.0%} test accuracy (s)")
    ax.set_ylabel("bytes sent per step and rank")
    ax.set_title("allreduce codecs, mlp on digits, 2 ranks (loopback)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "results" / "codecs.png", dpi=110)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--model", default="mlp")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cases", default="", help="comma-separated labels to run (default: all)")
    p.add_argument("--plot-only", action="store_true", help="redraw results/codecs.png from codecs.json")
    a = p.parse_args()
    if a.plot_only:
        plot(json.loads((HERE / "results" / "codecs.json").read_text())["repeats"], a.target)
        return
    cases = [c for c in CASES if not a.cases or c[0] in a.cases.split(",")]
    tmp = Path(tempfile.mkdtemp())
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in cases}
    for r, (label, sets) in alternating(cases, a.repeats):
        runs[label].append(one(label, sets, r, a, tmp / f"{label.replace(' ', '_')}-{r}"))
        print(label, runs[label][-1], flush=True)
    base = spread([r["bytes_per_rank_step"] for r in runs[cases[0][0]]])["median"]
    rows = [row(label, mine, base, a.target) for label, mine in runs.items()]
    plot(runs, a.target)
    write_results("codecs", rows, list(rows[0]), extra={"repeats": runs},
                  notes=f"allreduce, {a.model} on digits, {a.procs} ranks on this machine (loopback), "
                        f"batch 64, SGD lr {a.lr} momentum 0.9 (dgc: 0 + dgc_momentum 0.9), {a.steps} "
                        f"steps, seed = repeat, {a.repeats} repeats interleaved. Time to accuracy: first "
                        f"evaluation at or above {a.target} (every {a.eval_every} steps), median (min–max) "
                        "over the repeats that reached it. On loopback the wire is not the bottleneck, "
                        "so the codecs' encode/decode time shows and the bytes do not pay back; the "
                        "testbed at 100 Mbit is where bytes turn into time (not measured here). "
                        "Measured on the shared 2-vCPU development machine with other jobs running "
                        "(load average in the JSON).")


if __name__ == "__main__":
    main()
