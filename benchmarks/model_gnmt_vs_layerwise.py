"""(a) `gnmt` (wave-front over time chunks) vs `layerwise` (whole batch per stage) on the same
seq2seq-lstm, the same 4-stage cut (2,2,1,2) and data: throughput, speed-up, mean utilisation,
and the largest parameter difference between the two trained models (they must agree).
(b) `layerwise` utilisation on an MLP cut into P stages: one stage computes at a time, so the
utilisations should sum to about 1 (mean about 1/P) — the survey's under-utilisation, measured.

    python benchmarks/model_gnmt_vs_layerwise.py [--steps 20] [--chunks 4,8] [--hidden 128,512]
                                                 [--part gnmt|util|both]

All ranks share this machine's cores (4 ranks on 2 cores here), so the wave-front can at best
keep two stages busy at once; chunking also adds per-chunk overhead (smaller LSTM calls, more
messages), which the wider model amortises.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

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


def gnmt_rows(steps: int, chunk_counts: list[int], hidden: int, tmp: Path) -> list[dict[str, object]]:
    tmp = tmp / f"h{hidden}"
    base = train("layerwise", 4, "seq2seq-lstm", "chars", steps, 32, [*s2s(hidden), "partition=2,2,1,2"],
                 tmp / "layerwise")
    rows = [{"hidden": hidden, "strategy": "layerwise", "chunks/side": "-",
             "samples/s": base["throughput_samples_per_s"],
             "speed-up": 1.0, "mean utilisation": base["strategy_metrics"]["mean_utilisation"],  # type: ignore[index]
             "max param gap vs layerwise": 0.0}]
    for c in chunk_counts:
        s = train("gnmt", 4, "seq2seq-lstm", "chars", steps, 32, [*s2s(hidden), f"chunks={c}"],
                  tmp / f"gnmt{c}")
        rows.append({"hidden": hidden, "strategy": "gnmt", "chunks/side": c,
                     "samples/s": s["throughput_samples_per_s"],
                     "speed-up": s["throughput_samples_per_s"] / base["throughput_samples_per_s"],  # type: ignore[operator]
                     "mean utilisation": s["strategy_metrics"]["mean_utilisation"],  # type: ignore[index]
                     "max param gap vs layerwise": max_param_gap(tmp / f"gnmt{c}", tmp / "layerwise")})
    return rows


def utilisation_rows(steps: int, tmp: Path) -> list[dict[str, object]]:
    rows = []
    for p in (2, 4):
        # P equal hidden layers of 512 (the 64-wide input layer and the head are small)
        s = train("layerwise", p, "mlp", "digits", steps, 256,
                  ["model.hidden=512", f"model.depth={2 * p - 1}"], tmp / f"lw{p}")
        util = s["strategy_metrics"]["utilisation_per_rank"]  # type: ignore[index]
        rows.append({"P": p, "utilisation per rank": ", ".join(f"{u:.2f}" for u in util),
                     "sum": sum(util), "mean": sum(util) / p, "1/P": 1 / p})
    return rows


def main() -> None:
    from harness import write_results

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--chunks", default="4,8")
    ap.add_argument("--hidden", default="128,512")
    ap.add_argument("--part", choices=("gnmt", "util", "both"), default="both")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    if a.part in ("gnmt", "both"):
        rows = [r for h in a.hidden.split(",")
                for r in gnmt_rows(a.steps, [int(c) for c in a.chunks.split(",")], int(h), tmp)]
        write_results("model_gnmt_vs_layerwise", rows, list(rows[0]),
                      notes="seq2seq-lstm layers=2 on chars (T=64), batch 32, 4 ranks on 2 cores (one "
                            "LSTM layer per rank, cut 2,2,1,2), SGD; throughput over the training "
                            "steps. Speed-up is against layerwise of the same width.")
    if a.part == "gnmt":
        return
    util = utilisation_rows(a.steps, tmp)
    write_results("model_layerwise_utilisation", util, list(util[0]),
                  notes="mlp hidden=512 on digits, batch 256; utilisation = time in compute spans / "
                        "wall time of the training loop, per rank.")


if __name__ == "__main__":
    main()
