"""Helpers the fault probes share."""

from __future__ import annotations

import time
from pathlib import Path


def leftovers(tmp: Path) -> list[str]:
    """What a job left in its TMPDIR (torch's per-user compile cache, ``torchinductor_USER``,
    is shared by every run and kept by design: not a leftover)."""
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))


def assert_emptied(tmp: Path, within: float = 30, name: str | None = None) -> None:
    """``tmp`` holds no leftovers (with ``name``: no ``tmp/name``) within ``within`` seconds: the
    agent's log tree is removed by a watcher that polls every 0.2 s once the agent has ended."""
    def left() -> list[str]:
        return ([name] if (tmp / name).exists() else []) if name else leftovers(tmp)

    end = time.monotonic() + within
    while left() and time.monotonic() < end:
        time.sleep(0.1)
    assert not left(), left()
