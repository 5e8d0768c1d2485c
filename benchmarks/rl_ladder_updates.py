"""Learner updates to solve CartPole-v1 for each way of exploring, in ONE process, no distribution.

`apex` on 2 cores needs about 1.9x the learner updates of `dqn` to solve CartPole
(results/rl_time_to_solve.md). This benchmark splits that factor: the same DQN core, replay and
hyperparameters run in one process, deterministically, with the data of

- ``dqn``: one environment, ε decaying 1 → 0.02 over 10k env steps, one env step per update
  (polytrain's `dqn`);
- ``ladderN``: N environments on the Ape-X ladder ε_i = 0.4^(1 + 7·i/(N−1)), stepped in turn,
  ``--steps-per-update`` env steps per update (2 is apex's replay rate limit), as N apex actors
  would feed one learner — but with no lag, no stale priorities, no processes.

So ``dqn → ladder2`` is what the 2-actor ladder's data costs, ``ladder2 → apex`` (the measured
multi-process runs) what the distribution costs, and ``ladder2 → ladder8`` what more actors (more
cores) would change. New transitions enter at the replay's max priority in every variant (apex's
actor-side priorities measured the same, rl_time_to_solve_23ae6a3.md). Greedy evaluations happen
every ``--eval-every`` updates (10 screening episodes, then 100), so a seed gives the same
figures on any machine; a run that has not solved by ``--max-updates`` counts as that many.

    python benchmarks/rl_ladder_updates.py [--variants dqn,ladder2,ladder8] [--seeds 0,1,2,3] [--append]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from harness import command_line, earlier_rows, write_results  # noqa: E402

from polytrain.rl.acting import EpisodeRunner  # noqa: E402
from polytrain.rl.config import make_rl_config  # noqa: E402
from polytrain.rl.core import Layout, QLearner, build_qnet, epsilon_ladder, linear_epsilon  # noqa: E402
from polytrain.rl.envs import greedy_returns  # noqa: E402
from polytrain.rl.replay import PrioritizedReplay, beta_at  # noqa: E402


def solved(net: torch.nn.Module, env: str, target: float, seed: int) -> bool:
    """The monitor's rule: a 10-episode greedy screen, then the 100-episode evaluation."""
    screen, gave_up = greedy_returns(net, env, 10, seed, give_up_below=target)
    if gave_up or float(np.mean(screen)) < target:
        return False
    full, _ = greedy_returns(net, env, 100, seed + 10_000)
    return float(np.mean(full)) >= target


def one(variant: str, seed: int, steps_per_update: int, eval_every: int, max_updates: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    cfg = make_rl_config({"algo": "dqn", "seed": seed})
    layout = Layout(cfg.info.obs_dim)
    ctx = types.SimpleNamespace(cfg=cfg, layout=layout)  # what EpisodeRunner reads
    torch.manual_seed(seed)  # the same initial network as every algorithm
    learner = QLearner(build_qnet(cfg.model, cfg.info, cfg.hidden, cfg.depth), layout, cfg.optimizer,
                       cfg.lr, cfg.grad_clip)
    replay = PrioritizedReplay(cfg.replay_capacity, layout.width, cfg.priority_alpha, seed=seed)
    if variant == "dqn":
        runners, per_update, ladder = [EpisodeRunner(ctx, seed)], 1, None  # type: ignore[arg-type]
    else:
        n = int(variant.removeprefix("ladder"))
        runners = [EpisodeRunner(ctx, seed + 1000 * (i + 1)) for i in range(n)]  # type: ignore[arg-type]
        per_update, ladder = steps_per_update, epsilon_ladder(n, cfg.eps_base, cfg.eps_alpha)
    start = time.perf_counter()
    env_steps, turn, evals, done = 0, 0, 0, False
    while learner.updates < max_updates and not done:
        for _ in range(per_update):
            i = turn % len(runners)
            turn += 1
            eps = (linear_epsilon(env_steps, cfg.eps_start, cfg.eps_end, cfg.eps_decay_steps)
                   if ladder is None else ladder[i])
            rows, _ = runners[i].step(learner.net, eps)
            env_steps += 1
            if rows:
                replay.add(np.stack(rows))
        if len(replay) < cfg.learning_starts:
            continue
        batch = replay.sample(cfg.batch_size, beta_at(learner.updates, cfg.beta0, cfg.beta_steps))
        _, td_abs = learner.update(torch.from_numpy(batch.rows), torch.from_numpy(batch.weights))
        replay.update(batch.ids, td_abs)
        if learner.updates % cfg.target_update == 0:
            learner.sync_target()
        if learner.updates % eval_every == 0:
            evals += 1
            done = solved(learner.net, cfg.env, cfg.target, seed * 1_000_003 + 7_919 * evals)
    row = {"variant": variant, "seed": seed, "solved": done,
           "updates_to_solve": learner.updates if done else None,
           "env_steps": env_steps, "env_steps_per_update": per_update,
           "epsilons": "decay 1→0.02" if ladder is None else "/".join(f"{e:.2g}" for e in ladder),
           "wall_s": time.perf_counter() - start,
           "command": command_line()}
    print(row, flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="dqn,ladder2,ladder8")
    p.add_argument("--seeds", default="0,1,2,3,4,5,6,7")
    p.add_argument("--steps-per-update", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--max-updates", type=int, default=40_000)
    p.add_argument("--name", default="rl_ladder_updates")
    p.add_argument("--append", action="store_true", help="keep the runs already in results/<name>.json")
    args = p.parse_args()
    variants = args.variants.split(",")
    for v in variants:
        if v != "dqn" and not (v.startswith("ladder") and v.removeprefix("ladder").isdigit()):
            p.error(f"--variants: {v!r} is neither 'dqn' nor 'ladderN' (N environments on the ladder)")
    seeds = [int(s) for s in args.seeds.split(",")]
    old = earlier_rows(args.name) if args.append else []
    runs = old + [one(v, s, args.steps_per_update, args.eval_every, args.max_updates)
                  for s in seeds for v in variants]
    variants = list(dict.fromkeys([r["variant"] for r in old] + variants))  # earlier calls' first
    rows = sorted(runs, key=lambda r: (variants.index(r["variant"]), r["seed"]))
    for v in variants:
        mine = [r for r in runs if r["variant"] == v]
        counted = [r["updates_to_solve"] if r["solved"] else args.max_updates for r in mine]
        rows.append({"variant": f"{v} (median)", "seed": "all",
                     "solved": f"{sum(r['solved'] for r in mine)}/{len(mine)}",
                     "updates_to_solve": statistics.median(counted),
                     "env_steps_per_update": mine[0]["env_steps_per_update"],
                     "epsilons": mine[0]["epsilons"]})
    notes = ("One process, deterministic per seed: the same DQN core, replay and hyperparameters as "
             "polytrain's dqn and apex (polytrain/rl/config.py), only the exploration and the env "
             f"steps per update differ. A greedy check every {args.eval_every} updates; an unsolved "
             f"run counts as {args.max_updates} updates in the median. With --append the rows come "
             "from several calls; each row's command is in the JSON.")
    write_results(args.name, rows, ["variant", "seed", "solved", "updates_to_solve", "env_steps",
                                    "env_steps_per_update", "epsilons", "wall_s"], notes,
                  appended=bool(old))


if __name__ == "__main__":
    main()
