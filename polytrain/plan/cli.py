"""``polytrain profile`` and ``polytrain plan``: their flags and commands (the planner's side of
the command line; `polytrain.cli` dispatches to them)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from polytrain.errors import ConfigError
from polytrain.flags import add_model_flags, model_overrides

if TYPE_CHECKING:
    from rich.console import Console


def add_plan_parsers(sub: Any) -> None:
    p = sub.add_parser("profile", help="per-layer times and bytes of a model, and the local α–β")
    add_model_flags(p)
    p.add_argument("--out", help="write the profile to this JSON file (the planner reads it offline)")
    p.add_argument("--no-comm", action="store_true", help="skip the 2-process α–β measurement")
    p.add_argument("--rounds", type=int, default=1,
                   help="profile this many times and keep each time's median (a machine whose speed moves)")
    p.add_argument("--gap", type=float, default=0.0, help="seconds between the rounds; default 0")
    p.add_argument("--meta", action="store_true",
                   help="build the model on the meta device (no memory) and count FLOPs and bytes per "
                        "layer instead of timing them: models too large for this machine")
    p.add_argument("--device", default="a100-80gb",
                   help="with --meta: the catalogue device its printed times are priced on (a plan "
                        "prices on its --cluster device); default a100-80gb")
    p = sub.add_parser("plan", help="predict and rank every strategy on a described cluster")
    add_model_flags(p)
    p.add_argument("--cluster", help='e.g. "hosts=64,procs_per_host=8,nic=100gbit,intra=300gbyte,'
                                     'latency=5us"; default: this machine with --procs')
    p.add_argument("--procs", type=int, default=2, help="world size on this machine (no --cluster)")
    p.add_argument("--memory-limit", help="bytes per rank, e.g. 16GiB")
    p.add_argument("--profile", help="a profile from `polytrain profile --out` (default: measure now)")
    p.add_argument("--compute-scale", type=float, default=1.0, help="multiply profiled compute times")
    p.add_argument("--calibration", metavar="FILE",
                   help="price an emulated cluster: its shared cores, shaped links and per-model "
                        "terms from this file (docs/planner.md, Calibration); default: hardware only")
    p.add_argument("--top", type=int, default=5, help="rows of the table; default 5")
    p.add_argument("--allow-inexact", action="store_true",
                   help="recommend strategies that learn differently from single-process training "
                        "too (default: only those that learn exactly as it does)")
    p.add_argument("--json", action="store_true", help="the whole ranking as JSON")
    p.add_argument("--sweep", help="hosts=LO..HI: best predicted samples/s per strategy vs hosts")
    p.add_argument("--strategy", help="price this one strategy with its --set options (e.g. --strategy "
                                      "mesh --set tp=8 --set pp=8 --set dp=24) instead of ranking all")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="the job's precision: 16-bit activations and mixed-precision model state")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="the job recomputes each block's forward in backward")
    p.add_argument("--grad-accum", type=int, default=1, help="the job's micro-steps per optimizer step")
    p.add_argument("--efficiency", type=float, default=None,
                   help="share of the device's peak FLOP/s matrix work reaches (meta profiles); "
                        "default 0.5")
    p.add_argument("--out", help="directory for plan.json and the pictures (default runs/plan-<time>)")


def cmd_profile(args: argparse.Namespace, console: Console) -> int:
    from polytrain.config import load_config
    from polytrain.plan.commands import run_profile

    over = model_overrides(args)
    if args.meta and args.model and not args.dataset and not any(s.startswith("data.") for s in args.sets):
        from polytrain.models.registry import MODELS

        if args.model in MODELS:  # a zoo model's own data (its shape is all a meta profile reads)
            over["dataset"] = MODELS[args.model].default_dataset
    cfg = load_config(None, over, args.sets)
    if args.meta:
        from polytrain.plan.commands import run_meta_profile

        return run_meta_profile(cfg, args.out, args.device, console)
    return run_profile(cfg, args.out, not args.no_comm, console, args.rounds, args.gap)


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from polytrain.config import load_config
    from polytrain.plan.commands import PlanArgs, run_plan

    strategy_sets = [s for s in args.sets if not s.split("=", 1)[0].strip().startswith(("model.", "data."))]
    if strategy_sets and not args.strategy:
        raise ConfigError("polytrain plan takes --set model.KEY=VALUE and data.KEY=VALUE only: it "
                          "chooses the strategy options itself. Fix: drop the strategy --set, or name "
                          "the strategy they belong to with --strategy to price that one configuration.")
    args.sets = [s for s in args.sets if s not in strategy_sets]
    if args.profile and not args.model:
        from pathlib import Path as _P

        from polytrain.cost.profile import Profile

        prof = Profile.load(_P(args.profile))
        over = {"model": prof.model, "dataset": prof.dataset, "optimizer": prof.optimizer,
                "model_options": prof.model_options, "data_options": prof.data_options}
        cfg = load_config(None, {**over, **model_overrides(args)}, args.sets)
    else:
        cfg = load_config(None, model_overrides(args), args.sets)
    a = PlanArgs(args.cluster, args.procs, args.memory_limit, args.profile, args.compute_scale, args.top,
                 args.json, args.sweep, args.out, args.batch_size, args.model is not None,
                 args.allow_inexact, args.precision, args.activation_checkpointing, args.grad_accum,
                 args.efficiency, args.strategy, strategy_sets,
                 calibration=args.calibration)
    return run_plan(cfg, a, console)
