"""A plain hand-written PyTorch loop (the baseline of benchmarks/overhead.py). Also runs as a plain
DDP script under torchrun. Prints one JSON line: samples/s over the timed steps, the median time of one
step."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from polytrain.data import load_dataset, task_loss
from polytrain.models import build_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--set", dest="sets", action="append", default=[])
    args = p.parse_args()
    opts: dict[str, dict[str, object]] = {"model": {}, "data": {}}
    for kv in args.sets:
        k, v = kv.split("=")
        prefix, key = k.split(".")
        opts[prefix][key] = int(v)
    ddp = "WORLD_SIZE" in os.environ
    world, rank = 1, 0
    if ddp:
        dist.init_process_group("gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    data = load_dataset(args.dataset, opts["data"], seed=0)
    torch.manual_seed(0)
    model = build_model(args.model, data.spec, opts["model"])
    net = DDP(model) if ddp else model
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    b = args.batch_size // world
    x_all, y_all = data.x_train, data.y_train
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    ends = []
    for _ in range(args.steps):
        idx = torch.randint(0, x_all.shape[0], (args.batch_size,), generator=g)[rank * b:(rank + 1) * b]
        opt.zero_grad(set_to_none=True)
        loss = task_loss(data.spec, net(x_all[idx]), y_all[idx])
        loss.backward()
        opt.step()
        float(loss)
        ends.append(time.perf_counter())
    wall = time.perf_counter() - t0
    if rank == 0:
        step_s = statistics.median(b - a for a, b in itertools.pairwise([t0, *ends]))
        print(json.dumps({"samples_per_s": args.steps * args.batch_size / wall, "wall_s": wall,
                          "median_step_s": step_s}))
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
