"""polytrain's per-step overhead in the same processes: blocks of a plain loop (a plain DDP loop
for 2 processes) alternate with blocks of polytrain's own rank code (`single` / `allreduce`
through `Strategy.run`, with its recorder, timeline spans, accounted comm hook and data shard),
inside the same torchrun processes. Each block's throughput and CPU time per step (all threads
of the process) are recorded, so the table gives both ratios. Launch, process placement and heap
history are then shared by both sides, so what differs is polytrain's code alone — the separate-
process comparison of `overhead.py` carries ±15% between processes of the same job on this
machine.

    python benchmarks/overhead_inprocess.py [--model cnn|vgg16|resmlp|resmlp-10ms] [--procs 1|2]
                                            [--blocks 8] [--steps 100] [--threads N]

``resmlp`` (about 1 ms a step at one thread) and ``resmlp-10ms`` are the held-out residual MLP of
``benchmarks/resmlp.py``, given as a user model (``resmlp:make``), on digits.
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
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

MODELS = {"cnn": ("cnn", "digits", {}), "vgg16": ("vgg16", "synthetic-images", {"width": 8}),
          "resmlp": ("resmlp:make", "digits", {"width": 256, "blocks": 2}),
          "resmlp-10ms": ("resmlp:make", "digits", {"width": 1024, "blocks": 4})}
BATCH = 64


def _worker(model: str, blocks: int, steps: int, threads: int) -> None:
    import torch
    import torch.distributed as dist
    from plain_loop import train_steps
    from torch.nn.parallel import DistributedDataParallel as DDP

    from polytrain.comm import Comm
    from polytrain.config import make_config
    from polytrain.metrics.recorder import Recorder
    from polytrain.runtime.checkpoint import CheckpointStore
    from polytrain.runtime.job import Job, RankContext
    from polytrain.strategies import make_strategy

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // world))
    model_ref, dataset, model_options = MODELS[model]
    strategy = "single" if world == 1 else "allreduce"
    job = Job.from_config(make_config({"strategy": strategy, "steps": steps, "procs": world,
                                       "model": model_ref, "dataset": dataset,
                                       "model_options": model_options, "batch_size": BATCH}))
    tmp = Path(tempfile.mkdtemp(prefix="polytrain-overhead-"))

    def plain() -> tuple[float, float]:
        torch.manual_seed(0)
        model_ = job.build_model()
        net = DDP(model_) if world > 1 else model_
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        dist.barrier()
        cpu = time.process_time()
        clock = train_steps(net, opt, job.spec, job.dataset.x_train, job.dataset.y_train, steps,
                            BATCH, rank, world)
        return steps * BATCH / (clock[-1] - clock[0]), (time.process_time() - cpu) / steps

    def ours(i: int) -> tuple[float, float]:
        ctx = RankContext(rank=rank, world=world, local_rank=rank, device=torch.device("cpu"),
                          backend="gloo", comm=Comm(rank, world),
                          recorder=Recorder(rank, tmp / f"rank{rank}_{i}.jsonl"), run_dir=tmp,
                          checkpoints=CheckpointStore(tmp / "checkpoints", "overhead"))
        res = make_strategy(strategy, {}).run(job, ctx)
        # CPU per step from the step events' process times (the final evaluation left out)
        cpu = [e["cpu_s"] for e in ctx.recorder.events if e["event"] == "step"]
        ctx.recorder.close()
        return res.samples / res.wall_s, (cpu[-1] - cpu[0]) / (len(cpu) - 1)

    pairs = []
    for i in range(blocks):
        if i % 2:  # alternate who goes first
            o, p = ours(i), plain()
        else:
            p, o = plain(), ours(i)
        pairs.append({"plain": p[0], "polytrain": o[0], "ratio": o[0] / p[0],
                      "plain_cpu_s": p[1], "polytrain_cpu_s": o[1], "cpu_ratio": o[1] / p[1]})
    if rank == 0:
        print(json.dumps({"pairs": pairs}), flush=True)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(MODELS), default="cnn")
    p.add_argument("--procs", type=int, choices=[1, 2], default=2)
    p.add_argument("--blocks", type=int, default=8, help="pairs of blocks (plain, polytrain)")
    p.add_argument("--steps", type=int, default=100, help="steps per block")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: cores / procs)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        _worker(a.model, a.blocks, a.steps, a.threads)
        return
    from harness import write_results

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(a.procs), str(Path(__file__).resolve()), "--worker", "--model", a.model,
           "--blocks", str(a.blocks), "--steps", str(a.steps), "--threads", str(a.threads)]
    out = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, check=True).stdout
    pairs: list[dict[str, Any]] = json.loads([x for x in out.splitlines() if x.startswith("{")][-1])["pairs"]
    ratios = sorted(x["ratio"] for x in pairs)
    q = len(ratios) // 4
    cpu = [x["cpu_ratio"] for x in pairs]
    row = {"model": a.model, "threads": a.threads or "cores/procs",
           "comparison": "single vs plain loop" if a.procs == 1 else
           "allreduce vs plain DDP", "procs": a.procs, "blocks": len(pairs), "steps per block": a.steps,
           "plain samples/s": statistics.median(x["plain"] for x in pairs),
           "polytrain samples/s": statistics.median(x["polytrain"] for x in pairs),
           "paired ratio": statistics.median(ratios),
           "middle half": f"{ratios[q]:.3f}-{ratios[-1 - q]:.3f}",
           "polytrain ahead": f"{sum(r >= 1 for r in ratios)}/{len(ratios)}",
           "plain ms/step": 1e3 * BATCH / statistics.median(x["plain"] for x in pairs),
           "CPU/step ratio": f"{statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f})",
           "throughput ratio": f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})",
           "target": ">= 0.98"}
    write_results(f"overhead_inprocess_{a.model}_{a.procs}", [row], list(row), extra={"pairs": pairs},
                  notes=(
        "Blocks of plain steps and of polytrain's rank code alternate inside the same torchrun "
        f"processes (the first of each pair alternating), {a.steps} steps of global batch {BATCH} "
        "with Adam per block; `paired ratio`: median over pairs of polytrain/plain throughput, "
        "with the middle half of the pairs' ratios; `CPU/step ratio`: median (min-max) over pairs "
        "of polytrain's CPU seconds per step (process time, all threads; polytrain's from its step "
        "events, steps 2..N) over the plain loop's. Load average in the header; every pair in "
        "the JSON."))


if __name__ == "__main__":
    main()
