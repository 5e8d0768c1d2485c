"""The agent's log tree never outlives its agent (issue 22 item 8): which trees polytrain
removes, and the watcher that removes one once the agent's process has ended."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from polytrain.launch.reaper import AGENT_LOGS_ENV, agent_log_tree, running, watch


def _error_file(base: Path) -> str:
    return str(base / "abc123_x" / "attempt_0" / "1" / "error.json")


def test_torchruns_default_tree_and_the_launchers_folder_are_removed_a_chosen_one_kept(
        tmp_path: Path) -> None:
    default = tmp_path / "torchelastic_q1w2"
    env = {"TMPDIR": str(tmp_path), "TORCHELASTIC_ERROR_FILE": _error_file(default)}
    assert agent_log_tree(env) == default
    ours = tmp_path / "run" / "ranks" / "agent"
    env = {"TMPDIR": str(tmp_path), "TORCHELASTIC_ERROR_FILE": _error_file(ours),
           AGENT_LOGS_ENV: str(ours)}
    assert agent_log_tree(env) == ours
    chosen = tmp_path / "my-logs"  # torchrun --log-dir: the user's, kept
    assert agent_log_tree({"TMPDIR": str(tmp_path), "TORCHELASTIC_ERROR_FILE": _error_file(chosen)}) is None
    elsewhere = tmp_path / "sub" / "torchelastic_q1w2"  # not torch's default place
    assert agent_log_tree({"TMPDIR": str(tmp_path),
                           "TORCHELASTIC_ERROR_FILE": _error_file(elsewhere)}) is None
    assert agent_log_tree({"TMPDIR": str(tmp_path)}) is None  # not under an agent


def test_the_watcher_removes_the_tree_once_the_agent_has_ended(tmp_path: Path) -> None:
    tree = tmp_path / "torchelastic_q1w2"
    (tree / "abc123_x" / "attempt_0" / "0").mkdir(parents=True)
    agent = subprocess.Popen([sys.executable, "-c", "pass"])
    agent.wait()
    assert not running(agent.pid)
    watch(agent.pid, tree)
    assert not tree.exists()
