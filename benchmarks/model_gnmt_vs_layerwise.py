"""(a) `gnmt` (wave-front over time chunks) vs `layerwise` (whole batch per stage) on the same
seq2seq-lstm, the same 4-stage cut (2,2,1,2) and data: throughput, speed-up, mean utilisation,
and the largest parameter difference between the two trained models (they must agree).
(b) `layerwise` utilisation on an MLP cut into P stages: one stage computes at a time, so the
utilisations should sum to about 1 (mean about 1/P) — the survey's under-utilisation, measured.

    python benchmarks/model_gnmt_vs_layerwise.py [--steps 20] [--chunks 4,8] [--hidden 128,512]
                                                 [--part gnmt|util|both] [--repeats 5]

All ranks share this machine's cores (4 ranks on 2 cores here), so the wave-front can at best
keep two stages busy at once; chunking also adds per-chunk overhead (smaller LSTM calls, more
messages), which the wider model amortises. The variants of a width alternate, the order reversed
every repeat; median (min–max), speed-up paired within a repeat.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

def s2s(hidden: int) -> list[str]:
    return ["model.layers=2", f"model.hidden={hidden}", "data.seq_len=64"]


def train(strategy: str, procs: int, model: str, dataset: str, steps: int, batch: int, sets: list[str],
          out: Path) -> dict[str, object]:
    import polytrain

    return polytrain.train(strategy=strategy, procs=procs, model=model, dataset=dataset, steps=steps,
                           batch_size=batch, optimizer="sgd", lr=0.1, out=str(out), sets=sets)


def max_param_gap(a: Path, b: Path) -> float:
    import torch

    x, y = (torch.load(p / "model.pt", weights_only=True) for p in (a, b))
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def gnmt_rows(steps: int, chunk_counts: list[int], hidden: int, tmp: Path, repeats: int,
              raw: dict[str, Any]) -> list[dict[str, object]]:
    from harness import alternating, fmt_spread

    tmp = tmp / f"h{hidden}"
    variants: list[int | None] = [None, *chunk_counts]  # None: layerwise
    runs: dict[int | None, list[float]] = {v: [] for v in variants}
    util: dict[int | None, list[float]] = {v: [] for v in variants}
    for r, c in alternating(variants, repeats):
        out = tmp / f"{'layerwise' if c is None else f'gnmt{c}'}-{r}"
        sets = [*s2s(hidden), "partition=2,2,1,2" if c is None else f"chunks={c}"]
        s = train("layerwise" if c is None else "gnmt", 4, "seq2seq-lstm", "chars", steps, 32, sets, out)
        runs[c].append(float(s["throughput_samples_per_s"]))  # type: ignore[arg-type]
        util[c].append(float(s["strategy_metrics"]["mean_utilisation"]))  # type: ignore[index]
        print(hidden, c, runs[c][-1], flush=True)
    raw[f"hidden={hidden}"] = {str(k): v for k, v in runs.items()}
    rows: list[dict[str, object]] = []
    for c in variants:
        paired = [x / y for x, y in zip(runs[c], runs[None], strict=True)]
        rows.append({"hidden": hidden, "strategy": "layerwise" if c is None else "gnmt",
                     "chunks/side": "-" if c is None else c, "samples/s": fmt_spread(runs[c], 1),
                     "speed-up (paired)": fmt_spread(paired, 2), "mean utilisation": fmt_spread(util[c], 2),
                     "max param gap vs layerwise": 0.0 if c is None
                     else max_param_gap(tmp / f"gnmt{c}-0", tmp / "layerwise-0")})
    return rows


def utilisation_rows(steps: int, tmp: Path, repeats: int) -> list[dict[str, object]]:
    from harness import alternating, fmt_spread

    means: dict[int, list[float]] = {2: [], 4: []}
    sums: dict[int, list[float]] = {2: [], 4: []}
    for r, p in alternating([2, 4], repeats):
        # P equal hidden layers of 512 (the 64-wide input layer and the head are small)
        s = train("layerwise", p, "mlp", "digits", steps, 256,
                  ["model.hidden=512", f"model.depth={2 * p - 1}"], tmp / f"lw{p}-{r}")
        util = s["strategy_metrics"]["utilisation_per_rank"]  # type: ignore[index]
        sums[p].append(sum(util))
        means[p].append(sum(util) / p)
    return [{"P": p, "sum": fmt_spread(sums[p], 2), "mean": fmt_spread(means[p], 2), "1/P": 1 / p}
            for p in (2, 4)]


def main() -> None:
    from harness import write_results

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--chunks", default="4,8")
    ap.add_argument("--hidden", default="128,512")
    ap.add_argument("--part", choices=("gnmt", "util", "both"), default="both")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    if a.part in ("gnmt", "both"):
        raw: dict[str, Any] = {}
        chunks = [int(c) for c in a.chunks.split(",")]
        rows = [r for h in a.hidden.split(",")
                for r in gnmt_rows(a.steps, chunks, int(h), tmp, a.repeats, raw)]
        write_results("model_gnmt_vs_layerwise", rows, list(rows[0]), extra={"repeats": raw},
                      notes="seq2seq-lstm layers=2 on chars (T=64), batch 32, 4 ranks on 2 cores (one "
                            "LSTM layer per rank, cut 2,2,1,2), SGD; throughput over the training "
                            "steps. Speed-up is against layerwise of the same width in the same repeat; "
                            f"{a.repeats} repeats, the variants alternating; median (min–max).")
    if a.part == "gnmt":
        return
    util = utilisation_rows(a.steps, tmp, a.repeats)
    write_results("model_layerwise_utilisation", util, list(util[0]),
                  notes="mlp hidden=512 on digits, batch 256; utilisation = time in compute spans / "
                        "wall time of the training loop, per rank; sum and mean over ranks, "
                        f"median (min–max) of {a.repeats} repeats, P=2 and P=4 alternating.")


if __name__ == "__main__":
    main()
