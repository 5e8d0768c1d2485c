"""``zero`` stages 1–3 against ``allreduce`` (DDP), ``fsdp`` (FSDP2, with and without resharding
after forward) and PyTorch's ``ZeroRedundancyOptimizer`` (stage 1), on gpt-mini at 2 and 4 ranks:
time per step, bytes sent per step per rank, bytes held, peak memory per rank.

    .venv/bin/python benchmarks/zero.py [--ranks 2 4] [--repeats 5] [--steps 6] [--d-model 192]

Writes results/zero_w<W>.json and .md for each world size as soon as it is measured.

One launch of W real gloo processes per world size; inside it the variants alternate (order
reversed every repeat), each built afresh per repeat from the same seed: one warm-up step, then
``--steps`` timed steps. Every variant drives its model exactly as its strategy does (``zero``:
:class:`ShardedModel`; ``allreduce``: DDP with its bucket all-reduce on the accounted comm; ``fsdp``:
``fully_shard`` per layer and root with its collectives counted). Memory, per rank: ``held`` is
counted from the tensors alive after a step (parameters, gradients, optimizer state; DDP's
bucket buffers are not among them); ``peak RSS`` is the process's VmHWM over the timed steps,
reset (``/proc/self/clear_refs``) after warm-up, and ``transient`` its growth over the RSS at the
reset (activations, gathered layers, gradient copies). glibc's mmap threshold is pinned at 64 KiB
(``MALLOC_MMAP_THRESHOLD_``) so a freed tensor returns to the OS and one variant's memory does
not hide in the next one's RSS.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import alternating, fmt_spread, spread, write_results  # noqa: E402

VARIANTS = ["allreduce", "zero-1", "zero-2", "zero-3", "fsdp", "fsdp-noreshard", "torch-zero-1"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _vm(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _storages(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            t = t.to_local() if hasattr(t, "to_local") else t
            if t.numel():
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def build(variant: str, job: Any, comm: Any) -> tuple[Any, Any, Any]:
    """(model, step(x, y) -> loss, held() -> bytes) of one variant, as its strategy runs it."""
    import torch
    import torch.distributed as dist

    from polytrain.strategies.data import fsdp as fsdp_mod
    from polytrain.strategies.data.zero_memory import held_bytes
    from polytrain.strategies.data.zero_shard import ShardedModel
    from polytrain.strategies.data.zero_units import bucket_units, layer_units

    model = job.build_model()
    if variant.startswith("zero"):
        stage = int(variant[-1])
        units = (layer_units(model, comm.world) if stage == 3 else
                 bucket_units(list(model.parameters()), comm.world, 25.0))
        sm = ShardedModel(model, units, comm, stage)
        opt = job.make_optimizer(sm.optimizer_params())

        def zstep(x: Any, y: Any) -> float:
            sm.begin_step()
            loss = job.forward_loss(model, x, y)
            loss.backward()
            sm.finish_backward()
            sm.optimizer_step(opt)
            return float(loss.detach())

        return model, zstep, lambda: sum(v for k, v in held_bytes(sm, opt).items())
    if variant.startswith("fsdp"):
        from torch.distributed.fsdp import fully_shard

        fsdp_mod.count_fsdp_traffic(comm)
        reshard = variant == "fsdp"
        for layer in fsdp_mod.layers_of(model):
            if any(True for _ in layer.parameters()):
                fully_shard(layer, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        forward: Any = model
        opt = job.make_optimizer(model.parameters())
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP

        forward = DDP(model, broadcast_buffers=False)

        def hook(_state, bucket):  # type: ignore[no-untyped-def]
            buf = bucket.buffer()
            buf.div_(comm.world)
            return comm.all_reduce_future(buf)

        forward.register_comm_hook(None, hook)
        if variant == "torch-zero-1":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            from torch.distributed.optim import zero_redundancy_optimizer as zro

            zro.dist = _CountingBroadcast(dist, comm)  # type: ignore[attr-defined]
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                          lr=job.config.lr)
        else:
            opt = job.make_optimizer(model.parameters())

    def step(x: Any, y: Any) -> float:
        opt.zero_grad(set_to_none=True)
        loss = job.forward_loss(forward, x, y)
        loss.backward()
        opt.step()
        return float(loss.detach())

    def held() -> int:
        inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its shard's optimizer
        state = [v for s in inner.state.values() for v in s.values() if hasattr(v, "numel")]
        return _storages(list(model.parameters()) + [p.grad for p in model.parameters()] + state)

    return model, step, held


class _CountingBroadcast:
    """``torch.distributed`` for ZeroRedundancyOptimizer: each broadcast counted at the source
    (one copy to every other rank, as :meth:`Comm.broadcast` counts)."""

    def __init__(self, real: Any, comm: Any) -> None:
        self._real, self._comm = real, comm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def broadcast(self, tensor: Any, src: int, *a: Any, **k: Any) -> Any:
        c = self._comm
        if c.rank == src:
            for peer in range(c.world):
                if peer != src:
                    c.record("broadcast", peer, tensor.numel() * tensor.element_size())
        return self._real.broadcast(tensor, src, *a, **k)


def measure(variant: str, job: Any, comm: Any, steps: int) -> dict[str, float]:
    import gc

    from polytrain.cost.profile import _reset_peak_rss

    _, step, held = build(variant, job, comm)
    batches = job.batches()
    step(*batches.shard(1, comm.rank, comm.world))  # warm-up: optimizer state exists after it
    gc.collect()
    sent0 = comm.bytes_sent
    _reset_peak_rss()
    rss0 = _vm("VmRSS")
    comm.barrier()
    t0 = time.perf_counter()
    for i in range(2, steps + 2):
        step(*batches.shard(i, comm.rank, comm.world))
    comm.barrier()
    dt = (time.perf_counter() - t0) / steps
    return {"step_ms": 1000 * dt, "sent_per_step": (comm.bytes_sent - sent0) / steps,
            "held": held(), "peak_rss": _vm("VmHWM"), "transient": _vm("VmHWM") - rss0}


def worker(rank: int, world: int, port: int, a: argparse.Namespace, out: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    from polytrain.comm import Comm
    from polytrain.config import JobConfig
    from polytrain.runtime.job import Job

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    cfg = JobConfig(model="gpt-mini", dataset="chars", optimizer="adam", lr=1e-3, seed=0,
                    batch_size=8 * world, model_options={"d_model": a.d_model, "n_layer": 4},
                    data_options={"seq_len": 32, "chars": 20000})
    job = Job.from_config(cfg)
    comm = Comm(rank, world)
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in a.variants}
    for _, v in alternating(a.variants, a.repeats):
        rows[v].append(measure(v, job, comm, a.steps))
    params = sum(p.numel() for p in job.build_model().parameters())
    Path(out, f"r{rank}.json").write_text(json.dumps({"rows": rows, "params": params}))
    dist.destroy_process_group()


def summarize(world: int, per: list[dict[str, Any]], repeats: int) -> list[dict[str, Any]]:
    """One row per variant from every rank's repeats."""
    rows = []
    for v in per[0]["rows"]:
        reps = [x for r in per for x in r["rows"][v]]  # every rank's every repeat
        step = [max(r["rows"][v][i]["step_ms"] for r in per) for i in range(repeats)]
        rows.append({"W": world, "variant": v, "step ms": fmt_spread(step, 1),
                     "MB sent/step/rank": spread([x["sent_per_step"] / 1e6 for x in reps])["median"],
                     "held MB/rank": spread([x["held"] / 1e6 for x in reps])["median"],
                     "peak RSS MB/rank": fmt_spread([x["peak_rss"] / 1e6 for x in reps], 0),
                     "transient MB/rank": fmt_spread([x["transient"] / 1e6 for x in reps], 1),
                     "params": per[0]["params"]})
    return rows


def main() -> None:
    import json

    import torch.multiprocessing as mp

    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--d-model", type=int, default=192)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS)
    p.add_argument("--raw", help="only summarise the rank files (r<rank>.json) a run of this "
                   "script wrote into DIR for the one --ranks W, when it was stopped before writing")
    a = p.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by each spawned rank's malloc at start
    for world in a.ranks:  # one results file per world size: a stopped run keeps the finished ones
        out = a.raw or tempfile.mkdtemp()
        if not a.raw:
            mp.spawn(worker, args=(world, _port(), a, out), nprocs=world, join=True)
        per = [json.loads(Path(out, f"r{r}.json").read_text()) for r in range(world)]
        rows = summarize(world, per, a.repeats)
        subset = "" if a.variants == VARIANTS else "_" + "_".join(a.variants)
        write_results(f"zero_w{world}{subset}", rows, list(rows[0]), extra={"repeats": per}, notes=(
            f"gpt-mini (d_model {a.d_model}, 4 layers) on chars (T 32), Adam, 8 samples per rank "
            f"per step, one torch thread per rank; {a.repeats} repeats, the variants alternating; "
            f"{a.steps} timed steps after one warm-up. step ms: the slowest rank's mean per repeat, "
            "median (min–max). MB sent: polytrain's counted bytes per rank per step (median over "
            "ranks and repeats). held: tensors alive after a step (parameters, gradients, "
            "optimizer state), counted. peak RSS: VmHWM over the timed steps; transient: its "
            "growth over the RSS at the reset, median (min–max) over ranks and repeats."))


if __name__ == "__main__":
    main()
