"""The fault-injection suite (issue 22): each probe a scripted fault with its pass criterion.

Fast probes (no processes) run in every suite; probes that start jobs are ``slow`` (still run by
CI); ``nightly`` ones (minutes each: the soak) run only with ``POLYTRAIN_NIGHTLY=1``.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "nightly: long fault probes, run with POLYTRAIN_NIGHTLY=1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("POLYTRAIN_NIGHTLY") == "1":
        return
    skip = pytest.mark.skip(reason="nightly probe: set POLYTRAIN_NIGHTLY=1 to run it")
    for item in items:
        if "nightly" in item.keywords:
            item.add_marker(skip)

