"""``apex`` and ``gorila`` checkpoints: a consistent cut of the learner(s), the replay and the shards.

Checkpoint k is taken when the env steps the lead learner reads from the replay pass a multiple
of ``checkpoint_every``, and at the end of the run (any stop but a failure)::

    1. lead learner  right after a SAMPLE reply: SAMPLE (the priorities of every update it has
                     made), then SAVE(k, U, t) to the replay; writes its own file — its state
                     after U updates (networks, optimizer [apex], U, publications, eval index,
                     torch RNG). gorila: then SAVE(k) to every shard (PSClient.save), waiting.
    2. replay        handles SAVE after that SAMPLE, so the priorities of all U updates are in:
                     writes its file (transitions, priorities, sampling RNG, counters, per-actor
                     figures, return window, the relayed parameters and their version, U) and
                     answers; every later SAMPLE reply announces k (header field 5).
    3. gorila        every other learner, seeing k announced, writes its file and sends SAVE(k)
                     to every shard; a shard with every learner's SAVE writes its file (shard,
                     Adam state, async clocks, version: the `ps` server's cut, each push in it
                     or not) and acks. So when the lead's PSClient.save returns, every learner
                     and shard has written.
    4. lead learner  when the replay's answer arrives: commits checkpoint k in the run's store
                     (:func:`polytrain.rl.checkpoint.store`: every process wrote its
                     ``step-k.tmp/rank{R}.pt``; the manifest and ``LATEST`` make it exist from
                     then on) with the cut's figures, and prunes the older ones.

Every process's part was taken after every message it holds was sent from the sender's part
(a cut). Left out, by design: batches sampled but not yet learned (the resumed learner samples
anew), priorities a non-lead gorila learner sent between the replay's cut and its own, and the
actors — their unsent transitions and the episode in progress. Resumed actors start new
episodes from fresh seeds and fetch the checkpoint's parameters at their first step. So a
resumed apex/gorila run continues from the saved state but, with asynchronous actors, is not
the uninterrupted run bit for bit (``dqn`` is: :mod:`polytrain.rl.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from polytrain.rl.checkpoint import KEEP, replay_buffer_state, restore_replay_buffer, saved_info, store

if TYPE_CHECKING:
    from polytrain.rl.config import RLConfig

SAVE_FIELD = 5  # SAMPLE replies: the newest checkpoint the replay has written its part of


def write_part(run_dir: Path, cfg: RLConfig, rank: int, k: int, state: dict[str, Any]) -> None:
    """This rank's file of checkpoint ``k`` (staged in the run's store), complete on disk before
    anyone is told."""
    store(run_dir, cfg).write_rank(k, rank, state)


def seal(run_dir: Path, cfg: RLConfig, meta: dict[str, Any]) -> Path:
    """Commit checkpoint ``meta['save']`` (every part written) with ``meta`` as its figures; the
    older ones beyond :data:`~polytrain.rl.checkpoint.KEEP` are pruned (a newer one on its way,
    still staged, is kept)."""
    return store(run_dir, cfg).commit(int(meta["save"]), keep=KEEP, info=meta)


# ---- what each role keeps ----------------------------------------------------------------------


def replay_state(server: Any, updates: int, k: int) -> dict[str, Any]:
    """The replay process's part (``server``: a ReplayServer)."""
    return {
        "save": k, "learner_updates": updates, "buffer": replay_buffer_state(server.replay),
        "window": list(server.window.values), "env_steps": server.env_steps, "episodes": server.episodes,
        "per_actor": {str(r): dict(v) for r, v in server.per_actor.items()},
        "samples": server.samples, "batches": server.batches, "priority_updates": server.priority_updates,
        "stale_updates": server.stale_updates, "version": server.version,
        "params": server.params.clone() if server.params is not None else torch.empty(0),
    }


def restore_replay(server: Any, state: dict[str, Any]) -> None:
    restore_replay_buffer(server.replay, state["buffer"])
    server.window.values.clear()
    server.window.values.extend(state["window"])
    server.env_steps, server.episodes = state["env_steps"], state["episodes"]
    for rank, stats in state["per_actor"].items():
        server.per_actor[int(rank)] = dict(stats)
    server.samples, server.batches = state["samples"], state["batches"]
    server.priority_updates, server.stale_updates = state["priority_updates"], state["stale_updates"]
    server.version = state["version"]
    server.params = state["params"] if state["params"].numel() else None
    server.saved = state["save"]


def learner_state(learner: Any, updates: int, k: int, optimizer: bool, publisher: Any = None,
                  eval_index: int = 0) -> dict[str, Any]:
    """A learner's part: its networks (gorila: its copy of the shards' parameters), its update
    count, the optimizer where it owns one (apex), the publications and eval index (the lead)."""
    state: dict[str, Any] = {"save": k, "updates": updates, "net": learner.net.state_dict(),
                             "target": learner.target.state_dict(), "eval_index": eval_index,
                             "torch_rng": torch.get_rng_state()}
    if optimizer:
        state["optimizer"] = learner.opt.state_dict()
    if publisher is not None:
        state["published"] = [publisher.version, publisher.at]
    return state


def restore_learner(learner: Any, state: dict[str, Any], publisher: Any = None) -> int:
    """Load a learner's part; returns its update count."""
    learner.net.load_state_dict(state["net"])
    learner.target.load_state_dict(state["target"])
    if "optimizer" in state:
        learner.opt.load_state_dict(state["optimizer"])
    learner.updates = state["updates"]
    if publisher is not None and "published" in state:
        publisher.version, publisher.at = state["published"]
    torch.set_rng_state(state["torch_rng"])
    return int(state["updates"])


class Saver:
    """A learner's side of checkpoints: when to take one, its own file, and (the lead) the seal.

    ``state()`` gives the learner's part; ``ps`` (gorila) is its PSClient, whose ``save`` waits
    until every learner and shard has written. The lead decides (by env steps); the others
    follow the replay's announcement."""

    def __init__(self, ctx: Any, lead: bool, state: Any, ps: Any = None) -> None:
        self.ctx, self.lead, self.state, self.ps = ctx, lead, state, ps
        self.every = ctx.cfg.checkpoint_every
        self.k = 0  # the newest checkpoint this learner has written its part of
        self.mark = 0  # env steps // every at that checkpoint
        self.taken: dict[int, dict[str, Any]] = {}  # lead: checkpoints written, not yet sealed
        if ctx.extra.get("resume"):
            meta = saved_info(ctx.run_dir, ctx.cfg)
            self.k, self.mark = int(meta["save"]), int(meta["env_steps"]) // max(1, self.every)

    def due(self, env_steps: int, fields: Sequence[float]) -> int | None:
        """The checkpoint to take now, if any (the lead: every ``every`` env steps)."""
        if not self.every:
            return None
        if self.lead:
            return self.k + 1 if env_steps // self.every > self.mark else None
        announced = int(fields[SAVE_FIELD]) if len(fields) > SAVE_FIELD else 0
        return announced if announced > self.k else None

    def take(self, k: int, env_steps: int, updates: int) -> None:
        """Write this learner's part of checkpoint ``k`` (after the lead's SAVE went out), then,
        gorila, SAVE to the shards and wait for every learner and shard."""
        t = self.ctx.recorder.now()
        self.k, self.mark = k, env_steps // max(1, self.every)
        write_part(self.ctx.run_dir, self.ctx.cfg, self.ctx.rank, k, self.state(k))
        if self.ps is not None:
            self.ps.save(k)
        if self.lead:
            self.taken[k] = {"save": k, "updates": updates, "t": t}

    def acked(self, k: int, fields: Sequence[float]) -> None:
        """The replay has written its part of ``k``: the lead seals the checkpoint."""
        meta = self.taken.pop(k)
        meta.update(algo=self.ctx.cfg.algo, env_steps=int(fields[0]), episodes=int(fields[1]),
                    transitions=int(fields[2]), params_version=int(fields[3]))
        seal(self.ctx.run_dir, self.ctx.cfg, meta)
        self.ctx.recorder.emit("checkpoint", save=k, env_steps=meta["env_steps"], updates=meta["updates"])
