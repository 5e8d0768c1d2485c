"""What ``--precision bf16`` does to the bytes a split model sends: fp32 vs bf16 on a pipeline,
tensor parallelism and dp x pp, the bytes counted as sent per optimizer step.

    python benchmarks/precision_wire.py [--steps 4] [--lock none]

Bytes are counted by polytrain's communicator as each message is sent, so they do not depend on
the machine or its load: one run per case. ``stage bytes/step``: what rank 0 sends per step
through the op that carries the model's activations (``activation`` from a pipeline's first
stage: its activations forward; ``tp_allreduce`` for tensor parallelism: the f/g all-reduces, both
directions), next to the step's other training traffic (gradient all-reduces between replicas,
the found-inf flags, the clipping norm). Evaluation traffic (fp32) is left out.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import add_common_flags, hold_lock, write_results  # noqa: E402

GPT: dict[str, Any] = {"model": "gpt-mini", "dataset": "chars", "batch_size": 16, "optimizer": "sgd",
                       "lr": 0.1, "model_options": {"n_layer": 2, "n_head": 2, "d_model": 32},
                       "data_options": {"seq_len": 32, "chars": 50_000}}
MLP: dict[str, Any] = {"model": "mlp", "dataset": "digits", "batch_size": 64, "optimizer": "sgd",
                       "lr": 0.1}
# (case, job, strategy, procs, sets, the op carrying the split model's activations)
CASES: list[tuple[str, dict[str, Any], str, int, list[str], str]] = [
    ("1f1b, 2 stages, gpt-mini", GPT, "1f1b", 2, ["microbatches=4"], "activation"),
    ("tensor, 2 shards, gpt-mini", GPT, "tensor", 2, [], "tp_allreduce"),
    ("mesh dp 2 x pp 2, mlp", MLP, "mesh", 4, ["dp=2", "pp=2"], "activation"),
]
TRAINING_OPS = ("dp_allreduce", "found_inf", "clip_norm", "replica_allreduce")


def run(case: tuple[str, dict[str, Any], str, int, list[str], str], precision: str, steps: int,
        out: Path) -> dict[str, Any]:
    import polytrain

    name, job, strategy, procs, sets, op = case
    summary = polytrain.train(**(job | {"strategy": strategy, "procs": procs, "sets": sets,
                                        "steps": steps, "precision": precision, "report": False,
                                        "out": str(out / f"{strategy}-{precision}")}))
    sent = summary["per_rank"][0]["bytes_by_op"]
    return {"case": name, "precision": precision, "op": op,
            "stage bytes/step": round(sent.get(op, 0) / steps),
            "other training bytes/step": round(sum(sent.get(o, 0) for o in TRAINING_OPS) / steps),
            "final loss": round(float(summary["final_loss"]), 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    add_common_flags(ap)
    args = ap.parse_args()
    hold_lock(args.lock)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            pair = [run(case, p, args.steps, Path(tmp)) for p in ("fp32", "bf16")]
            for row in pair:
                row["vs fp32"] = f"{row['stage bytes/step'] / pair[0]['stage bytes/step']:.3f}x"
            rows += pair
    notes = ("Bytes counted as sent by rank 0 (its first stage, or its tensor shard), per optimizer "
             "step, training only. A pipeline sends its activations (and receives their "
             "gradients) in the compute dtype: bf16 halves them, up to each message's 24-byte "
             "header. Tensor parallelism's forward all-reduces carry bf16, its backward ones the "
             "gradient of LayerNorm's output, which autocast keeps fp32, hence about 3/4. Gradient "
             "all-reduces between replicas stay fp32 (fp32 master gradients); bf16 adds no "
             "found-inf traffic (fp16 does: 4 bytes per rank and step).")
    write_results("precision_wire", rows, ["case", "precision", "op", "stage bytes/step", "vs fp32",
                                           "other training bytes/step", "final loss"], notes)


if __name__ == "__main__":
    main()
