"""Time to solve CartPole-v1 (mean greedy return ≥ 475 over 100 episodes): dqn vs apex vs gorila.

Same network, update rule and hyperparameters (polytrain/rl/config.py defaults); each run stops at
the first full evaluation that reaches the target or at ``--max-seconds``. Time is the run's own
clock, from the moment every process is up (start-up is reported apart), evaluation included.
Multi-process runs are not deterministic (timing decides which data a learner sees), so each
algorithm runs on several seeds and the table gives every run and the median.

    python benchmarks/rl_time_to_solve.py [--seeds 0,1,2] [--max-seconds 600] [--algos dqn,apex2,...]
                                          [--append] [--name rl_time_to_solve]

A full comparison takes longer than one quiet window, so ``--append`` adds this call's runs to
the rows already in results/<name>.json (each row keeps the command and the commit that
measured it) and recomputes the medians over all of them.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from harness import command_line, earlier_rows, write_results  # noqa: E402

ALGOS: dict[str, dict[str, Any]] = {
    "dqn": {"algo": "dqn"},
    "apex2": {"algo": "apex", "actors": 2},
    "apex2_f200": {"algo": "apex", "actors": 2, "fetch_every": 200},  # the default before 2026-11-23
    "apex3": {"algo": "apex", "actors": 3},
    # new experience at the replay's max priority (the PER rule dqn uses) instead of the actors' |TD|
    "apex2_maxprio": {"algo": "apex", "actors": 2, "initial_priority": "max"},
    # Ape-X's learner takes much larger batches than DQN (512 vs 32 in the paper); each runs at
    # the same larger batch too, so apex is compared with dqn's best configuration
    "dqn_b128": {"algo": "dqn", "batch_size": 128},
    "dqn_b256": {"algo": "dqn", "batch_size": 256},
    "apex2_b128": {"algo": "apex", "actors": 2, "batch_size": 128},
    "apex2_b256": {"algo": "apex", "actors": 2, "batch_size": 256},
    "apex2_b512": {"algo": "apex", "actors": 2, "batch_size": 512},
    # actors fetch parameters every 50 env steps instead of 200: at ~350 steps/s per actor and
    # ~300 learner updates/s, 200 steps is a policy ~170 updates old (Ape-X's actors lag the
    # learner by far fewer updates: they fetch every 400 frames while it makes ~19 updates/s)
    "apex2_b256_f50": {"algo": "apex", "actors": 2, "batch_size": 256, "fetch_every": 50},
    "gorila": {"algo": "gorila", "actors": 2, "learners": 2, "servers": 2},
    "gorila_l2s1a1": {"algo": "gorila", "actors": 1, "learners": 2, "servers": 1},
    # Ape-X-specific settings tried on 2 cores (the DQN core stays dqn's): a less exploratory
    # ladder (with 2 actors, eps_base e gives e and e^8), and the replay ratio
    "apex2_e02": {"algo": "apex", "actors": 2, "eps_base": 0.2},
    "apex2_e01": {"algo": "apex", "actors": 2, "eps_base": 0.1},
    "apex2_r1": {"algo": "apex", "actors": 2, "steps_per_update": 1.0},
    "apex2_f50": {"algo": "apex", "actors": 2, "fetch_every": 50},
    # a flatter ladder: eps_alpha 1 gives 0.4 and 0.16, 3 gives 0.4 and 0.026 (7: 0.4 and 0.00066)
    "apex2_a1": {"algo": "apex", "actors": 2, "eps_alpha": 1.0},
    "apex2_a3": {"algo": "apex", "actors": 2, "eps_alpha": 3.0},
    "apex2_f50a3": {"algo": "apex", "actors": 2, "fetch_every": 50, "eps_alpha": 3.0},
    # the least stale apex: one batch per SAMPLE request and none ahead (priorities land before
    # the next draw), parameters published every update and fetched every 10 env steps (a fetch
    # rides on an ADD, so ADDs every 10 transitions); slower per update, run to count updates
    "apex2_fresh": {"algo": "apex", "actors": 2, "sample_batches": 1, "prefetch": 1, "publish_every": 1,
                    "fetch_every": 10, "send_every": 10},
    # evaluation every 1 s instead of 2: a check is a moment a transient passing policy can be
    # caught at, and the 2-s default quantises times to solve; each compares with its own dqn
    "dqn_e1": {"algo": "dqn", "eval_every_s": 1.0},
    "apex2_e1": {"algo": "apex", "actors": 2, "eval_every_s": 1.0},
    # smaller gorila: fewer processes on 2 cores
    "gorila_l1s1a1": {"algo": "gorila", "actors": 1, "learners": 1, "servers": 1},
    "gorila_l1s1a2": {"algo": "gorila", "actors": 2, "learners": 1, "servers": 1},
}


BASELINE = {"apex2_e1": "dqn_e1"}  # the dqn that an algorithm is compared with (default: dqn)
CPU_KEYS = ("learner_cpu_ms_per_update", "learn_ms_per_update", "learner_busy", "helpers_cores", "cores_used")


def where_the_cpu_goes(s: dict[str, Any]) -> dict[str, Any]:
    """CPU seconds per role (process time, gloo's threads included) and the lead learner's split
    of its wall clock: learning (its updates; dqn's also sample and act), evaluation, the rest."""
    ranks = s["per_rank"]
    lead = next(r for r in ranks if r["rank"] == 0)
    res, wall, updates = lead["result"], s["wall_s"], max(1, s["learner_updates"])
    helpers = sum(r["cpu_s"] for r in ranks if r["rank"] != 0)
    return {"learner_cpu_ms_per_update": 1e3 * lead["cpu_s"] / updates,
            "learn_ms_per_update": 1e3 * res.get("learn_s", 0.0) / updates,
            "eval_s": res.get("eval_s"), "learner_busy": lead["cpu_s"] / wall,
            "helpers_cores": helpers / wall, "cores_used": (lead["cpu_s"] + helpers) / wall}


def solve_times(runs: list[dict[str, Any]], algo: str) -> dict[int, float]:
    """seed -> time to solve (an unsolved run counts as its budget)."""
    return {r["seed"]: r["time_to_target_s"] if r["solved"] else r["budget_s"] for r in runs
            if r["algo"] == algo}


def versus(runs: list[dict[str, Any]], algo: str, base: str = "dqn", draws: int = 10_000) -> str:
    """How ``algo`` compares with ``base`` over the seeds both ran: medians, the seeds on which
    it was faster, and a bootstrap of the median difference (each algorithm's runs resampled
    independently: runs of one seed share nothing but the seed, so they are not paired)."""
    a, b = solve_times(runs, algo), solve_times(runs, base)
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return ""
    ta, tb = [a[s] for s in seeds], [b[s] for s in seeds]
    rng = random.Random(0)
    med, mean = statistics.median, statistics.mean
    diffs = sorted(med(rng.choices(tb, k=len(tb))) - med(rng.choices(ta, k=len(ta))) for _ in range(draws))
    faster = sum(x < y for x, y in zip(ta, tb, strict=True))
    return (f"`{algo}` vs `{base}` over the {len(seeds)} seeds both ran: median {med(ta):.1f} s "
            f"vs {med(tb):.1f} s (means {mean(ta):.1f} vs {mean(tb):.1f} s); "
            f"`{algo}` faster on {faster} of {len(seeds)} seeds; {base} minus {algo}, bootstrap of the "
            f"median difference ({draws} draws): 5% {diffs[draws // 20]:+.2f} s, 50% "
            f"{diffs[draws // 2]:+.2f} s, 95% {diffs[draws - draws // 20]:+.2f} s; "
            f"{algo} not faster in {sum(d <= 0 for d in diffs) / draws:.1%} of draws.")


def one(name: str, seed: int, budget: float) -> dict[str, Any]:
    from polytrain.rl.api import run

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        s = run(seed=seed, max_seconds=budget, out=f"{tmp}/run", progress=False, plots=False, **ALGOS[name])
    row = {"algo": name, "processes": s["world_size"], "seed": seed, "solved": s["solved"],
           "time_to_target_s": s["time_to_target_s"], "env_steps_to_target": s["env_steps_to_target"],
           "learner_updates": s["learner_updates"], "updates_per_s": s["learner_updates_per_s"],
           "env_steps_per_s": s["actor_steps_per_s"], "final_mean_return": s["final_mean_return"],
           "startup_s": s["startup_s"], "budget_s": budget, "load_before": load}
    row.update(where_the_cpu_goes(s))
    row["load_after"] = os.getloadavg()[0]
    row["command"] = command_line()
    row["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                                   capture_output=True).stdout.strip()
    print(row, flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--algos", default=",".join(ALGOS))
    p.add_argument("--append", action="store_true", help="keep the runs already in the results")
    p.add_argument("--name", default="rl_time_to_solve", help="results/<name>.json and .md")
    args = p.parse_args()
    seeds = [int(x) for x in args.seeds.split(",") if x]  # --append --seeds "": rewrite the tables
    old = earlier_rows(args.name) if args.append else []
    runs = old + [one(name, seed, args.max_seconds) for seed in seeds for name in args.algos.split(",")]
    rows = sorted(runs, key=lambda r: (list(ALGOS).index(r["algo"]), r["seed"]))
    for name in [a for a in ALGOS if any(r["algo"] == a for r in runs)]:
        mine = [r for r in runs if r["algo"] == name]
        times = [r["time_to_target_s"] if r["solved"] else r["budget_s"] for r in mine]
        rows.append({"algo": f"{name} (median)", "processes": mine[0]["processes"], "seed": "all",
                     "solved": f"{sum(r['solved'] for r in mine)}/{len(mine)}",
                     "time_to_target_s": statistics.median(times),
                     "learner_updates": statistics.median(r["learner_updates"] for r in mine),
                     "updates_per_s": statistics.median(r["updates_per_s"] for r in mine),
                     **{k: statistics.median(r[k] for r in mine) for k in CPU_KEYS
                        if all(k in r for r in mine)}})
    notes = ("`budget_s`: the run's wall-clock limit (an unsolved run counts as its budget in the median). "
             "Runs are measured one at a time, with no other benchmark or test running; `load_before`: "
             "the 1-minute load average when the run started (it decays slowly from earlier work), "
             "`load_after` when it ended. "
             "Where the CPU goes: `learner_cpu_ms_per_update` is the lead learner's process CPU per "
             "update (dqn: acting, replay and evaluation included), `learn_ms_per_update` the wall "
             "time of its update step alone (dqn: with sampling), `learner_busy` its CPU seconds "
             "per wall second, `helpers_cores` the CPU of every other process (actors, replay) per "
             "wall second, `cores_used` both (2 = the whole machine).")
    comparisons = [versus(runs, a, BASELINE.get(a, "dqn")) for a in ALGOS
                   if not a.startswith("dqn") and any(r["algo"] == a for r in runs)]
    notes += "".join(f"\n\n{c}" for c in comparisons if c)
    write_results(args.name, rows,
                  ["algo", "processes", "seed", "solved", "time_to_target_s", "env_steps_to_target",
                   "learner_updates", "updates_per_s", "env_steps_per_s", "startup_s", "budget_s",
                   "learner_cpu_ms_per_update", "learn_ms_per_update", "eval_s", "learner_busy",
                   "helpers_cores", "cores_used", "load_before", "load_after", "commit"], notes,
                  appended=bool(old))


if __name__ == "__main__":
    main()
