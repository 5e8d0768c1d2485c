"""`tensor` (polytrain's Megatron f/g operators) vs PyTorch's own DTensor tensor parallelism
(`parallelize_module` with ColwiseParallel on q/k/v and the MLP's fc, RowwiseParallel on both
projections) on the same gpt-mini, data, global batch, optimizer and ranks. Target: throughput
ratio polytrain / DTensor >= 1.0.

    python benchmarks/model_tensor_vs_dtensor.py [--steps 40] [--warmup 5] [--repeats 5] [--tp 2]
        [--widths 64,512]

Equal settings: both sides run OMP_NUM_THREADS = cores / T; throughput on both sides is rank 0's
over steps warmup+1..steps (the first ``--warmup`` steps, DTensor's first-step dispatch setup and
polytrain's first step alike, outside the timer; evaluation and start-up excluded); the same number
of repeats, the two sides alternating within each pair. A size sweep over ``d_model`` (``--widths``):
the small model is dominated by per-op overhead, the wide one by its matmuls.

The DTensor side is this same file run under torchrun with --dtensor; it also prints its losses,
and the benchmark checks they equal polytrain's (the same computation, split the same way).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

MODEL = {"n_layer": 2, "d_model": 64, "n_head": 4}
BATCH, LR, SEED = 32, 0.1, 0


def model_of(width: int) -> dict[str, int]:
    return {**MODEL, "d_model": width}


def _threads(tp: int) -> str:
    return str(max(1, (os.cpu_count() or 1) // tp))


def dtensor_worker(steps: int, warmup: int, width: int) -> None:
    """One rank of the DTensor run (under torchrun): prints samples/s and losses on rank 0."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from polytrain.data import load_dataset, task_loss
    from polytrain.models import build_model
    from polytrain.runtime.batches import GlobalBatches

    dist.init_process_group("gloo")
    tp, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (tp,))
    data = load_dataset("chars", {}, seed=SEED)
    torch.manual_seed(SEED)
    model = build_model("gpt-mini", data.spec, model_of(width))
    for name, child in model.named_children():
        if not name.startswith("block"):
            continue
        plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                "attn.proj": RowwiseParallel(), "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}
        parallelize_module(child, mesh, plan)
        # the attention counts its heads from q.out_features: give it the local count
        child.attn.q.out_features //= tp
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    batches = GlobalBatches(data.x_train, data.y_train, BATCH, SEED)
    losses = []
    dist.barrier()
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        if step == warmup + 1:
            t0 = time.perf_counter()
        x, y = batches.shard(step)
        opt.zero_grad(set_to_none=True)
        loss = task_loss(data.spec, model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    wall = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"samples_per_s": (steps - warmup) * BATCH / wall, "losses": losses}))
    dist.destroy_process_group()


def run_dtensor(tp: int, steps: int, warmup: int, width: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": _threads(tp)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp),
           str(Path(__file__).resolve()), "--dtensor", "--steps", str(steps), "--warmup", str(warmup),
           "--widths", str(width)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads([x for x in out.splitlines() if x.startswith("{")][-1])  # type: ignore[no-any-return]


def run_polytrain(tp: int, steps: int, warmup: int, width: int) -> tuple[float, list[float]]:
    import polytrain

    os.environ["OMP_NUM_THREADS"] = _threads(tp)
    sets = [f"model.{k}={v}" for k, v in model_of(width).items()]
    with tempfile.TemporaryDirectory() as tmp:
        polytrain.train(strategy="tensor", procs=tp, model="gpt-mini", dataset="chars", steps=steps,
                            batch_size=BATCH, optimizer="sgd", lr=LR, seed=SEED, sets=sets,
                            out=f"{tmp}/run")
        lines = Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()
        events = [json.loads(x) for x in lines if '"event": "step"' in x and '"rank": 0' in x]
    losses = [e["loss"] for e in events]
    ends = {e["step"]: e["t"] for e in events}
    return (steps - warmup) * BATCH / (ends[steps] - ends[warmup]), losses


def main() -> None:
    from harness import alternating, fmt_spread, write_results

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tp", default="2")
    p.add_argument("--widths", default="64,512", help="d_model values of the sweep")
    p.add_argument("--dtensor", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.dtensor:
        dtensor_worker(a.steps, a.warmup, int(a.widths))
        return
    rows, raw = [], {}
    for tp in (int(t) for t in a.tp.split(",")):
        for width in (int(w) for w in a.widths.split(",")):
            runs: dict[str, list[float]] = {"dtensor": [], "polytrain": []}
            gap = 0.0
            theirs_losses: list[float] = []
            for _, side in alternating(["dtensor", "polytrain"], a.repeats):
                if side == "dtensor":
                    d = run_dtensor(tp, a.steps, a.warmup, width)
                    runs["dtensor"].append(float(d["samples_per_s"]))  # type: ignore[arg-type]
                    theirs_losses = d["losses"]  # type: ignore[assignment]
                else:
                    o, ours_losses = run_polytrain(tp, a.steps, a.warmup, width)
                    runs["polytrain"].append(o)
                if theirs_losses and runs["polytrain"]:
                    gap = max(gap, max(abs(x - y) for x, y in zip(ours_losses, theirs_losses, strict=True)))
                print(side, tp, width, runs[side][-1], flush=True)
            paired = [o / d for o, d in zip(runs["polytrain"], runs["dtensor"], strict=True)]
            raw[f"T={tp} d_model={width}"] = runs
            rows.append({"T": tp, "d_model": width, "DTensor samples/s": fmt_spread(runs["dtensor"], 0),
                         "polytrain tensor samples/s": fmt_spread(runs["polytrain"], 0),
                         "paired ratio": fmt_spread(paired, 3), "max loss gap": gap})
    write_results("model_tensor_vs_dtensor", rows, list(rows[0]), extra={"repeats": raw},
                  notes=f"gpt-mini (n_layer {MODEL['n_layer']}, n_head {MODEL['n_head']}, d_model as "
                        f"listed), chars (T=64), global batch {BATCH}, SGD lr {LR}; {a.repeats} pairs of "
                        f"runs of {a.steps} steps, the order alternating; throughput of rank 0 over "
                        f"steps {a.warmup + 1}..{a.steps} on both sides; both OMP_NUM_THREADS = cores / T; "
                        "gloo on CPU. Median (min–max); paired ratio: polytrain / DTensor within a pair. "
                        "Measured on the shared 2-vCPU development machine with other jobs running "
                        "(load average in the JSON).")


if __name__ == "__main__":
    main()
