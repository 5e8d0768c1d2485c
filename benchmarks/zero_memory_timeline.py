"""Where a step's memory goes, by the allocator: ``allreduce`` and ``zero`` stage 3 on gpt-mini at
W = 2, each variant built exactly as benchmarks/zero.py builds it. (``fsdp`` is not measured: the
profiler's data-flow graph stops on its DTensor ops with "version mismatch", torch 2.13.)

    .venv/bin/python benchmarks/zero_memory_timeline.py [--d-model 128] [--variants ...]

Writes results/zero_memory_timeline.json and .md. Per variant, one launch of 2 gloo processes:
one warm-up step (the optimizer state exists after it), then one step under
``torch.profiler.profile(profile_memory=True)``. Rank 0 exports the profiler's memory timeline
(every allocation and free, each tensor given a category from the autograd graph) and the
table gives its peak, split by category, and the live bytes when the step starts. RSS (what
benchmarks/zero.py reports) also moves with the allocator's caching and the process's pages; this
counts tensors only. Tensors the profiler cannot categorise (stage 3's hooks swap parameter storage
under autograd) are ``unknown``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import write_results  # noqa: E402
from zero import _port, build  # noqa: E402

VARIANTS = ["allreduce", "zero-3"]
# torch.profiler._memory_profiler's export order (index 0 is unused)
CATEGORIES = ["parameter", "optimizer", "input", "temporary", "activation", "gradient",
              "autograd", "unknown"]


def worker(rank: int, variant: str, port: int, d_model: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from polytrain.comm import Comm
    from polytrain.config import JobConfig
    from polytrain.runtime.job import Job

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    cfg = JobConfig(model="gpt-mini", dataset="chars", optimizer="adam", lr=1e-3, seed=0,
                    batch_size=16, model_options={"d_model": d_model, "n_layer": 4},
                    data_options={"seq_len": 32, "chars": 20000})
    job = Job.from_config(cfg)
    _, step, _ = build(variant, job, Comm(rank, 2))
    batches = job.batches()
    step(*batches.shard(1, rank, 2))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        step(*batches.shard(2, rank, 2))
    if rank == 0:
        prof.export_memory_timeline(str(Path(out, f"{variant}.json")), device="cpu")
    dist.destroy_process_group()


def row(variant: str, path: Path) -> dict[str, Any]:
    _, sizes = json.loads(path.read_text())
    totals = [sum(s) for s in sizes]
    peak = max(range(len(totals)), key=totals.__getitem__)
    out: dict[str, Any] = {"variant": variant, "start MB": round(totals[0] / 1e6, 3),
                           "peak MB": round(totals[peak] / 1e6, 3)}
    out |= {f"{c} MB": round(sizes[peak][i + 1] / 1e6, 3) for i, c in enumerate(CATEGORIES)}
    return out


def main() -> None:
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser()
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS)
    a = p.parse_args()
    out = tempfile.mkdtemp()
    rows = []
    for v in a.variants:
        mp.spawn(worker, args=(v, _port(), a.d_model, out), nprocs=2, join=True)
        rows.append(row(v, Path(out, f"{v}.json")))
    write_results("zero_memory_timeline", rows, list(rows[0]), notes=(
        f"gpt-mini (d_model {a.d_model}, 4 layers) on chars (T 32), Adam, W = 2, 8 samples per "
        "rank; rank 0's second step. peak: the most tensor bytes alive at once during the step "
        "(torch.profiler memory timeline), split by the profiler's categories at that moment; "
        "start: bytes alive when the step begins (parameters, optimizer state). One step, one "
        "rank, no repeats: the allocator's counts do not vary between runs of the same code."))


if __name__ == "__main__":
    main()
