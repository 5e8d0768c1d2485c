"""What the testbed's tests share: the privilege check, the marker of tests that build a testbed,
and what is left of one (its namespaces, the processes that ran inside)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from polytrain.launch.reaper import running
from polytrain.testbed import netns

REPO = Path(__file__).resolve().parents[1]
NO_PRIVILEGE = netns.missing_privileges()
_privileged = pytest.mark.skipif(NO_PRIVILEGE is not None, reason=str(NO_PRIVILEGE))


def needs_net(test: Callable[..., None]) -> Callable[..., None]:
    """Builds a testbed and starts processes in it: root only, and in the slow tier."""
    return pytest.mark.slow(_privileged(test))  # type: ignore[no-any-return]


def ours(tb_id: str) -> list[str]:
    """The network namespaces of testbed ``tb_id`` that still exist."""
    return [n for n in netns.list_netns() if n.startswith(f"polytrain-{tb_id}-")]


def gone(pid: int) -> bool:
    """Process ``pid`` has ended (a zombie waiting to be reaped counts as ended)."""
    return not running(pid)
