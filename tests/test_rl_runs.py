"""Real multi-process RL runs (gloo on loopback): apex flow + a killed actor, gorila, CLI errors.

Kept short (seconds of learning each); the runs that must *solve* CartPole live in
tests/test_rl_solve.py behind POLYTRAIN_SLOW=1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # every test here starts processes

SHORT = ["--max-seconds", "6", "--target-return", "1000", "--learning-starts", "200",
         "--set", "eval_every_s=4", "--set", "screen_episodes=2", "--eval-episodes", "5"]


def _rl(*args: str, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "polytrain.rl", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def _wait_for_steps(path: Path, steps: int = 120, timeout: float = 120) -> int:
    """The pid of the actor writing ``path`` once it has finished an episode at or after
    ``steps`` env steps (so it has sent experience: an actor sends every 50 transitions)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        events = _events(path)
        if any(e["event"] == "episode" and e["actor_steps"] >= steps for e in events):
            return int(next(e["pid"] for e in events if e["event"] == "process"))
        time.sleep(0.2)
    raise AssertionError(f"{path} never finished an episode after {steps} env steps")


def test_a_stalled_actor_is_lost_and_the_run_ends(tmp_path: Path) -> None:
    """Issue 50 item 10: an actor SIGSTOPped mid-run neither exits nor speaks; it is in
    ``lost_actors`` and the launcher ends the run once the learner and replay are done."""
    run = tmp_path / "run"
    proc = _rl("apex", "--actors", "2", "--out", str(run), "--actor-timeout", "2", *SHORT)
    try:
        pid = _wait_for_steps(run / "ranks" / "rank3.jsonl")  # actor 1
        os.kill(pid, signal.SIGSTOP)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    s = json.loads((run / "summary.json").read_text())
    assert [x["rank"] for x in s["lost_actors"]] == [3], s["lost_actors"]


def test_apex_flow_and_a_killed_actor(tmp_path: Path) -> None:
    """Experience flows, priorities update, parameters are published and fetched, bytes are
    counted — and an actor SIGKILLed mid-run is reported while the learner keeps learning."""
    run = tmp_path / "run"
    proc = _rl("apex", "--actors", "3", "--out", str(run), "--actor-timeout", "2", *SHORT)
    try:
        pid = _wait_for_steps(run / "ranks" / "rank3.jsonl")  # actor 1
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "lost actor" in out and "actor 1 (rank 3" in out and "SIGKILL" in out
    s = json.loads((run / "summary.json").read_text())
    [lost] = s["lost_actors"]
    assert (lost["rank"], lost["actor"], lost["cause"]) == (3, 1, "died (SIGKILL)")
    detected = lost["detected_by_replay_at_s"]
    assert detected is not None
    rank = {r["rank"]: r for r in s["per_rank"]}
    assert 3 not in rank  # the dead actor wrote no result...
    replay, learner = rank[1]["result"], rank[0]["result"]
    # ...but the learner went on: more updates after the loss was noticed
    progress = [e for e in _events(run / "ranks" / "rank0.jsonl") if e["event"] == "progress"]
    before = max((e["updates"] for e in progress if e["t"] <= detected), default=0)
    assert learner["learner_updates"] > before + 10
    assert progress[-1]["alive_actors"] == 2
    # experience flowed from every actor (the dead one too, before it died)
    assert all(a["env_steps"] > 0 for a in replay["per_actor"].values())
    assert replay["transitions_added"] > 0 and s["env_steps"] == replay["env_steps"] > 0
    assert replay["priority_updates"] > 0  # the learner's |TD| came back
    assert learner["params_published"] > 0
    for r in (2, 4):
        assert rank[r]["result"]["param_fetches"] > 0 and rank[r]["result"]["param_version"] > 0
    # bytes: every kind of traffic counted; the dead actor's from what the replay received
    width = 2 * 4 + 3
    experience = s["bytes_by_op"]["experience"] + s["bytes_by_op"]["from_lost_actors"]
    assert experience >= replay["transitions_added"] * (width + 1) * 4
    for op in ("sample", "params_publish", "params_fetch", "from_lost_actors"):
        assert s["bytes_by_op"][op] > 0, op
    assert s["bytes_sent"] == sum(s["bytes_by_rank"].values())
    for name in ("metrics.jsonl", "return_vs_time.png", "return_vs_steps.png", "model.pt", "config.toml"):
        assert (run / name).exists(), name


def test_gorila_learners_push_to_sharded_servers(tmp_path: Path) -> None:
    """Two learners push asynchronously to two `ps` shards; a killed actor is survived here too."""
    run = tmp_path / "run"
    proc = _rl("gorila", "--actors", "2", "--learners", "2", "--servers", "2", "--out", str(run),
               "--actor-timeout", "2", *SHORT)
    try:
        os.kill(_wait_for_steps(run / "ranks" / "rank5.jsonl"), signal.SIGKILL)  # actor 0
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    s = json.loads((run / "summary.json").read_text())
    rank = {r["rank"]: r["result"] for r in s["per_rank"]}
    pushes = [rank[0]["learner_updates"], rank[1]["learner_updates"]]
    assert min(pushes) > 0  # both learners learned, asynchronously
    for server in (3, 4):  # polytrain's `ps` servers: every push applied at once (async)
        assert rank[server]["version"] == sum(pushes)
        assert sum(rank[server]["update_lag"].values()) == sum(pushes)
    assert rank[3]["params"] + rank[4]["params"] == 4 * 128 + 128 + 128 * 128 + 128 + 128 * 2 + 2
    assert rank[2]["priority_updates"] > 0
    assert s["bytes_by_op"]["ps_push"] > 0 and s["bytes_by_op"]["ps_pull"] > 0
    assert rank[0]["params_published"] > 0  # actors take the servers' parameters via the relay
    assert rank[6]["param_fetches"] > 0
    assert [(x["rank"], x["cause"]) for x in s["lost_actors"]] == [(5, "died (SIGKILL)")]


SUMMARY_FIELDS = ("env_steps", "episodes", "best_mean_return", "final_mean_return", "time_to_target_s",
                  "learner_updates_per_s", "actor_steps_per_s", "replay_size", "bytes_sent",
                  "lost_actors", "solved", "stop_reason", "wall_s", "startup_s")


def test_dqn_run_directory_and_summary(tmp_path: Path) -> None:
    """The single-process baseline through the main CLI (`polytrain rl dqn`): a short run that
    learns, evaluates, stops at its time budget and leaves the usual run directory."""
    from tests.conftest import run_cli

    run = tmp_path / "run"
    res = run_cli("rl", "dqn", "--out", str(run), *SHORT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "polytrain rl dqn on CartPole-v1" in res.stdout and "learner updates" in res.stdout
    s = json.loads((run / "summary.json").read_text())
    for key in SUMMARY_FIELDS:
        assert key in s, key
    assert (s["world_size"], s["solved"], s["stop_reason"]) == (1, False, "max_seconds")
    assert s["time_to_target_s"] is None and s["lost_actors"] == [] and s["bytes_sent"] == 0
    assert s["env_steps"] > 200 and s["episodes"] > 0
    assert s["env_steps"] - 3 < s["replay_size"] <= s["env_steps"]  # n = 3: the last rows wait
    assert s["learner_updates"] > 0 and s["learner_updates_per_s"] > 0 and s["actor_steps_per_s"] > 0
    assert s["final_eval_episodes"] == 5 and s["best_mean_return"] >= s["final_mean_return"] > 0
    evals = [e for e in _events(run / "metrics.jsonl") if e["event"] == "eval"]
    assert evals and evals[-1]["kind"] == "final" and evals[-1]["episodes"] == 5
    for name in ("config.toml", "metrics.jsonl", "model.pt", "return_vs_time.png", "return_vs_steps.png"):
        assert (run / name).exists(), name


def test_bad_input_fails_before_any_process(tmp_path: Path) -> None:
    proc = _rl("apex", "--actors", "0", cwd=tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "--actors" in err and "at least 1 (got 0)" in err and "Traceback" not in err
    proc = _rl("dqn", "--env", "Pong-v5", cwd=tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "Unknown environment 'Pong-v5'" in err and "CartPole-v1" in err and "Acrobot-v1" in err
    assert not (tmp_path / "runs").exists()


def test_polytrain_cli_has_rl() -> None:
    from polytrain.cli import build_parser

    args = build_parser().parse_args(["rl", "apex", "--actors", "3"])  # exits (fails) if not wired
    assert (args.algo, args.actors) == ("apex", 3)
