"""Helpers the fault probes share."""

from __future__ import annotations

from pathlib import Path


def leftovers(tmp: Path) -> list[str]:
    """What a job left in its TMPDIR (torch's per-user compile cache, ``torchinductor_USER``,
    is shared by every run and kept by design: not a leftover)."""
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))
