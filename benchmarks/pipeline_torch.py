"""polytrain's pipelines against PyTorch's own ``torch.distributed.pipelining``: same model,
initial weights, partition, micro-batches, data, optimizer and processes. Target: polytrain's
throughput / PyTorch's >= 1.0.

Schedules both have: gpipe (ScheduleGPipe), 1f1b (Schedule1F1B), and with V = 2 chunks per rank
(``--virtual 2``: the mlp cut into 2P one-layer chunks, each rank holding the same chunks on both
sides) interleaved-1f1b (ScheduleInterleaved1F1B), looped-bfs (ScheduleLoopedBFS), zbv
(ScheduleZBVZeroBubble) and dualpipev (ScheduleDualPipeV). polytrain's side also reports its
measured bubble fraction (idle share of the ranks' compute windows); PyTorch's runtime reports none.

    python benchmarks/pipeline_torch.py [--steps 40] [--warmup 5] [--microbatches 4] [--repeats 5]
                                         [--schedules gpipe,1f1b] [--launcher 0|1] [--name NAME]
                                         [--model mlp|gpt]

``--model gpt``: a user's model instead of the zoo's — the nanoGPT-style ``UntiedGPT`` of
``tests/userzoo/nanogpt.py`` (4 blocks, width 128, 4 heads, on 64-character windows of the chars
corpus) cut by polytrain's tracer at ``split=transformer.h.2``; both runtimes get the same two
traced segments as their stages (PyTorch's ``PipelineStage`` takes any module).

Equal settings on both sides: the same process settings (polytrain's stages keep freed memory in
the heap, freeze setup's objects out of the garbage collector and pause it during the loop; the
PyTorch ranks get exactly the same three settings), the same warm-up exclusion (each side's
throughput is rank 0's, from the end of step ``--warmup`` to the end of the last step, so
PyTorch's first-step shape inference and polytrain's first step are both outside the timer), and
the same number of repeats, the two sides alternating within each pair.

Both runtimes run this file under the same plain torchrun (``--worker gpipe`` for PyTorch's,
``--worker polytrain-gpipe`` for polytrain's executor without its launcher); the same job through
``polytrain.train`` is measured too. Workers print the CPU seconds of their loop as well.
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

from harness import fmt_spread, write_results  # noqa: E402

VIRTUAL = ("interleaved-1f1b", "looped-bfs", "zbv", "dualpipev")  # schedules with 2 chunks per rank
V_SHAPE = ("zbv", "dualpipev")
TORCH_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
                 "interleaved-1f1b": "ScheduleInterleaved1F1B", "looped-bfs": "ScheduleLoopedBFS",
                 "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}
# name -> model, dataset, data options, model options, layer counts per stage, global batch
MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"model": "mlp", "dataset": "digits", "data": {}, "options": {"depth": 3, "hidden": 1024},
            "counts": {2: (2, 2), 4: (1, 1, 1, 1)}, "batch": 256},
    "gpt": {"model": "userzoo.nanogpt:UntiedGPT", "dataset": "chars", "data": {"seq_len": 64},
            "options": {"n_layer": 4, "n_head": 4, "n_embd": 128, "split": "transformer.h.2"},
            "counts": {2: (1, 1)}, "batch": 32},
}
LR, SEED = 0.01, 0
# Runs whose ranks reported and then died at interpreter exit ("terminate called without an active
# exception", about 1 run in 10 on torch 2.13/gloo, also before the heap and buffer changes): the
# measured loop had finished, so the figure stands; the count is reported with the results.
TEARDOWN_CRASHES: list[str] = []


def worker(schedule_name: str, steps: int, microbatches: int, warmup: int, name: str) -> None:
    """One rank of the PyTorch pipeline (run by torchrun), with the process settings polytrain's
    stages use: the heap kept (`polytrain.strategies.pipeline.heap`), setup's objects frozen, the
    collector paused during the loop."""
    import gc

    from polytrain.strategies.pipeline.heap import keep_heap

    keep_heap()
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining
    from torch.distributed.pipelining import PipelineStage

    from polytrain.data import load_dataset, task_loss
    from polytrain.models import resolve_model
    from polytrain.models.partition import Partition, cut
    from polytrain.runtime.batches import GlobalBatches

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    m = MODELS[name]
    data = load_dataset(m["dataset"], m["data"], seed=SEED)
    torch.manual_seed(SEED)
    model = resolve_model(m["model"], data.spec, m["options"])
    cls = getattr(pipelining, TORCH_CLASSES[schedule_name])
    loss = lambda out, y: task_loss(data.spec, out, y)  # noqa: E731
    if schedule_name in VIRTUAL:  # one-layer chunks, placed as polytrain places them
        pieces = cut(model, Partition((1,) * (2 * world)))
        mine = [rank, 2 * world - 1 - rank] if schedule_name in V_SHAPE else [rank, rank + world]
        stages = [PipelineStage(pieces[c], c, 2 * world, torch.device("cpu")) for c in mine]
        schedule = cls(stages, n_microbatches=microbatches, loss_fn=loss)
        params = [p for c in mine for p in pieces[c].parameters()]
        first, last = 0 in mine, 2 * world - 1 in mine
    else:
        module = cut(model, Partition(m["counts"][world]))[rank]
        schedule = cls(PipelineStage(module, rank, world, torch.device("cpu")), n_microbatches=microbatches,
                       loss_fn=loss)
        params, first, last = list(module.parameters()), rank == 0, rank == world - 1
    optimizer = torch.optim.SGD(params, lr=LR, momentum=0.9)
    batches = GlobalBatches(data.x_train, data.y_train, m["batch"], SEED)
    gc.freeze()
    gc.disable()
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(1, steps + 1):
        if step == warmup + 1:
            t0, c0 = time.perf_counter(), time.process_time()
        x, y = batches.shard(step)
        optimizer.zero_grad(set_to_none=True)
        schedule.step(*([x] if first else []), **({"target": y, "losses": []} if last else {}))
        optimizer.step()
    t1 = time.perf_counter()
    cpu = time.process_time() - c0
    gc.enable()
    dist.barrier()
    _report((steps - warmup) * m["batch"] / (t1 - t0), cpu)


def _report(samples_per_s: float, cpu_s: float, bubble: float | None = None) -> None:
    """Rank 0 prints throughput and the CPU seconds of all ranks together (robust to host load),
    and polytrain's measured bubble fraction."""
    import torch
    import torch.distributed as dist

    total = torch.tensor([cpu_s], dtype=torch.float64)
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        print(json.dumps({"samples_per_s": samples_per_s, "cpu_s": float(total), "bubble": bubble}))
    dist.destroy_process_group()


def polytrain_worker(schedule_name: str, steps: int, microbatches: int, warmup: int, name: str) -> None:
    """One rank of polytrain's pipeline under the same torchrun, without polytrain's launcher."""
    import tempfile

    import torch
    import torch.distributed as dist

    from polytrain.comm import Comm
    from polytrain.config import make_config
    from polytrain.metrics.recorder import Recorder
    from polytrain.runtime.checkpoint import CheckpointStore
    from polytrain.runtime.job import Job, RankContext
    from polytrain.strategies import make_strategy

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    m = MODELS[name]
    counts = (1,) * (2 * world) if schedule_name in VIRTUAL else m["counts"][world]
    sets = {"microbatches": microbatches, "partition": ",".join(map(str, counts)),
            "heap": os.environ.get("POLYTRAIN_HEAP", "keep")}
    cfg = make_config(
        {
            "strategy": schedule_name,
            "procs": world,
            "model": m["model"],
            "dataset": m["dataset"],
            "data_options": m["data"],
            "steps": steps,
            "batch_size": m["batch"],
            "optimizer": "momentum",
            "lr": LR,
            "seed": SEED,
            "options": sets,
            "model_options": m["options"],
        }
    )
    tmp = Path(tempfile.mkdtemp())
    ctx = RankContext(
        rank=rank,
        world=world,
        local_rank=rank,
        device=torch.device("cpu"),
        backend="gloo",
        comm=Comm(rank, world),
        recorder=Recorder(rank),
        run_dir=tmp,
        checkpoints=CheckpointStore(tmp / "checkpoints", "bench"),
    )
    cpu_at: dict[int, float] = {}  # CPU seconds of this process at the end of each step
    step_event = ctx.recorder.step

    def cpu_step(step: int, *a: Any, **k: Any) -> None:
        step_event(step, *a, **k)
        cpu_at[step] = time.process_time()

    ctx.recorder.step = cpu_step  # type: ignore[method-assign]
    result = make_strategy(cfg.strategy, cfg.options).run(Job.from_config(cfg), ctx)
    ends = {e["step"]: e["t"] for e in ctx.recorder.events if e["event"] == "step"}
    _report((steps - warmup) * m["batch"] / (ends[steps] - ends[warmup]), cpu_at[steps] - cpu_at[warmup],
            result.strategy_metrics.get("bubble_fraction_median"))


def torchrun_side(worker_name: str, steps: int, microbatches: int, warmup: int, name: str,
                  procs: int = 2) -> dict[str, Any]:
    """The report (samples/s, CPU s, bubble) of ``--worker worker_name`` on ``procs`` ranks under
    plain torchrun."""
    # faulthandler: a rank that aborts at exit prints every thread's Python stack (kept below)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
           "PYTHONFAULTHANDLER": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs),
           str(Path(__file__).resolve()), "--worker", worker_name, "--steps", str(steps),
           "--microbatches", str(microbatches), "--warmup", str(warmup), "--model", name]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if not lines:
        raise RuntimeError(f"{worker_name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    if proc.returncode != 0:  # the loop finished and reported; a rank died at interpreter exit
        tail = proc.stderr[-1500:].replace(sys.prefix, "VENV").replace(str(ROOT), "REPO")  # no machine paths
        TEARDOWN_CRASHES.append(f"{worker_name} (exit {proc.returncode}): {tail}")
    return dict(json.loads(lines[-1]))


def launcher_side(schedule: str, steps: int, microbatches: int, root: Path, name: str) -> float:
    """samples/s of the same job through ``polytrain.train`` (polytrain's own launcher)."""
    import polytrain

    m = MODELS[name]
    out = root / f"{schedule}-{time.monotonic_ns()}"
    sets = [f"microbatches={microbatches}", "partition=" + ",".join(map(str, m["counts"][2]))]
    summary = polytrain.train(strategy=schedule, procs=2, model=m["model"], dataset=m["dataset"],
                              data_options=m["data"], model_options=m["options"], steps=steps,
                              batch_size=m["batch"], optimizer="momentum", lr=LR, seed=SEED, out=str(out),
                              sets=sets)  # fmt: skip
    return float(summary["throughput_samples_per_s"])


def compare(schedule: str, args: argparse.Namespace, root: Path, procs: int = 2,
            microbatches: int | None = None) -> dict[str, Any]:
    """Interleaved repeats, so every side sees the same host load on average; the order inside a
    pair alternates (a side that always runs first or second would meet a drifting host load
    alone). Each pair gives one ratio: its two runs are seconds apart, so the pair's ratio is less
    exposed to the host's drift than the ratio of the two medians."""
    mbs = args.microbatches if microbatches is None else microbatches
    ours, theirs, launched, bubbles = [], [], [], []
    cpu_ours, cpu_theirs = [], []
    crashes_before = len(TEARDOWN_CRASHES)
    for i in range(args.repeats):
        pair = [("ours", f"polytrain-{schedule}"), ("theirs", schedule)]
        for side, worker_name in pair if i % 2 == 0 else pair[::-1]:
            got = torchrun_side(worker_name, args.steps, mbs, args.warmup, args.model, procs)
            (ours if side == "ours" else theirs).append(float(got["samples_per_s"]))
            (cpu_ours if side == "ours" else cpu_theirs).append(float(got["cpu_s"]))
            print(f"P={procs} M={mbs} {worker_name}: {got['samples_per_s']:.0f} samples/s", flush=True)
            if side == "ours" and got.get("bubble") is not None:
                bubbles.append(float(got["bubble"]))
        if args.launcher:
            launched.append(launcher_side(schedule, args.steps, mbs, root, args.model))
    med = statistics.median
    paired = sorted(a / b for a, b in zip(ours, theirs, strict=True))
    cpu_paired = sorted(a / b for a, b in zip(cpu_ours, cpu_theirs, strict=True))
    return {
        "model": args.model,
        "schedule": schedule,
        "P": procs,
        "V": 2 if schedule in VIRTUAL else 1,
        "M": mbs,
        "polytrain samples/s": fmt_spread(ours, 0),
        "torch.pipelining samples/s": fmt_spread(theirs, 0),
        "ratio of medians": med(ours) / med(theirs),
        "paired ratio": fmt_spread(paired, 3),
        "pairs_at_or_above_1": f"{sum(r >= 1.0 for r in paired)}/{len(paired)}",
        "CPU per step ratio (paired)": fmt_spread(cpu_paired, 3),
        "polytrain_cpu_s": cpu_ours,
        "torch_cpu_s": cpu_theirs,
        "polytrain bubble (median per step)": fmt_spread(bubbles, 3) if bubbles else "n/a",
        "polytrain_bubbles": bubbles,
        "polytrain_train_samples_per_s": med(launched) if launched else float("nan"),
        "polytrain_runs": ours,
        "torch_runs": theirs,
        "polytrain_train_runs": launched,
        "teardown_crashes": TEARDOWN_CRASHES[crashes_before:],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--worker", choices=[*TORCH_CLASSES, *(f"polytrain-{s}" for s in TORCH_CLASSES)])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5, help="steps outside the timer on both sides")
    ap.add_argument("--microbatches", default="4", help="one M or several, comma-separated")
    ap.add_argument("--procs", default="2", help="pipeline stages P (mlp: 2 or 4), comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--schedules", default="gpipe,1f1b")
    ap.add_argument("--launcher", type=int, default=0, help="also time polytrain.train (1: do)")
    ap.add_argument("--name", default="pipeline_torch", help="results file name")
    ap.add_argument("--model", choices=sorted(MODELS), default="mlp")
    args = ap.parse_args()
    if args.worker:
        name = args.worker.removeprefix("polytrain-")
        run = polytrain_worker if args.worker.startswith("polytrain-") else worker
        run(name, args.steps, int(args.microbatches), args.warmup, args.model)
        return
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in args.procs.split(","):
            for mb in args.microbatches.split(","):
                for schedule in args.schedules.split(","):
                    rows.append(compare(schedule, args, Path(tmp), int(p), int(mb)))
                    publish(args, rows)  # after each row: a run cut short keeps what it measured


def publish(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    what = {"mlp": "mlp depth 3 width 1024 cut 2,2, global batch 256",
            "gpt": "UntiedGPT (tests/userzoo/nanogpt.py: 4 blocks, n_embd 128, 4 heads) on chars windows "
                   "of 64, traced and cut at transformer.h.2, global batch 32"}[args.model]
    if any(s in VIRTUAL for s in args.schedules.split(",")):
        what += " (V = 2 rows: the same mlp cut into 4 one-layer chunks, 2 per rank, placed alike)"
    notes = (
        f"{what} (P = 4: cut 1,1,1,1), SGD momentum, P ranks on gloo, one torch thread each "
        f"(2 cores: at P = 4 the ranks share them); {args.repeats} "
        f"pairs of runs of {args.steps} steps, the order alternating within each pair; throughput: rank "
        f"0, steps {args.warmup + 1}..{args.steps} (the first {args.warmup} outside the timer on both "
        "sides). Both under the same plain torchrun with the same process settings (heap kept, setup "
        "frozen out of the collector, collector paused in the loop). Median (min–max) of the runs; "
        "paired ratio: polytrain / torch within each pair; CPU per step ratio: the CPU seconds of all "
        "ranks over the timed steps, polytrain / torch within each pair (below 1: polytrain spends less). "
        "polytrain_train: the same job through "
        "polytrain.train (its own launcher, timer over all steps), for reference only. polytrain bubble: "
        "the median over steps of the idle share of the ranks' compute windows (PyTorch reports none). "
        "Measured on the "
        "shared 2-vCPU development machine with other jobs running (load average in the JSON)."
    )
    write_results(
        args.name,
        rows,
        ["model", "schedule", "P", "V", "M", "polytrain samples/s", "torch.pipelining samples/s",
         "ratio of medians", "paired ratio", "pairs_at_or_above_1", "CPU per step ratio (paired)",
         "polytrain bubble (median per step)",
         "polytrain_train_samples_per_s"],
        notes,
    )


if __name__ == "__main__":
    main()
