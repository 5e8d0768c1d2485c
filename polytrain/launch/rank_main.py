"""A rank started by the local launcher: ``python -m polytrain.launch.rank_main PAYLOAD.json``.

The local launcher starts its ranks as fresh interpreters, the way ``torchrun`` starts a script,
rather than as ``multiprocessing`` children: a rank then never imports the launching program's
main module (a script calling ``polytrain.train()`` needs no ``__main__`` guard), and the ranks
run exactly as they do under torchrun.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from polytrain.launch.records import die_with_parent


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m polytrain.launch.rank_main PAYLOAD.json")
    die_with_parent()  # before torch's imports (seconds): an orphan never starts training
    from polytrain.launch.worker import exit_now, run_rank

    try:
        payload = json.loads(Path(argv[0]).read_text())
        _trace_start(Path(payload["run_dir"]))
        run_rank(payload)
    except BaseException:  # recorded in rank{R}.error.json; the traceback goes to the rank log
        traceback.print_exc()
        # no interpreter shutdown: with a peer that stopped answering, tearing down the process
        # group waits on its stuck transfers (14 s measured after a 5 s timeout)
        exit_now(1)
    exit_now(0)  # finished: skip the interpreter's shutdown (see exit_now)


def _trace_start(run_dir: Path) -> None:
    """The rank's process start and the end of its imports, in the run's start-up trace."""
    import os
    import time

    from polytrain.runtime.startup_trace import process_start, rank_mark

    rank = int(os.environ.get("RANK", "0"))
    now = time.time()
    rank_mark(run_dir, rank, "process start", process_start())
    rank_mark(run_dir, rank, "torch and polytrain imported", now)


if __name__ == "__main__":
    main(sys.argv[1:])
