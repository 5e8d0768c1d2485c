"""`dqn`: the single-process baseline — one environment, one prioritized replay, one learner.

Same network, update rule (double DQN, n-step, target network), optimizer and replay settings
as `apex` and `gorila`, so that comparing them measures the distribution and nothing else. The
one difference a single actor forces: exploration decays linearly (``eps_start`` → ``eps_end``
over ``eps_decay_steps``) instead of the per-actor ε ladder, and new transitions enter the
replay at the maximum priority seen so far (the PER paper's rule) since no actor computed one.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from polytrain.rl import checkpoint
from polytrain.rl.acting import EpisodeRunner
from polytrain.rl.core import QLearner, build_qnet, linear_epsilon
from polytrain.rl.monitor import Counters, Monitor, ReturnWindow
from polytrain.rl.replay import PrioritizedReplay, beta_at
from polytrain.rl.roles import RoleContext


def make_learner(ctx: RoleContext) -> QLearner:
    cfg = ctx.cfg
    torch.manual_seed(cfg.seed)  # every algorithm starts from the same initial network
    net = build_qnet(cfg.model, cfg.info, cfg.hidden, cfg.depth)
    return QLearner(net, ctx.row, cfg.optimizer, cfg.lr, cfg.grad_clip)


def run_dqn(ctx: RoleContext) -> dict[str, Any]:
    cfg = ctx.cfg
    learner = make_learner(ctx)
    replay = PrioritizedReplay(cfg.replay_capacity, ctx.row.width, cfg.priority_alpha, seed=cfg.seed)
    episodes = EpisodeRunner(ctx, cfg.seed)
    monitor = Monitor(cfg, ctx.recorder)
    window = ReturnWindow()
    c = Counters(alive_actors=1)
    if ctx.extra.get("resume"):  # continue exactly where the checkpoint left off
        state = checkpoint.load(ctx.run_dir, cfg)
        checkpoint.restore(state, learner, replay, episodes, window)
        c.episodes, monitor.eval_index = state["episodes"], state["eval_index"]
    start = time.perf_counter()
    updates0, steps0 = learner.updates, episodes.steps  # a resumed run's rates: this launch's
    learn_s = 0.0

    def save() -> None:
        checkpoint.save(ctx.run_dir, cfg, checkpoint.dqn_state(learner, replay, episodes, window, c.episodes,
                                                               monitor.eval_index, ctx.recorder.now()))

    while True:
        eps = linear_epsilon(episodes.steps, cfg.eps_start, cfg.eps_end, cfg.eps_decay_steps)
        rows, ended = episodes.step(learner.net, eps)
        if rows:
            replay.add(np.stack(rows))
        if ended is not None:
            window.add(ended[0])
            c.episodes += 1
            ctx.recorder.emit("episode", actor=0, epsilon=eps, ret=ended[0], length=ended[1],
                              actor_steps=episodes.steps)
        if len(replay) >= max(cfg.learning_starts, cfg.batch_size) and episodes.steps % cfg.train_every == 0:
            t = time.perf_counter()
            batch = replay.sample(cfg.batch_size, beta_at(learner.updates, cfg.beta0, cfg.beta_steps))
            _, td_abs = learner.update(torch.from_numpy(batch.rows), torch.from_numpy(batch.weights))
            replay.update(batch.ids, td_abs)
            if learner.updates % cfg.target_update == 0:
                learner.sync_target()
            learn_s += time.perf_counter() - t
        c.env_steps, c.updates, c.train_return, c.replay_size = (
            episodes.steps, learner.updates, window.mean, len(replay))
        if cfg.checkpoint_every and episodes.steps % cfg.checkpoint_every == 0:
            save()
        if monitor.tick(learner.net, c):
            if monitor.stop_reason == "interrupted" and cfg.checkpoint_every:  # resume from here
                save()
            break
    wall = time.perf_counter() - start
    result = monitor.final(learner.net, c)
    result.update(
        env_steps=c.env_steps, episodes=c.episodes, learner_updates=c.updates,
        learner_updates_per_s=(c.updates - updates0) / wall, actor_steps_per_s=(c.env_steps - steps0) / wall,
        replay_size=len(replay), learn_s=learn_s, wall_s=wall, lost_actors=[],
    )
    ctx.save_model(learner.net)
    return result
