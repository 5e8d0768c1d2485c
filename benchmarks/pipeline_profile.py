"""Where a pipeline step's time goes: polytrain's executor and torch.distributed.pipelining side by
side in the same two processes (same model, partition, micro-batches, data, optimizer), in
alternating blocks of steps, so both meet the same host load and process state.

    python benchmarks/pipeline_profile.py [--schedule 1f1b] [--blocks 10] [--block-steps 10]
                                          [--procs 2] [--microbatches 4] [--name NAME]

Per side it reports the median step time, the CPU seconds per step of each rank, and per rank the
time per step spent in forward, backward, waiting for messages and everything else (the runtime's
own Python), from timers wrapped around both runtimes' compute and wait calls; and ``runtime_py``:
the runtime's own Python per step (the self time, under cProfile, of every function of the
executor, its wire, meter and recorder on polytrain's side and of ``torch.distributed.pipelining``
on PyTorch's, one extra block per side: cProfile slows Python alike on both sides, so the figure
is an upper bound for both). With ``--name`` the rows go to ``benchmarks/results/NAME.json`` and
its page. ``--procs 4``: the mlp cut 1,1,1,1 over four ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

MODEL_OPTIONS = {"depth": 3, "hidden": 1024}
COUNTS_BY_P = {2: (2, 2), 4: (1, 1, 1, 1)}
RUNTIME_FILES = ("polytrain/strategies/pipeline/", "polytrain/metrics/", "polytrain/comm/",
                 "torch/distributed/pipelining/", "torch/distributed/distributed_c10d.py")
BATCH, LR, SEED = 256, 0.01, 0
VARIANTS = os.environ.get("VARIANTS", "base").split(",")


class Timers:
    """Seconds per named phase (nested phases are not expected)."""

    def __init__(self) -> None:
        self.t: dict[str, float] = defaultdict(float)
        self.calls: dict[str, list[float]] = defaultdict(list)

        self.spans: list[tuple[str, float, float]] = []

    def add(self, name: str, sec: float) -> None:
        self.t[name] += sec
        self.calls[name].append(sec)
        if name in ("forward", "backward"):
            end = time.perf_counter()
            self.spans.append((name[0].upper(), end - sec, end))

    def faults(self, name: str, before: int) -> None:
        self.t[name + "_flt"] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.add(name, time.perf_counter() - t0)
                self.faults(name, f0)

        return timed


def worker(schedule_name: str, blocks: int, block_steps: int, microbatches: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.distributed.pipelining import schedules as tsched

    from polytrain.comm import Comm
    from polytrain.config import make_config
    from polytrain.data import load_dataset, task_loss
    from polytrain.metrics.recorder import Recorder
    from polytrain.models import resolve_model
    from polytrain.models.partition import Partition, cut
    from polytrain.runtime.batches import GlobalBatches
    from polytrain.runtime.checkpoint import CheckpointStore
    from polytrain.runtime.job import Job, RankContext
    from polytrain.strategies.pipeline import executor as pexec
    from polytrain.strategies.pipeline.gpipe import flush_plan
    from polytrain.strategies.pipeline.options import FlushOptions
    from polytrain.strategies.pipeline.shell import PipelineRun

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    COUNTS = COUNTS_BY_P[world]

    # --- torch's side
    data = load_dataset("digits", {}, seed=SEED)
    torch.manual_seed(SEED)
    model = resolve_model("mlp", data.spec, MODEL_OPTIONS)
    module = cut(model, Partition(COUNTS))[rank]
    tt = Timers()
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    stage.forward_one_chunk = tt.wrap("forward", stage.forward_one_chunk)  # type: ignore[method-assign]
    stage.backward_one_chunk = tt.wrap("backward", stage.backward_one_chunk)  # type: ignore[method-assign]
    tsched._wait_batch_p2p = tt.wrap("wait", tsched._wait_batch_p2p)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    schedule = cls(stage, n_microbatches=microbatches, loss_fn=lambda out, y: task_loss(data.spec, out, y))
    optimizer = torch.optim.SGD(module.parameters(), lr=LR, momentum=0.9)
    batches = GlobalBatches(data.x_train, data.y_train, BATCH, SEED)

    def torch_step(step: int) -> None:
        x, y = batches.shard(step)
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        optimizer.step()

    # --- polytrain's side
    cfg = make_config({"strategy": schedule_name, "procs": world, "model": "mlp", "dataset": "digits",
                       "steps": 10**6, "batch_size": BATCH, "optimizer": "momentum", "lr": LR,
                       "seed": SEED, "model_options": MODEL_OPTIONS,
                       "options": {"microbatches": microbatches,
                                   "partition": ",".join(map(str, COUNTS))}})  # fmt: skip
    tmp = Path(tempfile.mkdtemp())
    ctx = RankContext(rank=rank, world=world, local_rank=rank, device=torch.device("cpu"), backend="gloo",
                      comm=Comm(rank, world), recorder=Recorder(rank), run_dir=tmp,
                      checkpoints=CheckpointStore(tmp / "checkpoints", "bench"))  # fmt: skip
    job = Job.from_config(cfg)
    opts = FlushOptions(microbatches=microbatches, partition=",".join(map(str, COUNTS)))
    run = PipelineRun(job, ctx, opts, flush_plan(schedule_name, opts))
    ex = run.executor
    pt = Timers()
    ours_batches = job.batches()
    orig_compute = ex._compute

    @contextmanager
    def compute(name: str, mb: int, step: int, window: Any) -> Any:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        with orig_compute(name, mb, step, window):
            yield
        pt.add(name, time.perf_counter() - t0)
        pt.faults(name, f0)

    ex._compute = compute  # type: ignore[method-assign]
    for inbox in [*ex.acts.values(), *ex.grads.values()]:
        inbox.take = pt.wrap("wait", inbox.take)  # type: ignore[method-assign]
    del pexec
    ctx.recorder.start_clock()

    def ours_step(step: int) -> None:
        run._segment([step], ours_batches)

    from polytrain.strategies.pipeline import activations_wire as wire

    orig_track, orig_pack, orig_unpack = ex.meter.track, wire.pack, wire.unpack

    @contextmanager
    def no_track(exclude: set[int]) -> Any:
        yield {}

    def pack_trailer(t: torch.Tensor, tag: float, mb: int) -> torch.Tensor:
        head = torch.tensor([tag, float(mb)], dtype=torch.float64).view(torch.uint8)
        return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8), head])

    def unpack_trailer(buf: torch.Tensor, meta: Any) -> Any:
        tag, mb = buf[-16:].view(torch.float64).tolist()
        return buf[:-16].view(meta.dtype).view(meta.shape).detach(), tag, int(mb)

    orig_send = ex.outbox.send

    def send_wait(*a: Any) -> None:
        orig_send(*a)
        t0 = time.perf_counter()
        ex.outbox.drain()
        pt.add("sendwait", time.perf_counter() - t0)

    def variant(name: str) -> Callable[[int], None]:
        def step(k: int) -> None:
            ex.outbox.send = send_wait if "waitsend" in name else orig_send  # type: ignore[method-assign]
            ex.meter.track = no_track if "nohooks" in name else orig_track  # type: ignore[method-assign]
            trailer = "trailer" in name
            wire.pack, wire.unpack = (pack_trailer, unpack_trailer) if trailer else (orig_pack, orig_unpack)
            ours_step(k)

        return step

    sides: dict[str, tuple[Callable[[int], None], Timers]] = {"torch": (torch_step, tt)}
    for name in VARIANTS:
        sides[f"polytrain-{name}"] = (variant(name), pt)
    out: dict[str, dict[str, list[float]]] = {s: defaultdict(list) for s in sides}
    calls: dict[str, dict[str, list[float]]] = {s: defaultdict(list) for s in sides}
    traces: dict[str, list[Any]] = defaultdict(list)
    for side in sides:  # warm-up
        for k in range(1, 4):
            sides[side][0](k)
    for b in range(blocks):
        names = list(sides)
        for side in names[b % len(names):] + names[: b % len(names)]:
            fn, timers = sides[side]
            timers.t.clear()
            dist.barrier()
            f0 = resource.getrusage(resource.RUSAGE_SELF)
            t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
            for k in range(block_steps):
                fn(10 + b * block_steps + k)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - c0
            main_cpu = time.thread_time() - m0
            f1 = resource.getrusage(resource.RUSAGE_SELF)
            rec = out[side]
            rec["step_ms"].append(1e3 * wall / block_steps)
            rec["cpu_ms"].append(1e3 * cpu / block_steps)
            rec["main_cpu_ms"].append(1e3 * main_cpu / block_steps)
            rec["minflt"].append((f1.ru_minflt - f0.ru_minflt) / block_steps)
            rec["ctxsw"].append((f1.ru_nvcsw + f1.ru_nivcsw - f0.ru_nvcsw - f0.ru_nivcsw) / block_steps)
            for name, sec in timers.t.items():
                rec[name if name.endswith("_flt") else name + "_ms"].append(
                    (1 if name.endswith("_flt") else 1e3) * sec / block_steps)
            for name, secs in timers.calls.items():
                calls[side][name] += secs
            timers.calls.clear()
            traces[side].append((t0, timers.spans))
            timers.spans = []
    import cProfile
    import pstats

    for side, (fn, _) in sides.items():  # the runtime's own Python per step, one block each
        dist.barrier()
        prof = cProfile.Profile()
        prof.enable()
        for k in range(block_steps):
            fn(3 * 10**5 + k)
        prof.disable()
        st = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        own = sum(v[2] for (file, _, _), v in st.items() if any(f in file for f in RUNTIME_FILES))
        out[side]["runtime_py_ms"].append(1e3 * own / block_steps)
        out[side]["py_calls"].append(sum(v[1] for v in st.values()) / block_steps)
    if os.environ.get("PYPROF"):  # Python-level profile of each side, one block each
        import cProfile
        import pstats

        for side, (fn, _) in sides.items():
            dist.barrier()
            prof = cProfile.Profile()
            prof.enable()
            for k in range(block_steps):
                fn(2 * 10**5 + k)
            prof.disable()
            if rank == int(os.environ["PYPROF"]):
                print(f"=== {side} rank {rank}", file=sys.stderr)
                pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    if os.environ.get("OPS"):  # op-level table per side (torch.profiler), one block each
        from torch.profiler import ProfilerActivity, profile

        for side, (fn, _) in sides.items():
            dist.barrier()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for k in range(block_steps):
                    fn(10**5 + k)
            if rank == int(os.environ["OPS"]):
                print(f"=== {side} rank {rank}", file=sys.stderr)
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25),
                      file=sys.stderr)
    summary = {side: {k: statistics.median(v) for k, v in rec.items()} for side, rec in out.items()}
    for side, per in calls.items():  # the median single call of each phase, in ms
        summary[side].update({f"{k}_call_ms": 1e3 * statistics.median(v) for k, v in per.items()})
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, summary)
    all_traces: list[Any] = [None] * world
    dist.all_gather_object(all_traces, dict(traces))
    if rank == 0 and world == 2:
        hops(all_traces, microbatches)
    if rank == 0:
        print(json.dumps(gathered))
    dist.destroy_process_group()


def hops(traces: list[dict[str, Any]], m: int) -> None:
    """Exposed message latency: how long a waiting receiver started after its sender's action ended
    (activation: stage 0's F end -> stage 1's F start; gradient: stage 1's B end -> stage 0's B
    start), when the receiver was idle by then; and each step's wall from the first action's start
    to the last one's end."""
    for side in traces[0]:
        act, grad, walls = [], [], []
        for (_, s0), (_, s1) in zip(traces[0][side], traces[1][side], strict=True):
            for step in range(len(s0) // (2 * m)):
                a = s0[step * 2 * m : (step + 1) * 2 * m]
                b = s1[step * 2 * m : (step + 1) * 2 * m]
                walls.append(max(a[-1][2], b[-1][2]) - min(a[0][1], b[0][1]))
                for sender, receiver, op, out in ((a, b, "F", act), (b, a, "B", grad)):
                    sent = [x for x in sender if x[0] == op]
                    for k, x in enumerate(receiver):
                        if x[0] != op:
                            continue
                        mb = sum(y[0] == op for y in receiver[:k])
                        ready = receiver[k - 1][2] if k else float("-inf")
                        if ready < sent[mb][2]:  # the receiver was idle when the message left
                            out.append(x[1] - sent[mb][2])
        med = statistics.median
        print(f"{side}: step wall {1e3 * med(walls):.2f} ms, exposed activation hop "
              f"{1e6 * med(act):.0f} us (n={len(act)}), gradient hop {1e6 * med(grad):.0f} us "
              f"(n={len(grad)})", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--block-steps", type=int, default=10)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--procs", type=int, default=2, choices=sorted(COUNTS_BY_P))
    ap.add_argument("--name", default="", help="write benchmarks/results/NAME.json and its page")
    args = ap.parse_args()
    if args.worker:
        worker(args.schedule, args.blocks, args.block_steps, args.microbatches)
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.procs),
           str(Path(__file__).resolve()), "--worker", "--schedule", args.schedule,
           "--blocks", str(args.blocks), "--block-steps", str(args.block_steps),
           "--microbatches", str(args.microbatches)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    out = proc.stdout
    print("\n".join(x for x in proc.stderr.splitlines() if not x.startswith(("USDT", "*", "Setting"))))
    ranks = json.loads([x for x in out.splitlines() if x.startswith("[")][-1])
    for side in ranks[0]:
        print(side)
        for r, s in enumerate(ranks):
            row = s[side]
            other = row["step_ms"] - sum(row.get(k + "_ms", 0.0) for k in ("forward", "backward", "wait"))
            cols = " ".join(f"{k.removesuffix('_ms')}={v:.2f}" for k, v in sorted(row.items()))
            print(f"  rank {r}: {cols} other_ms={other:.2f}")
    for side in ranks[0]:
        ratio = ranks[0]["torch"]["step_ms"] / ranks[0][side]["step_ms"]
        print(f"throughput ratio {side}/torch: {ratio:.3f}")
    if args.name:
        write(args, ranks)


def write(args: argparse.Namespace, ranks: list[dict[str, dict[str, float]]]) -> None:
    """One row per side and rank (ms per step, medians over the blocks), appended to NAME.json's
    rows of other (schedule, P, M)."""
    sys.path.insert(0, str(HERE))
    from harness import write_results

    path = HERE / "results" / f"{args.name}.json"
    earlier = json.loads(path.read_text())["rows"] if path.exists() else []
    rows = [r for r in earlier
            if (r["schedule"], r["P"], r["M"]) != (args.schedule, args.procs, args.microbatches)]
    for side in ranks[0]:
        for r, per in enumerate(ranks):
            x = per[side]
            busy = sum(x.get(k + "_ms", 0.0) for k in ("forward", "backward", "wait"))
            rows.append({"schedule": args.schedule, "P": args.procs, "M": args.microbatches,
                         "side": side.removesuffix("-base"), "rank": r, "step ms": x["step_ms"],
                         "cpu ms": x["cpu_ms"], "forward ms": x.get("forward_ms", 0.0),
                         "backward ms": x.get("backward_ms", 0.0), "wait ms": x.get("wait_ms", 0.0),
                         "other ms": x["step_ms"] - busy, "runtime_py ms": x["runtime_py_ms"],
                         "python calls": x["py_calls"], "ctx switches": x["ctxsw"],
                         "minor faults": x["minflt"]})
    rows.sort(key=lambda r: (r["schedule"], r["P"], r["M"], r["side"] != "torch", r["rank"]))
    write_results(args.name, rows, ["schedule", "P", "M", "side", "rank", "step ms", "cpu ms", "forward ms",
                                    "backward ms", "wait ms", "other ms", "runtime_py ms", "python calls",
                                    "ctx switches", "minor faults"], appended=bool(earlier),
                  notes=("Per step, medians over the blocks (ms; wall unless cpu): polytrain's executor "
                         "and torch.distributed.pipelining alternating blocks of steps in the same "
                         "processes (mlp depth 3 width 1024, global batch 256, SGD momentum, one torch "
                         "thread per rank; P = 2 cut 2,2, P = 4 cut 1,1,1,1, four ranks sharing 2 cores). "
                         "forward/backward/wait: timers around both runtimes' compute and receive-wait "
                         "calls; other: the rest of the step's wall (sends, the runtime's Python, the "
                         "optimizer, being descheduled); runtime_py: the runtime's own Python per step, "
                         "self time under cProfile (an upper bound, alike on both sides); python calls: "
                         "function calls per step under cProfile (the whole step). Rows of one "
                         "(schedule, P, M) come from one run; each run's command differs only in "
                         "--schedule/--procs/--microbatches. Shared 2-vCPU machine under load from other "
                         "jobs (load in the header): the wall figures carry its scheduling, cpu and "
                         "runtime_py much less."))


if __name__ == "__main__":
    main()
