"""RL job description: one validated, frozen model for `dqn`, `apex` and `gorila`.

Every rule is checked here, before any process starts, and each failure is a ConfigError naming
the rule, the value and the fix. The hyperparameters are shared so that the single-process
`dqn` baseline and the distributed algorithms learn with the same settings.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field

from polytrain.appconfig import AppConfig
from polytrain.errors import ConfigError, did_you_mean
from polytrain.rl.envs import EnvInfo, env_info

ALGOS = ("dqn", "apex", "gorila")
Algo = Literal["dqn", "apex", "gorila"]


class RLConfig(AppConfig):
    JOB: ClassVar[str] = "RL job"

    algo: Algo = "apex"
    env: str = "CartPole-v1"
    seed: int = 0
    # stopping and evaluation
    target_return: float | None = None  # None: the env's gymnasium reward_threshold
    eval_episodes: int = Field(100, ge=1)  # greedy episodes that confirm the target (and at the end)
    screen_episodes: int = Field(10, ge=1)  # a cheap greedy check before the full evaluation
    eval_every_s: float = Field(2.0, gt=0)
    max_seconds: float = Field(300.0, gt=0)
    max_env_steps: int = Field(0, ge=0)  # 0: no limit
    checkpoint_every: int = Field(0, ge=0)  # env steps between checkpoints (0: none; see rl/snapshot.py)
    # the Q-network and the DQN update (shared by every algorithm)
    model: str = "mlp"
    hidden: int = Field(128, ge=1)
    depth: int = Field(2, ge=1)
    optimizer: Literal["adam", "rmsprop"] = "adam"
    lr: float = Field(1e-3, gt=0)
    gamma: float = Field(0.99, gt=0, le=1)
    n_step: int = Field(3, ge=1)
    batch_size: int = Field(64, ge=1)
    grad_clip: float = Field(10.0, ge=0)
    target_update: int = Field(500, ge=1)  # C: learner updates between target-network syncs
    # prioritized replay
    replay_capacity: int = Field(50_000, ge=1)
    alpha: float | None = Field(None, ge=0)  # None: 0.6 (dqn, apex), 0 = uniform (gorila, as in the paper)
    beta0: float = Field(0.4, ge=0, le=1)
    beta_steps: int = Field(10_000, ge=0)  # learner updates over which β anneals to 1
    learning_starts: int = Field(1000, ge=1)  # transitions stored before the first update
    # single-process dqn
    eps_start: float = Field(1.0, ge=0, le=1)
    eps_end: float = Field(0.02, ge=0, le=1)
    eps_decay_steps: int = Field(10_000, ge=0)
    train_every: int = Field(1, ge=1)  # env steps per learner update
    # distributed roles
    actors: int = 2
    learners: int = 2  # gorila
    servers: int = 2  # gorila parameter-server shards
    eps_base: float = Field(0.4, ge=0, le=1)
    eps_alpha: float = Field(7.0, ge=0)
    # where new experience gets its first priority: "actor" (Ape-X: each actor's own n-step |TD|)
    # or "max" (the PER paper's rule, as dqn: the largest priority seen so far; actors send none)
    initial_priority: Literal["actor", "max"] = "actor"
    publish_every: int = Field(20, ge=1)  # K: (lead) learner updates between parameter publications
    # actor env steps between parameter fetches. A fetch rides on the next ADD (every send_every
    # transitions), so 50 is the freshest without extra messages; 200 left the actors' policy
    # ~150-250 learner updates behind the learner's (Ape-X's actors lag by far fewer). On 4
    # seeds 50 looked faster (median 18.6 s vs 31.0 s, rl_apex_tuning.md), but that was noise
    # of multi-process runs: on seeds 0-7 apex needs a median 18.1k updates to solve CartPole
    # with 50 and 18.2k with 200 (rl_time_to_solve.md, rows apex2 and apex2_f200): no measured
    # difference. 50 stays (the fresher policy, as Ape-X intends; its cost is negligible).
    fetch_every: int = Field(50, ge=1)
    send_every: int = Field(50, ge=1)  # transitions an actor batches into one message
    prefetch: int = Field(3, ge=1)  # SAMPLE requests a learner keeps in flight
    # batches one SAMPLE request asks for: every message costs ~0.1-0.3 ms of kernel time in gloo's
    # I/O threads on this VM (measured with perf), more than sampling a batch. apex learner
    # updates/s, 2 actors, same quiet window: K=1 183, K=4 286, K=8 343 (dqn: 150)
    sample_batches: int = Field(8, ge=1)
    # replay rate limit: env steps per learner update (0: off). 8 let the replay turn over so fast
    # that CartPole runs peaked and then forgot (measured); 2 is near dqn's 1 (train_every)
    steps_per_update: float = Field(2.0, ge=0)
    # Tried to cut apex's updates to target on CartPole (4 seeds each, median learner updates to
    # target; 2026-11-22/23, under tools/quiet): defaults 10.6k (9 runs), steps_per_update=1 with
    # fetch_every=50 14.9k, sample_batches=2 prefetch=1 (fresher priorities) 12.5k, 3 actors
    # 14.3k, eps_base=0.9 20.6k; dqn 6.6k. None helped, so the defaults stay. Pinning actors and
    # replay to one CPU or nice 10 left the learner's updates/s unchanged (460-500 either way):
    # on a quiet 2-core box the learner already has a core of its own.
    # 2026-11-23, after the per-link groups, cheaper updates and one-descent sampling (8 seeds each,
    # benchmarks/results/rl_time_to_solve_23ae6a3.md): median time to solve dqn 28.9 s, apex2 34.1 s
    # (14.2k updates at 433/s), apex2 with initial_priority="max" 28.7 s (13.5k updates at 464/s)
    # - a tie with dqn, not a win; "actor" (Ape-X's rule) stays the default.
    # 2026-11-23 later (fetch_every 200; 4 seeds each, rl_apex_tuning.md): eps_base 0.2
    # or 0.1 (less exploration) median 46-50 s, eps_alpha 1 (0.4, 0.16) 28.8 s, eps_alpha 3
    # 23.8 s, steps_per_update 1 28.9 s - none clearly better than the defaults (same seeds:
    # 31.0 s). Fused Adam and fetch_every 50, 24 seeds (rl_time_to_solve.md): dqn median 30.9 s
    # (9.7k updates at 363/s), apex2 31.9 s (18.1k updates at 580/s), a tie; apex's spread is
    # narrower. 2026-11-24, the current machine (its update 2.5x faster), 48 seeds: dqn 18.1 s
    # (18.1k updates at 955/s), apex2 12.1 s (17.2k at 1,349/s), apex faster on 33 of 48; with
    # evaluations every 1 s 15.6 vs 13.4 s (rl_time_to_solve.md, rl_time_to_solve_eval1s.md).
    actor_timeout_s: float = Field(10.0, gt=0)  # silence after which an actor is declared lost
    timeout_s: float = Field(120.0, gt=0)  # process-group timeout (a hung server fails the run)
    out: str | None = None
    debug: bool = False

    @property
    def info(self) -> EnvInfo:
        return env_info(self.env)

    @property
    def target(self) -> float:
        return self.info.reward_threshold if self.target_return is None else self.target_return

    @property
    def priority_alpha(self) -> float:
        if self.alpha is not None:
            return self.alpha
        return 0.0 if self.algo == "gorila" else 0.6

    @property
    def world(self) -> int:
        if self.algo == "dqn":
            return 1
        if self.algo == "apex":
            return self.actors + 2
        return self.learners + 1 + self.servers + self.actors


RULES: dict[str, str] = {
    "actors": "the number of actor processes (each runs its own environment)",
    "learners": "the number of gorila learner processes",
    "servers": "the number of gorila parameter-server shards",
}
MAX_PROCESSES = 64


def _check_roles(cfg: RLConfig) -> None:
    roles = ["actors"] + (["learners", "servers"] if cfg.algo == "gorila" else [])
    if cfg.algo == "dqn":
        roles = []
    for name in roles:
        value = getattr(cfg, name)
        if value < 1:
            raise ConfigError(f"--{name} is {RULES[name]} and must be at least 1 (got {value}). "
                              f"Use --{name} 1 or more.")
    if cfg.world > MAX_PROCESSES:
        raise ConfigError(f"{cfg.algo} with these roles needs {cfg.world} processes; polytrain rl "
                          f"starts at most {MAX_PROCESSES} on one machine. Use fewer actors/learners.")


def _check_model(cfg: RLConfig) -> None:
    user = ":" in cfg.model  # pkg.mod:fn (polytrain.models.is_user_model, without importing torch)
    if cfg.model != "mlp" and not user:
        raise ConfigError(
            f"--model {cfg.model!r}: a Q-network maps an observation vector to action values, so "
            "it must be the zoo's 'mlp' (any float input) or your own factory 'pkg.module:fn' "
            "(called with a DataSpec whose input_shape is (obs_dim,) and num_classes the actions)."
        )
    if user:
        from polytrain.models.user import split_target

        split_target(cfg.model)


def _check_consistency(cfg: RLConfig) -> None:
    if cfg.batch_size > cfg.replay_capacity:
        raise ConfigError(f"--batch-size {cfg.batch_size} exceeds --replay-capacity "
                          f"{cfg.replay_capacity}: a batch is drawn from the replay. Lower the batch "
                          "or raise the capacity.")
    if cfg.learning_starts > cfg.replay_capacity:
        raise ConfigError(f"--learning-starts {cfg.learning_starts} exceeds --replay-capacity "
                          f"{cfg.replay_capacity}, so learning would never start. Lower it.")
    if cfg.target_return is not None and not math.isfinite(cfg.target_return):
        raise ConfigError(f"--target-return must be a finite number (got {cfg.target_return}).")
    if cfg.algo == "gorila" and cfg.optimizer != "adam":
        raise ConfigError(f"--optimizer {cfg.optimizer}: gorila's parameter servers (polytrain's `ps` "
                          "servers) apply sgd, momentum, adagrad or adam, and the DQN core offers adam "
                          "or rmsprop. Use --optimizer adam with gorila.")
    if cfg.eps_end > cfg.eps_start:
        raise ConfigError(f"--eps-end {cfg.eps_end} is above --eps-start {cfg.eps_start}; "
                          "exploration decays from start to end. Swap them.")


def check_qnet(cfg: RLConfig) -> None:
    """Build the Q-network once (in the launching process, before any rank starts), so a user
    factory that does not import, raises or returns the wrong shape fails with a ConfigError."""
    import torch

    from polytrain.rl.core import build_qnet

    info = cfg.info
    try:
        net = build_qnet(cfg.model, info, cfg.hidden, cfg.depth)
        with torch.no_grad():
            out = net(torch.zeros(2, info.obs_dim))
    except ConfigError:
        raise
    except Exception as exc:  # the user's factory or forward pass raised
        raise ConfigError(f"--model {cfg.model}: building the Q-network or running it on a batch of "
                          f"{info.name} observations (2, {info.obs_dim}) raised {type(exc).__name__}: "
                          f"{exc}. Fix the factory.") from exc
    if tuple(out.shape) != (2, info.actions):
        raise ConfigError(f"--model {cfg.model}: the Q-network maps observations (B, {info.obs_dim}) "
                          f"to {tuple(out.shape[1:])} per row; DQN needs one value per action of "
                          f"{info.name}, i.e. (B, {info.actions}). Fix the factory's output layer.")


def make_rl_config(data: dict[str, Any]) -> RLConfig:
    """Validate a mapping (CLI flags, Python keywords) into an RLConfig or raise ConfigError."""
    algo = data.get("algo", "apex")
    if algo not in ALGOS:
        raise ConfigError(f"Unknown RL algorithm '{algo}'. {did_you_mean(str(algo), ALGOS)}")
    cfg = RLConfig.parse(data)
    env_info(cfg.env)  # unknown env: lists the valid ones
    _check_roles(cfg)
    _check_model(cfg)
    _check_consistency(cfg)
    return cfg
