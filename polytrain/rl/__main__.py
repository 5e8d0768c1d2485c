"""``python -m polytrain.rl ALGO [options]``: the ``polytrain rl`` command on its own."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.markup import escape

from polytrain.errors import ConfigError, PolytrainError
from polytrain.rl.cli import add_rl_parser, run_rl


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polytrain.rl")
    sub = parser.add_subparsers(dest="command", required=True)
    add_rl_parser(sub)
    args = parser.parse_args(["rl", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run_rl(args, Console())
    except PolytrainError as e:
        if args.debug:
            raise
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        return 2 if isinstance(e, ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
