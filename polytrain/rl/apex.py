"""`apex` (Horgan et al. 2018): many actors, one prioritized replay, one learner.

    actors 0..N-1 ──ADD(rows, |TD|, episodes)──▶ replay ◀──SAMPLE(prio t−1)── learner
          ▲                                        │  ──batch t, IS weights──▶   │
          └──────────FETCH every fetch_every────── ◀──PUBLISH every K updates────┘

The learner samples by priority, updates on the batch with IS weights, sends the new |TD| back
with its next request, and every ``publish_every`` (K) updates publishes its parameters, which
the actors fetch every ``fetch_every`` env steps. The target network is synced every
``target_update`` (C) updates. Old experience leaves the replay first (FIFO).
"""

from __future__ import annotations

from typing import Any

from polytrain.rl.checkpoint import load_part
from polytrain.rl.dqn import make_learner
from polytrain.rl.learner import Publisher, ReplayClient, batch_tensors, learn_loop
from polytrain.rl.monitor import Counters, Monitor
from polytrain.rl.protocol import wind_down
from polytrain.rl.replay import Batch
from polytrain.rl.roles import RoleContext
from polytrain.rl.snapshot import Saver, learner_state, restore_learner


def run_apex_learner(ctx: RoleContext) -> dict[str, Any]:
    cfg = ctx.cfg
    learner = make_learner(ctx)
    client = ReplayClient(ctx)
    monitor = Monitor(cfg, ctx.recorder)
    c = Counters()
    publisher = Publisher(learner.net, cfg.publish_every)
    if ctx.extra.get("resume"):
        state = load_part(ctx.run_dir, ctx.cfg, ctx.rank)
        c.updates = restore_learner(learner, state, publisher)
        monitor.eval_index = state["eval_index"]
    saver = Saver(ctx, True, lambda k: learner_state(learner, c.updates, k, True, publisher,
                                                     monitor.eval_index))

    def learn(batch: Batch) -> Any:
        _, td_abs = learner.update(*batch_tensors(batch))
        if learner.updates % cfg.target_update == 0:
            learner.sync_target()
        c.updates = learner.updates
        return td_abs

    timing = learn_loop(ctx, client, learn, c, monitor, learner.net, lambda: publisher.due(c.updates),
                        saver)
    wind_down(ctx.links, (client.replay,))
    result = monitor.final(learner.net, c)
    result.update(timing)
    result.update(env_steps=c.env_steps, episodes=c.episodes, replay_size=c.replay_size,
                  params_published=publisher.version, alive_actors=c.alive_actors)
    ctx.save_model(learner.net)
    return result
