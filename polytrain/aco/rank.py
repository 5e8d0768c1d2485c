"""A rank of a multi-process ``polytrain aco`` run: ``python -m polytrain.aco.rank PAYLOAD.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from polytrain.aco.launch import rank_main
from polytrain.launch.worker import exit_now


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m polytrain.aco.rank PAYLOAD.json")
    rank_main(json.loads(Path(argv[0]).read_text()))
    exit_now(0)


if __name__ == "__main__":
    main(sys.argv[1:])
