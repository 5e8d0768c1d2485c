"""Actor env-steps/s with 1, 2, 4 `apex` actors, and where this machine saturates.

Learning is switched off (``learning_starts`` = replay capacity, no rate limit), so the figure is
what actors can generate and send: each actor steps CartPole ε-greedily with a batch-of-one
forward pass, computes n-step priorities every 50 transitions and sends them to the replay
process. A reference row plays the same loop in one process with no communication at all.

    python benchmarks/rl_actor_throughput.py [--seconds 10] [--actors 1,2,4] [--repeats 5]

The setups take turns, the order reversed every repeat; median (min–max) over the repeats.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from harness import alternating, fmt_spread, write_results  # noqa: E402


def in_process(seconds: float) -> dict[str, float]:
    """Steps/s of the actor loop alone: env step + ε-greedy forward + n-step rows, no sends."""
    import torch

    from polytrain.metrics.recorder import Recorder
    from polytrain.rl.acting import EpisodeRunner
    from polytrain.rl.config import make_rl_config
    from polytrain.rl.core import build_qnet
    from polytrain.rl.roles import RoleContext, layout_ranks

    torch.set_num_threads(1)
    cpu0 = time.process_time()
    cfg = make_rl_config({"algo": "apex"})
    ctx = RoleContext(cfg, 2, layout_ranks(cfg), Recorder(2), Path("."))
    runner = EpisodeRunner(ctx, seed=0)
    net = build_qnet("mlp", cfg.info, cfg.hidden, cfg.depth)
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        for _ in range(100):
            runner.step(net, 0.4)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return {"env_steps_per_s": runner.steps / wall, "actor_cpu_us_per_step": 1e6 * cpu / runner.steps,
            "cpu_cores_used": cpu / wall}


def apex(actors: int, seconds: float) -> dict[str, object]:
    from polytrain.rl.api import run

    with tempfile.TemporaryDirectory() as tmp:
        s = run(algo="apex", actors=actors, max_seconds=seconds, learning_starts=50_000,
                replay_capacity=50_000, steps_per_update=0, eval_episodes=1,
                out=f"{tmp}/run", progress=False, plots=False)
    per = [r for r in s["per_actor_steps_per_s"] if r is not None]
    cpu = {r["role"].split()[0]: 0.0 for r in s["per_rank"]}
    for r in s["per_rank"]:
        cpu[r["role"].split()[0]] += r["cpu_s"]
    steps = s["env_steps"]
    return {"actors": actors, "processes": s["world_size"], "env_steps_per_s": s["actor_steps_per_s"],
            "per_actor_steps_per_s": sum(per) / len(per),
            "actor_cpu_us_per_step": 1e6 * cpu["actor"] / steps,
            "replay_cpu_us_per_step": 1e6 * cpu["replay"] / steps,
            "learner_cpu_us_per_step": 1e6 * cpu["learner"] / steps,
            "cpu_cores_used": sum(cpu.values()) / s["wall_s"],
            "bytes_per_env_step": s["bytes_sent_per_env_step"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--actors", default="1,2,4")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    setups = [0, *(int(x) for x in args.actors.split(","))]  # 0: the loop in-process, no comm
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in setups}
    for _, n in alternating(setups, args.repeats):
        load = os.getloadavg()[0]
        if n == 0:
            alone = in_process(args.seconds)
            row = {"actors": 1, "processes": 1, **alone, "per_actor_steps_per_s": alone["env_steps_per_s"]}
        else:
            row = apex(n, args.seconds)
        runs[n].append({**row, "load_before": load})
        print(n, runs[n][-1], flush=True)
    keys = ["env_steps_per_s", "per_actor_steps_per_s", "actor_cpu_us_per_step", "replay_cpu_us_per_step",
            "learner_cpu_us_per_step", "cpu_cores_used", "bytes_per_env_step", "load_before"]
    rows: list[dict[str, object]] = []
    for n, rs in runs.items():
        setup = (f"apex, {n} actor(s) + replay + idle learner" if n
                 else "1 actor loop in-process, no comm")
        rows.append({"setup": setup, "processes": rs[0]["processes"],
                     **{k: fmt_spread([r[k] for r in rs], 2 if k == "cpu_cores_used" else 0)
                        for k in keys if k in rs[0]}})
    notes = (f"{os.cpu_count()} CPUs. {args.repeats} repeats of {args.seconds:g} s per setup, the setups "
             "taking turns; median (min–max). `*_cpu_us_per_step`: CPU time (process time, all threads) of "
             "all processes of that role per env step; `cpu_cores_used`: CPU seconds of the run's processes "
             "per wall second. `load_before`: the 1-minute load average when the run started (the machine "
             "is shared; other jobs take cores from these processes).")
    write_results("rl_actor_throughput", rows, ["setup", "processes", *keys], notes,
                  extra={"repeats": {str(k): v for k, v in runs.items()}})

if __name__ == "__main__":
    main()
