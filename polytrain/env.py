"""Every environment variable polytrain reads, in one place: what it carries, who sets it, and why
an environment variable (a process boundary with no other channel, or a user's setting).

A variable set by polytrain crosses from a launcher to processes it does not call directly
(torchrun's agents start the ranks; the testbed's hosts run torchrun); the rest are settings a
user (or the test suite) gives. Modules read them by these names only (a test checks that no
other module spells a ``POLYTRAIN_`` name).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Var:
    name: str
    meaning: str
    set_by: str  # "user" or the module that sets it
    why: str  # why the environment: the boundary it crosses, or a user's setting


def _var(name: str, meaning: str, set_by: str, why: str) -> str:
    VARS.append(Var(name, meaning, set_by, why))
    return name


VARS: list[Var] = []

# set by polytrain, for processes it starts through torchrun's agents or the testbed's hosts
BIND = _var("POLYTRAIN_BIND", "address rank 0's c10d store listens on (--bind)", "cli",
            "torchrun's agent starts the rank that hosts the store")
STORE_FILE = _var("POLYTRAIN_STORE_FILE", "a local run's process-group FileStore", "launch.local",
                  "torchrun's agent starts the ranks")
LAUNCHER_PID = _var("POLYTRAIN_LAUNCHER_PID", "the local launcher's pid, its ranks' parent", "launch.local",
                    "torchrun's agent starts the ranks")
AGENT_LOGS = _var("POLYTRAIN_AGENT_LOGS", "the local launcher's agent log folder", "launch.local",
                  "torchrun's agent starts the ranks")
PARENT_PROGRESS = _var("POLYTRAIN_PARENT_PROGRESS", "the launcher draws the progress; ranks stay quiet",
                       "launch.local", "torchrun's agent starts the ranks")
LAUNCH_T0 = _var("POLYTRAIN_LAUNCH_T0", "the launching process's start time (the start-up trace)",
                 "runtime.startup_trace", "torchrun's agent starts the ranks")
TESTBED_RECORD = _var("POLYTRAIN_TESTBED_RECORD", "the emulated cluster a job runs on (JSON), for its "
                      "summary and prediction", "testbed.torchrun", "each host's torchrun starts the ranks")
TESTBED_ID = _var("POLYTRAIN_TESTBED_ID", "the testbed a host belongs to", "testbed.torchrun",
                  "each host's torchrun starts the ranks")
TESTBED_HOST = _var("POLYTRAIN_TESTBED_HOST", "the emulated host a rank runs on", "testbed.torchrun",
                    "each host's torchrun starts the ranks")
CALIBRATION = _var("POLYTRAIN_CALIBRATION", "the calibration file a testbed job's prediction is priced "
                   "with (polytrain testbed --calibration)", "testbed.job",
                   "each host's torchrun starts the ranks")
# a user's (or the test suite's) settings
CACHE = _var("POLYTRAIN_CACHE", "where measured profiles are cached (default ~/.cache/polytrain)", "user",
             "a setting")
DEBUG = _var("POLYTRAIN_DEBUG", "1: tracebacks, as --debug", "user", "a setting")
REPORT = _var("POLYTRAIN_REPORT", "0: the Python API writes no plots or report.md", "user", "a setting")
PROGRESS_S = _var("POLYTRAIN_PROGRESS_S", "seconds between plain (non-terminal) progress lines", "user",
                  "a setting")
CHECK_COLLECTIVES = _var("POLYTRAIN_CHECK_COLLECTIVES", "1: every collective is checked for matching "
                         "shapes across ranks (the test suite sets it)", "user", "a setting")


@contextmanager
def restored(names: Iterable[str]) -> Iterator[dict[str, str | None]]:
    """While inside, the caller may change ``names`` in ``os.environ``; on the way out each is as
    it was (unset if it was unset). Yields what they were."""
    saved = {k: os.environ.get(k) for k in names}
    try:
        yield saved
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
