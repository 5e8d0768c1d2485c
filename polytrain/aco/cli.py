"""``polytrain aco``: ant colony optimisation for the TSP from the command line.

    polytrain aco --tsp berlin52.tsp --variant mmas --local-search 2opt --iterations 300
    polytrain aco --tsp random:500 --ants 100 --procs 2 --exchange 10 --time-limit 60
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from polytrain.errors import ConfigError

if TYPE_CHECKING:  # rich loads when something is printed, not with the parser
    from rich.console import Console
    from rich.table import Table

# ACOConfig field -> (flag, type, help)
ACO_FLAGS: list[tuple[str, str, Any, str]] = [
    ("tsp", "--tsp", str, "TSPLIB file (EUC_2D, CEIL_2D, ATT, GEO, EXPLICIT) or random:N[:SEED]"),
    ("ants", "--ants", int, "ants per iteration, all processes together; default 25 with 2-opt, else N"),
    ("iterations", "--iterations", int, "iterations; default 200 (unbounded with --time-limit)"),
    ("time_limit", "--time-limit", float, "stop after this many seconds"),
    ("target_gap", "--target-gap", float, "stop within this gap of the optimum, e.g. 0.02"),
    ("procs", "--procs", int, "processes; default 1"),
    ("exchange", "--exchange", int,
     "1 (default): the processes share one colony's ants, tours exchanged every iteration; "
     "k > 1: one colony per process, pheromone averaged and best tour shared every k iterations"),
    ("variant", "--variant", str, "as | acs | mmas; default mmas"),
    ("local_search", "--local-search", str, "none | 2opt (on every ant's tour); default 2opt"),
    ("alpha", "--alpha", float, "pheromone exponent; default 1"),
    ("beta", "--beta", float, "heuristic exponent; default 2"),
    ("rho", "--rho", float, "evaporation; default as 0.5, acs 0.1, mmas 0.02 (0.2 with 2-opt)"),
    ("q0", "--q0", float, "acs: probability of the greedy choice; default 0.9"),
    ("xi", "--xi", float, "acs: local evaporation; default 0.1"),
    ("candidates", "--candidates", int, "nearest-neighbour candidate list size (0: all); default 0 up to "
                                        "N=200, else 20"),
    ("p_best", "--p-best", float, "mmas: p_best of the tau_min bound; default 0.05"),
    ("restart_after", "--restart-after", int,
     "mmas: reinitialise the pheromone after this many iterations without improvement (0: never); "
     "default 100"),
    ("optimum", "--optimum", float, "the optimal length, for the gap (known TSPLIB optima are built in)"),
    ("seed", "--seed", int, "seed of the ants' random numbers; default 0"),
    ("device", "--device", str, "cpu | cuda | auto; default cpu"),
    ("threads", "--threads", int, "torch threads per process; default 1"),
    ("timeout_s", "--timeout", float, "seconds a rank waits for its peers; default 120"),
    ("out", "--out", str, "run directory; default runs/<time>-aco-<variant>"),
]


def add_aco_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "aco", help="ant colony optimisation for the TSP (ACO-DP: data-parallel tour construction)",
        description="Solve a travelling-salesman instance with a data-parallel ant colony.")
    for field, flag, typ, help_ in ACO_FLAGS:
        p.add_argument(flag, dest=field, type=typ, default=None, help=help_)
    p.add_argument("--no-plots", action="store_true", help="skip tour.png and the length curves")
    p.add_argument("--debug", action="store_true", default=None, help="tracebacks of failures")
    return p


def summary_table(s: dict[str, Any]) -> Table:
    from rich.table import Table

    from polytrain.report.units import human_bytes

    t = Table(title=f"polytrain aco {s['variant']} on {s['instance']} (N={s['n']}) — "
                    f"{s['procs']} process(es)", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    gap = "—" if s["gap"] is None else f"{100 * s['gap']:.2f} % (optimum {s['optimum']:,.0f})"
    rows = [("best length", f"{s['best_length']:,.0f}"), ("gap", gap),
            ("iterations", f"{s['iterations']:,} ({1e3 * s['time_per_iteration_s']:.1f} ms each)"),
            ("tours/s", f"{s['tours_per_s']:,.0f}" if s["tours_per_s"] else "—"),
            ("wall clock", f"{s['wall_s']:.2f} s"),
            ("bytes sent", f"{human_bytes(s['bytes_sent'])} ({s['exchanges']} exchanges)"),
            ("run directory", str(s["config"]["out"]))]
    for k, v in rows:
        t.add_row(k, v)
    return t


def parse_aco_job(argv: list[str], world: int | None = None) -> tuple[argparse.Namespace, list[str]]:
    """An ``aco`` command line parsed for ``polytrain testbed -- aco``: the namespace and the job's
    flags for every host (without ``--procs`` and ``--out``, which the testbed sets). With
    ``world``, validated as ``polytrain aco`` on that many processes (one-line errors)."""
    from polytrain.aco.config import ACOConfig

    parser = argparse.ArgumentParser(prog="polytrain aco", add_help=False)
    sub = parser.add_subparsers(dest="command")
    add_aco_parser(sub)
    try:
        args = parser.parse_args(["aco", *argv])
    except SystemExit as e:  # argparse already printed the usage line and the reason
        raise ConfigError(f"invalid 'aco' options after '--': {' '.join(argv)}") from e
    data = {f: getattr(args, f) for f, *_ in ACO_FLAGS if getattr(args, f) is not None}
    if world is not None:
        ACOConfig.from_dict({**data, "procs": world})
    host_args = [a for f, flag, *_ in ACO_FLAGS if f in data and f not in ("procs", "out")
                 for a in (flag, str(data[f]))]
    host_args += ["--no-plots"] if args.no_plots else []
    host_args += ["--debug"] if args.debug else []
    return args, host_args


def run_aco_cli(args: argparse.Namespace, console: Console) -> int:
    """Validate (ConfigError before anything starts), run, print the summary."""
    from polytrain import api
    from polytrain.aco.config import ACOConfig
    from polytrain.aco.launch import run_aco, run_under_torchrun

    data = {f: getattr(args, f) for f, *_ in ACO_FLAGS if getattr(args, f) is not None}
    if api.under_torchrun():  # the world size is torchrun's (validated as --procs)
        import os

        world = int(os.environ["WORLD_SIZE"])
        if data.get("procs", world) != world:
            raise ConfigError(f"--procs {data['procs']} disagrees with torchrun's world size {world}. "
                              "Under torchrun, leave --procs out.")
        data["procs"] = world
    cfg = ACOConfig.from_dict(data)
    if api.under_torchrun():
        from polytrain.launch.worker import exit_now

        summary = run_under_torchrun(cfg, plots=not args.no_plots)
        if summary is not None:
            console.print(summary_table(summary))
        exit_now(0)
    from rich.console import Console

    summary = run_aco(cfg, Console(stderr=True), plots=not args.no_plots)
    console.print(summary_table(summary))
    return 0
