"""``polytrain``: a thin command line — it parses, validates and delegates."""

from __future__ import annotations

import argparse
import atexit
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import polytrain.env as env
from polytrain.errors import ConfigError, Interrupted, PolytrainError
from polytrain.flags import add_job_flags, job_argv, overrides
from polytrain.version import __version__

if TYPE_CHECKING:  # rich loads when something is printed: --help and --version need none of it
    from rich.console import Console

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polytrain",
        description="Train a PyTorch model with classic parallel techniques, measure, compare.",
    )
    parser.add_argument("--version", action="version", version=f"polytrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("train", help="train one job (no arguments: CNN on digits, 2 processes)")
    add_job_flags(p)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.add_argument("--bind", metavar="ADDR",
                   help="address the job's c10d stores listen on (one machine: default none, "
                        "the stores are files only you can open; under torchrun: rank 0's store, "
                        "default MASTER_ADDR's own)")
    p.add_argument("--cluster", help="with --strategy auto: plan for this cluster (see `polytrain plan`)")
    p.add_argument("--allow-inexact", action="store_true",
                   help="with --strategy auto: may choose a strategy that learns differently from "
                        "single-process training (averaging period, staleness, a gradient codec)")
    p = sub.add_parser("compare", help="run several strategies on the same job, one table")
    p.add_argument("--strategies", required=True, help="comma-separated ids, e.g. single,allreduce")
    p.add_argument("--target-accuracy", type=float, help="report time to reach this test accuracy")
    add_job_flags(p, with_strategy=False)
    p = sub.add_parser("schedule", help="print and draw a pipeline schedule (pure data, no processes)")
    p.add_argument("name", help="gpipe | 1f1b | pipedream | interleaved-1f1b | looped-bfs | zb-h1 |"
                                        " zbv | dualpipev")
    p.add_argument("--stages", type=int, default=4, help="pipeline stages (ranks) P; default 4")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches M; default 8")
    p.add_argument("--virtual-stages", type=int, help="model chunks per rank V (interleaved, looped)")
    p.add_argument("--cost", help="slot cost per op, e.g. F=1,B=2,W=1 (default 1 each)")
    p.add_argument("--png", help="also draw it to this PNG file")
    from polytrain.testbed.job import add_testbed_parser

    add_testbed_parser(sub)
    from polytrain.plan.cli import add_plan_parsers

    add_plan_parsers(sub)
    p = sub.add_parser("export", help="a checkpoint as a plain state_dict in your model's own key names")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the newest good one)")
    p.add_argument("--out", required=True, help="file to write (load it with torch.load)")
    p = sub.add_parser("report", help="plots, timeline and report.md of a run or compare directory")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard scalars")
    from polytrain.rl.cli import add_rl_parser

    add_rl_parser(sub)
    from polytrain.aco.cli import add_aco_parser

    add_aco_parser(sub)
    p = sub.add_parser("strategies", help="list the strategies, or one strategy's options")
    p.add_argument("name", nargs="?", help="a strategy id: print its options (type, default, meaning)")
    sub.add_parser("models", help="list the model zoo with parameter counts")
    sub.add_parser("datasets", help="list the built-in datasets")
    return parser


def _report(console: Console, path: Path, skip: bool, tensorboard: bool = False) -> None:
    """Plots, timeline and report.md next to the run's files (unless --no-report)."""
    if tensorboard:
        from polytrain.report.tensorboard import export_tensorboard

        runs = [path] if (path / "summary.json").is_file() else sorted(
            p.parent for p in path.glob("*/summary.json"))
        for run in runs:
            export_tensorboard(run)
        console.print(f"tensorboard: tensorboard --logdir {path}", highlight=False)
    if skip:
        return
    from polytrain.report import write_report

    written = write_report(path)
    md = next((p for p in written if p.suffix == ".md"), None)
    console.print(f"report: {md or path} ({len(written)} files)", highlight=False)


def _resolve_auto(args: argparse.Namespace) -> None:
    """``--strategy auto``: the planner's first choice replaces the strategy and its options."""
    if args.strategy != "auto":
        for flag, given in (("--cluster", args.cluster is not None), ("--allow-inexact", args.allow_inexact)):
            if given:
                raise ConfigError(f"{flag} is read by --strategy auto only. Fix: add --strategy auto, "
                                  f"or drop {flag}.")
        return
    if any("." not in s.split("=", 1)[0] for s in args.sets):
        raise ConfigError("--strategy auto chooses the strategy options itself. Fix: drop the strategy "
                          "--set options (model.* and data.* are fine), or name a strategy.")
    import json

    from polytrain import api
    from polytrain.config import load_config
    from polytrain.launch.rundir import TESTBED_ENV
    from polytrain.plan.commands import auto_strategy

    if api.under_torchrun():
        raise ConfigError("--strategy auto is resolved before launch, not on each torchrun rank (each "
                          "would measure its own profile). Fix: run `polytrain plan` and pass its "
                          "recommended --strategy and --set options.")
    cfg = load_config(args.config, {**overrides(args), "strategy": "single"}, args.sets)
    testbed = os.environ.get(TESTBED_ENV)
    best = auto_strategy(cfg, args.cluster, json.loads(testbed) if testbed else None, args.allow_inexact)
    args.strategy, args.procs = best.strategy, best.procs
    args.sets = [*args.sets, *(f"{k}={v}" for k, v in best.options.items())]
    from rich.console import Console

    Console(stderr=True).print(
        f"auto: {best.label} on {best.procs} process(es), predicted {best.estimate.step_s * 1e3:.1f} "
        f"ms/step ({best.samples_per_s:,.0f} samples/s)", highlight=False)


def cmd_train(args: argparse.Namespace, console: Console) -> int:
    from polytrain import api

    _resolve_auto(args)
    if args.bind:
        from polytrain.launch.stores import BIND_ENV, check_bindable

        check_bindable(args.bind)
        os.environ[BIND_ENV] = args.bind  # read by the launcher and by rank 0's store
    if api.under_torchrun():
        from polytrain.launch.torchrun import train_under_torchrun
        from polytrain.launch.worker import exit_now

        # a torchrun rank of the CLI ends as the local launcher's ranks do (see exit_now)
        from polytrain.plan.predict import record_prediction

        exit_now(train_under_torchrun(args.config, overrides(args), args.sets, args.resume,
                                      no_report=args.no_report, finished=record_prediction))
    from rich.console import Console

    summary = api.train(config=args.config, sets=args.sets, resume=args.resume, report=False,
                        console=Console(stderr=True), **overrides(args)).to_dict()
    from polytrain.report import format_summary

    run_dir = summary["config"]["out"]
    console.print(format_summary(summary, run_dir))
    from polytrain.runtime import startup_trace

    startup_trace.mark("summary printed")  # the trace's last mark: what follows is the exit
    startup_trace.write_launcher(Path(run_dir))
    _report(console, Path(run_dir), args.no_report, args.tensorboard)
    return 0


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    from rich.console import Console

    from polytrain import api

    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    result = api.compare(names, config=args.config, sets=args.sets,
                         target_accuracy=args.target_accuracy, console=Console(stderr=True),
                         **overrides(args))
    from polytrain.report import summary_table

    console.print(summary_table(result["strategies"], args.target_accuracy,
                                title="comparison: same model, data and global batch"))
    console.print(f"compare.json: {Path(result['out']) / 'compare.json'}", highlight=False)
    _report(console, Path(result["out"]), args.no_report, args.tensorboard)
    return 0


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    _report(console, Path(args.run_dir), skip=False, tensorboard=args.tensorboard)
    return 0


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    import torch

    from polytrain.launch.export import export_checkpoint

    state, step = export_checkpoint(Path(args.run_dir), args.step)
    torch.save(state, args.out)
    console.print(f"{args.out}: step {step}, {len(state)} tensors in your model's key names",
                  highlight=False)
    return 0


def cmd_schedule(args: argparse.Namespace, console: Console) -> int:
    from polytrain.strategies.pipeline.draw import parse_cost, schedule_cli

    cost = parse_cost(args.cost) if args.cost else None
    png = Path(args.png) if args.png else None
    console.print(schedule_cli(args.name, args.stages, args.microbatches, png, cost=cost,
                               virtual=args.virtual_stages),
                  highlight=False, markup=False)
    return 0


def cmd_testbed(args: argparse.Namespace, job: list[str], console: Console) -> int:
    """Parse and validate the job after ``--`` for the testbed's hosts (every rule the hosts' own
    ``prepare()`` applies), before any emulated host starts, then run it."""
    import time

    from polytrain.plan.calibrate import checked_calibration
    from polytrain.testbed.job import Bed, TestbedJob, per_host, run_testbed

    if not job or job[0] not in ("train", "compare", "aco"):
        raise ConfigError(
            "polytrain testbed runs a train, compare or aco job after '--', e.g. "
            "polytrain testbed --hosts 4 --nic 1gbit -- train --strategy allreduce --procs 4")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    cal = checked_calibration(getattr(args, "calibration", None))
    if job[0] == "aco":
        from polytrain.aco.cli import parse_aco_job

        ns, host_args = parse_aco_job(job[1:])
        nper = per_host(args.hosts, ns.procs, args.procs_per_host)
        parse_aco_job(job[1:], args.hosts * nper)  # every rule of `polytrain aco` for this world
        spec = TestbedJob("aco", Path(ns.out or f"runs/{stamp}-testbed-aco"), nper, tuple(host_args))
    else:
        from polytrain.config import load_config
        from polytrain.launch.prepare import prepare

        ns = build_parser().parse_args(job)
        nper = per_host(args.hosts, ns.procs, args.procs_per_host)
        if job[0] == "train" and ns.strategy == "auto":  # the planner's choice, before any host starts
            from polytrain.plan.calibrate import resolve_auto

            bed = Bed(args.hosts, args.nic, args.latency, args.loss)
            console.print(resolve_auto(ns, bed, nper, cal), highlight=False)
        names = [ns.strategy or "allreduce"] if job[0] == "train" else \
            [s.strip() for s in ns.strategies.split(",") if s.strip()]
        for name in names:  # a bad job is one error line here, not a failure inside N agents
            cfg = load_config(ns.config, {**overrides(ns), "strategy": name,
                                          "procs": args.hosts * nper}, ns.sets)
            prepare(cfg, hosts=args.hosts, testbed=True)
        spec = TestbedJob(job[0], Path(ns.out or f"runs/{stamp}-testbed-{job[0]}"), nper,
                          tuple(job_argv(ns, drop=("procs", "out", "strategy"))), tuple(names),
                          report=not ns.no_report, calibration=cal)
    return run_testbed(Bed(args.hosts, args.nic, args.latency, args.loss), spec, console)


def cmd_strategy(name: str, console: Console) -> int:
    from rich.markup import escape
    from rich.table import Table

    from polytrain.strategies.describe import describe_strategy

    d = describe_strategy(name)
    console.print(f"[bold]{d['name']}[/] ({d['family']}): {escape(d['summary'])}", highlight=False)
    if d["doc"]:
        console.print(escape(d["doc"]), highlight=False)
    for title, rows in ((f"{name} options (--set KEY=VALUE)", d["options"]),
                        ("every strategy (--set KEY=VALUE)", d["common"])):
        table = Table(title=title)
        for col in ("option", "type", "default", "meaning"):
            table.add_column(col)
        for row in rows:
            table.add_row(*(escape(str(c)) for c in row))
        if not rows:
            table.add_row("(none)", "", "", "")
        console.print(table)
    table = Table(title="training features (docs/training.md)")
    for col in ("feature", "what it means here"):
        table.add_column(col)
    for feature, meaning in d["training"]:
        table.add_row(feature, escape(meaning))
    console.print(table)
    return 0


def cmd_strategies(console: Console) -> int:
    from rich.table import Table

    from polytrain.strategies.catalog import catalog  # read from the source: no torch

    table = Table(title="strategies")
    for col in ("id", "family", "what it does"):
        table.add_column(col)
    for name, entry in catalog().items():
        table.add_row(name, entry.family, entry.summary)
    console.print(table)
    return 0


def cmd_models(console: Console) -> int:
    from rich.table import Table

    from polytrain.models import describe_models

    rows = describe_models()
    table = Table(title="model zoo")
    for col in rows[0]:
        table.add_column(str(col))
    for row in rows:
        table.add_row(*(f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()))
    console.print(table)
    return 0


def cmd_datasets(console: Console) -> int:
    from rich.table import Table

    from polytrain.data import DATASETS

    table = Table(title="built-in datasets (no downloads)")
    table.add_column("id")
    table.add_column("what it is")
    for name, entry in sorted(DATASETS.items()):
        table.add_row(name, entry.description)
    console.print(table)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from polytrain.runtime import startup_trace

    startup_trace.begin()  # the run's startup.jsonl counts from this process's start
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    job: list[str] = []
    if argv and argv[0] == "testbed" and "--" in argv:
        cut = argv.index("--")
        argv, job = argv[:cut], argv[cut + 1 :]
    calibrate = argv[:2] == ["testbed", "calibrate"]  # its own parser (`plan.calibrate`)
    args = argparse.Namespace(command="calibrate") if calibrate else parser.parse_args(argv or ["train"])
    from rich.console import Console
    from rich.markup import escape

    console = Console()
    err = Console(stderr=True)
    debug = bool(getattr(args, "debug", False)) or os.environ.get(env.DEBUG) == "1"
    try:
        if args.command in (None, "train"):
            return cmd_train(args, console)
        if args.command == "compare":
            return cmd_compare(args, console)
        if args.command == "testbed":
            return cmd_testbed(args, job, console)
        if calibrate:
            from polytrain.plan.calibrate import cmd_calibrate

            return cmd_calibrate(argv[2:], console)
        if args.command == "rl":
            from polytrain.rl.cli import run_rl

            return run_rl(args, console)
        if args.command == "aco":
            from polytrain.aco.cli import run_aco_cli

            return run_aco_cli(args, console)
        if args.command == "report":
            return cmd_report(args, console)
        if args.command == "export":
            return cmd_export(args, console)
        if args.command == "schedule":
            return cmd_schedule(args, console)
        if args.command in ("profile", "plan"):
            from polytrain.plan.cli import cmd_plan, cmd_profile

            return (cmd_profile if args.command == "profile" else cmd_plan)(args, console)
        if args.command == "strategies" and args.name:
            return cmd_strategy(args.name, console)
        simple = {"strategies": cmd_strategies, "models": cmd_models, "datasets": cmd_datasets}
        return simple[args.command](console)
    except Interrupted as e:
        err.print(f"[bold yellow]interrupted:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        return e.exit_code
    except PolytrainError as e:
        if debug:
            raise
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        return 2 if isinstance(e, ConfigError) else 1
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]: every rank was stopped.")
        return 130


def leave(code: int) -> NoReturn:
    """End the command with ``code``. With torch loaded, Python's own shutdown spends seconds
    tearing torch's modules down after the work is done (measured: 1.5-2.2 s from the summary to
    the exit of `polytrain train`, at load 9); the exit handlers still run (logging, the
    children of multiprocessing), the standard streams are flushed, then the process ends."""
    if "torch" in sys.modules:
        atexit._run_exitfuncs()  # what the interpreter's shutdown would run first
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def run() -> NoReturn:
    """The ``polytrain`` command (console script and ``python -m polytrain``)."""
    leave(main())


if __name__ == "__main__":
    run()
