"""The start-up trace (RUN/startup.jsonl): the launcher's marks wait for the run directory, a
rank's are appended at once, every mark counts from the launch's origin."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from polytrain.runtime import startup_trace as st


def test_marks_count_from_the_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(st.LAUNCH_T0_ENV, raising=False)
    monkeypatch.setattr(st, "_from_cli", False)
    monkeypatch.setattr(st, "_pending", [])
    origin = time.time() - 2.0
    st.begin(origin)
    assert float(os.environ[st.LAUNCH_T0_ENV]) == origin
    st.mark("prepared")
    assert not (tmp_path / st.FILE).exists()  # the launcher's marks wait for the run directory
    st.write_launcher(tmp_path)
    st.rank_mark(tmp_path, 1, "first step done", t=origin + 3.5)
    lines = [json.loads(x) for x in (tmp_path / st.FILE).read_text().splitlines()]
    assert [(x["who"], x["phase"]) for x in lines] == [("launcher", "prepared"),
                                                       ("rank1", "first step done")]
    assert 2.0 <= lines[0]["since_launch_s"] < 60 and lines[1]["since_launch_s"] == 3.5


def test_the_command_line_counts_from_its_process_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(st.LAUNCH_T0_ENV, raising=False)
    monkeypatch.setattr(st, "_from_cli", False)
    monkeypatch.setattr(st, "_pending", [])
    st.begin()
    t0 = float(os.environ[st.LAUNCH_T0_ENV])
    assert t0 <= time.time() and st._pending == [("process start", t0)]
    st.begin(time.time())  # a launch inside the command keeps the command's origin
    assert float(os.environ[st.LAUNCH_T0_ENV]) == t0
