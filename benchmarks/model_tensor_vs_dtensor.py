"""`tensor` (polytrain's Megatron f/g operators) vs PyTorch's own DTensor tensor parallelism
(`parallelize_module` with ColwiseParallel on q/k/v and the MLP's fc, RowwiseParallel on both
projections) on the same gpt-mini, data, global batch, optimizer and ranks. Target: throughput
ratio polytrain / DTensor >= 1.0. Throughput is measured over the training steps only (process
start-up and evaluation excluded on both sides); both sides run OMP_NUM_THREADS = cores / T.

    python benchmarks/model_tensor_vs_dtensor.py [--steps 60] [--repeats 3] [--tp 2,4]

The DTensor side is this same file run under torchrun with --dtensor; it also prints its losses,
and the benchmark checks they equal polytrain's (the same computation, split the same way).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def _threads(tp: int) -> str:
    return str(max(1, (os.cpu_count() or 1) // tp))


def dtensor_worker(steps: int) -> None:
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
    model = build_model("gpt-mini", data.spec, MODEL)
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
        x, y = batches.shard(step)
        opt.zero_grad(set_to_none=True)
        loss = task_loss(data.spec, model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    wall = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"samples_per_s": steps * BATCH / wall, "losses": losses}))
    dist.destroy_process_group()


def run_dtensor(tp: int, steps: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": _threads(tp)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp),
           str(Path(__file__).resolve()), "--dtensor", "--steps", str(steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads([x for x in out.splitlines() if x.startswith("{")][-1])  # type: ignore[no-any-return]


def run_polytrain(tp: int, steps: int) -> tuple[float, list[float]]:
    import polytrain

    os.environ["OMP_NUM_THREADS"] = _threads(tp)
    sets = [f"model.{k}={v}" for k, v in MODEL.items()]
    with tempfile.TemporaryDirectory() as tmp:
        s = polytrain.train(strategy="tensor", procs=tp, model="gpt-mini", dataset="chars", steps=steps,
                            batch_size=BATCH, optimizer="sgd", lr=LR, seed=SEED, sets=sets,
                            out=f"{tmp}/run")
        lines = Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()
        losses = [json.loads(x)["loss"] for x in lines if '"event": "step"' in x and '"rank": 0' in x]
    return float(s["throughput_samples_per_s"]), losses


def main() -> None:
    from harness import write_results

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tp", default="2,4")
    p.add_argument("--dtensor", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.dtensor:
        dtensor_worker(a.steps)
        return
    rows = []
    for tp in (int(t) for t in a.tp.split(",")):
        theirs, ours, gap = [], [], 0.0
        for _ in range(a.repeats):
            d = run_dtensor(tp, a.steps)
            o, losses = run_polytrain(tp, a.steps)
            theirs.append(float(d["samples_per_s"]))  # type: ignore[arg-type]
            ours.append(o)
            gap = max(gap, max(abs(x - y) for x, y in zip(losses, d["losses"], strict=True)))  # type: ignore[arg-type]
        mt, mo = statistics.median(theirs), statistics.median(ours)
        rows.append({"T": tp, "DTensor samples/s": mt, "polytrain tensor samples/s": mo,
                     "ratio": mo / mt, "max loss gap": gap, "target": ">= 1.0"})
    write_results("model_tensor_vs_dtensor", rows,
                  ["T", "DTensor samples/s", "polytrain tensor samples/s", "ratio", "max loss gap",
                   "target"],
                  notes=f"gpt-mini {MODEL}, chars (T=64), global batch {BATCH}, SGD lr {LR}; median "
                        f"of {a.repeats} runs of {a.steps} steps; gloo on CPU.")


if __name__ == "__main__":
    main()
