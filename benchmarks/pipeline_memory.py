"""Peak memory per stage of gpipe, gpipe with re-materialisation, 1f1b and pipedream on one job.

Activation bytes are what autograd keeps between a micro-batch's forward and its backward
(counted with saved-tensor hooks, plus the stashed stage input and output); pipedream adds its
stashed weight versions. Same model, data, partition, P and M for all.

    python benchmarks/pipeline_memory.py [--procs 2] [--microbatches 8] [--batch-size 256]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from harness import write_results  # noqa: E402

CASES = [
    ("gpipe", ["checkpoint=never"]),
    ("gpipe", ["checkpoint=except_last"]),
    ("gpipe", ["checkpoint=always"]),
    ("1f1b", ["checkpoint=never"]),
    ("pipedream", []),
]


def _kib(values: list[int]) -> str:
    return " / ".join(f"{v / 1024:,.0f}" for v in values)


def measure(strategy: str, sets: list[str], args: argparse.Namespace, root: Path) -> dict[str, object]:
    import polytrain

    flush = strategy != "pipedream"
    extra = [f"microbatches={args.microbatches}"] if flush else []
    out = root / f"{strategy}-{len(sets)}-{sets[0] if sets else ''}"
    summary = polytrain.train(
        strategy=strategy,
        procs=args.procs,
        model="mlp",
        dataset="digits",
        steps=args.steps,
        batch_size=args.batch_size if flush else args.batch_size // args.microbatches,
        optimizer="momentum",
        lr=0.01,
        out=str(out),
        sets=["model.depth=3", "model.hidden=1024", *sets, *extra],
    )
    m = summary["strategy_metrics"]
    return {
        "strategy": strategy,
        "checkpoint": m["checkpoint"] if flush else "-",
        "unit": f"micro-batch of {args.batch_size // args.microbatches}",
        "peak_in_flight": " / ".join(map(str, m["peak_in_flight_per_stage"])),
        "activation_KiB": _kib(m["peak_activation_bytes_per_stage"]),
        "stash_KiB": _kib(m.get("stash_bytes_peak_per_stage", [0] * args.procs)),
        "peak_KiB": _kib(m["peak_memory_bytes_per_stage"]),
        "activation_bytes_per_stage": m["peak_activation_bytes_per_stage"],
        "peak_bytes_per_stage": m["peak_memory_bytes_per_stage"],
        "peak_rss_bytes": summary["peak_rss_bytes"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(s, sets, args, Path(tmp)) for s, sets in CASES]
    notes = (
        f"P={args.procs}, mlp depth 3 width 1024, global batch {args.batch_size} in "
        f"{args.microbatches} micro-batches for gpipe/1f1b; pipedream streams mini-batches of the "
        "micro-batch size (its unit of work), so all rows hold units of the same size. Values per "
        "stage (stage 0 / stage 1 / ...). The stash of pipedream counts every kept weight version "
        "(the current one included) besides the live parameters."
    )
    cols = ["strategy", "checkpoint", "unit", "peak_in_flight", "activation_KiB", "stash_KiB", "peak_KiB"]
    write_results("pipeline_memory", rows, cols, notes)


if __name__ == "__main__":
    main()
