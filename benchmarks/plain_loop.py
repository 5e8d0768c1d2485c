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
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from polytrain.data import load_dataset, task_loss
from polytrain.models import build_model


def train_steps(net: torch.nn.Module, opt: torch.optim.Optimizer, spec: Any, x_all: torch.Tensor,
                y_all: torch.Tensor, steps: int, batch_size: int, rank: int = 0,
                world: int = 1) -> list[float]:
    """The plain loop itself: ``steps`` steps on random global batches (this rank's slice).
    Returns the clock at the start followed by the clock at the end of every step."""
    b = batch_size // world
    g = torch.Generator().manual_seed(0)
    clock = [time.perf_counter()]
    for _ in range(steps):
        idx = torch.randint(0, x_all.shape[0], (batch_size,), generator=g)[rank * b:(rank + 1) * b]
        opt.zero_grad(set_to_none=True)
        loss = task_loss(spec, net(x_all[idx]), y_all[idx])
        loss.backward()
        opt.step()
        float(loss.detach())
        clock.append(time.perf_counter())
    return clock


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
    clock = train_steps(net, opt, data.spec, data.x_train, data.y_train, args.steps,
                        args.batch_size, rank, world)
    wall = clock[-1] - clock[0]
    if rank == 0:
        step_s = statistics.median(b - a for a, b in itertools.pairwise(clock))
        print(json.dumps({"samples_per_s": args.steps * args.batch_size / wall, "wall_s": wall,
                          "median_step_s": step_s}))
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
