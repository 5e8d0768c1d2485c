"""``polytrain rl ALGO``: distributed RL jobs from the command line (thin: parse, validate, run).

    polytrain rl apex --actors 3 --env CartPole-v1 --target-return 475 [--out DIR] [--seed S]
    polytrain rl gorila --actors 2 --learners 2 --servers 2
    polytrain rl dqn --max-seconds 120

Every RLConfig field can also be set with ``--set KEY=VALUE`` (e.g. ``--set send_every=100``).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from polytrain.errors import ConfigError

if TYPE_CHECKING:  # rich loads when something is printed, not with the parser
    from rich.console import Console
    from rich.table import Table

# RLConfig field -> (flag, type, help); the rest are reachable with --set.
RL_FLAGS: list[tuple[str, str, Any, str]] = [
    ("env", "--env", str, "gymnasium classic-control env with discrete actions; default CartPole-v1"),
    ("actors", "--actors", int, "actor processes (apex, gorila); default 2"),
    ("learners", "--learners", int, "learner processes (gorila); default 2"),
    ("servers", "--servers", int, "parameter-server shards (gorila); default 2"),
    ("target_return", "--target-return", float,
     "stop when the greedy policy's mean return over --eval-episodes reaches this; default: the "
     "env's threshold (475 for CartPole-v1)"),
    ("eval_episodes", "--eval-episodes", int, "greedy episodes of a full evaluation; default 100"),
    ("max_seconds", "--max-seconds", float, "wall-clock budget of the run; default 300"),
    ("max_env_steps", "--max-env-steps", int, "stop after this many env steps (0: no limit)"),
    ("seed", "--seed", int, "seed of networks, environments and sampling; default 0"),
    ("model", "--model", str, "Q-network: mlp (zoo) or pkg.module:factory; default mlp"),
    ("hidden", "--hidden", int, "mlp units per hidden layer; default 128"),
    ("depth", "--depth", int, "mlp hidden layers; default 2"),
    ("optimizer", "--optimizer", str, "adam | rmsprop; default adam"),
    ("lr", "--lr", float, "learning rate; default 1e-3"),
    ("gamma", "--gamma", float, "discount; default 0.99"),
    ("n_step", "--n-step", int, "n of the n-step returns; default 3"),
    ("batch_size", "--batch-size", int, "learner batch; default 64"),
    ("target_update", "--target-update", int, "C: learner updates between target-net syncs; default 500"),
    ("replay_capacity", "--replay-capacity", int, "transitions kept (oldest evicted first); default 50000"),
    ("alpha", "--alpha", float, "priority exponent (0: uniform); default 0.6, gorila 0"),
    ("learning_starts", "--learning-starts", int, "transitions stored before learning; default 1000"),
    ("publish_every", "--publish-every", int, "K: lead learner updates between publications; default 20"),
    ("fetch_every", "--fetch-every", int, "actor env steps between parameter fetches; default 50"),
    ("steps_per_update", "--steps-per-update", float,
     "replay rate limit: env steps per learner update, actors wait beyond it (0: off); default 2"),
    ("actor_timeout_s", "--actor-timeout", float, "seconds of silence before an actor is lost; default 10"),
    ("out", "--out", str, "run directory; default runs/<time>-rl-<algo>"),
    ("checkpoint_every", "--checkpoint-every", int,
     "env steps between checkpoints, and one at the end (0: none); --resume RUN continues"),
]


def add_rl_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``rl`` to a CLI's subcommands (``subparsers`` from ``add_subparsers``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "rl", help="distributed RL: dqn | apex | gorila on gymnasium classic control",
        description="Train a DQN agent single-process (dqn) or distributed (apex, gorila).")
    # no argparse choices: they would import the RL config (pydantic, numpy) to build any parser;
    # make_rl_config refuses an unknown algorithm with the valid ones
    p.add_argument("algo", metavar="ALGO", help="dqn | apex | gorila")
    for field, flag, typ, help_ in RL_FLAGS:
        p.add_argument(flag, dest=field, type=typ, default=None, help=help_)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="any other RL option, e.g. --set send_every=100 (see polytrain/rl/config.py)")
    p.add_argument("--resume", metavar="RUN", default=None,
                   help="continue RUN from its checkpoint with its own settings (only the "
                        "stopping and evaluation ones, e.g. --max-env-steps, may change)")
    p.add_argument("--no-plots", action="store_true", help="skip return_vs_time/steps.png")
    p.add_argument("--debug", action="store_true", default=None, help="tracebacks of failures")
    return p


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from polytrain.config import parse_value

    options: dict[str, Any] = {"algo": args.algo}
    for pair in args.sets:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r} must be KEY=VALUE, e.g. --set send_every=100.")
        options[key.strip().replace("-", "_")] = parse_value(value)
    options.update({f: getattr(args, f) for f, *_ in RL_FLAGS if getattr(args, f, None) is not None})
    if args.debug:
        options["debug"] = True
    return options


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.1f}{unit}" if abs(v) >= 10 else f"{v:,.3g}{unit}"
    return f"{v:,}{unit}" if isinstance(v, int) else str(v)


def describe_lost(lost: dict[str, Any]) -> str:
    text = f"actor {lost['actor']} (rank {lost['rank']}, ε={lost['epsilon']:.3g}): {lost['cause']}"
    if lost["exited_at_s"] is not None:
        text += f" at {lost['exited_at_s']:.1f} s"
    if lost["detected_by_replay_at_s"] is not None:
        text += f"; the replay stopped waiting for it at {lost['detected_by_replay_at_s']:.1f} s"
    return text + "; learning went on without it"


def summary_table(s: dict[str, Any]) -> Table:
    from rich.table import Table

    from polytrain.report.units import human_bytes
    from polytrain.rl.config import RLConfig

    cfg = RLConfig(**s["config"])
    solved = "[green]yes[/]" if s["solved"] else f"[yellow]no[/] ({s['stop_reason']})"
    t = Table(title=f"polytrain rl {s['algo']} on {s['env']} — {s['world_size']} process(es)",
              show_header=False)
    t.add_column(style="bold")
    t.add_column()
    rows = [
        ("solved", f"{solved}: target {cfg.target:g} over {s['final_eval_episodes']} greedy episodes"),
        ("time to target", _fmt(s["time_to_target_s"], " s")),
        ("env steps to target", _fmt(s["env_steps_to_target"])),
        ("mean greedy return", f"final {_fmt(s['final_mean_return'])}, best {_fmt(s['best_mean_return'])}"),
        ("env steps / episodes", f"{_fmt(s['env_steps'])} / {_fmt(s['episodes'])}"),
        ("learner updates", f"{_fmt(s['learner_updates'])} ({_fmt(s['learner_updates_per_s'])}/s)"),
        ("actor env steps/s", _fmt(s["actor_steps_per_s"])),
        ("replay size", f"{_fmt(s['replay_size'])} of {_fmt(s['replay_capacity'])}"),
        ("bytes sent", f"{human_bytes(s['bytes_sent'])} ({_fmt(s['bytes_sent_per_env_step'])} B/env step)"),
        ("wall clock", f"{_fmt(s['wall_s'], ' s')} of learning "
                       f"({_fmt(s['launch_wall_s'], ' s')} with start-up and shutdown)"),
    ]
    for lost in s["lost_actors"]:
        rows.append(("[red]lost actor[/]", describe_lost(lost)))
    rows.append(("run directory", s["run_dir"]))
    for k, v in rows:
        t.add_row(k, v)
    return t


def run_rl(args: argparse.Namespace, console: Console) -> int:
    """``polytrain rl``: validate (ConfigError before any process starts), run, print a summary."""
    from rich.console import Console

    from polytrain.rl.api import resume_config, run_config
    from polytrain.rl.config import make_rl_config

    resume = getattr(args, "resume", None)
    options = options_from_args(args)
    cfg = resume_config(resume, options) if resume else make_rl_config(options)
    summary = run_config(cfg, console=Console(stderr=True), plots=not args.no_plots,
                         resume=bool(resume))
    console.print(summary_table(summary))
    return 0
