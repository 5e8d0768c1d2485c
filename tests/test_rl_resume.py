"""dqn checkpoint and resume (issue 22 item 7): a run stopped at a checkpoint and resumed ends
exactly where the uninterrupted run ends (networks, optimizer, replay, counters); a resume that
would change what the run learns, or has nothing to do, is refused before anything starts.

The dqn loop runs in this process (its launcher only adds a process around it), so these are
fast tests; ``test_cli_resume_continues_the_run`` resumes through ``polytrain rl`` once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from polytrain.errors import ConfigError
from polytrain.metrics.recorder import Recorder
from polytrain.rl import checkpoint
from polytrain.rl.api import resume_config
from polytrain.rl.config import RLConfig, make_rl_config
from polytrain.rl.dqn import run_dqn
from polytrain.rl.results import write_config
from polytrain.rl.roles import RoleContext, layout_ranks
from tests.conftest import ROOT

# small and quick: learning starts at 64 transitions, evaluation only at the end (1 episode)
SMALL = {"algo": "dqn", "hidden": 16, "depth": 1, "batch_size": 16, "learning_starts": 64,
         "target_update": 40, "replay_capacity": 300, "eps_decay_steps": 300, "eval_every_s": 1e6,
         "eval_episodes": 1, "max_seconds": 1e6, "target_return": 1e6, "seed": 3}


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """As in an RL process (rl/ranks.py): one intra-op thread (5x faster on a busy 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(cfg: RLConfig, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        write_config(run_dir, cfg)
    rec = Recorder(0)
    rec.start_clock()
    ctx = RoleContext(cfg, 0, layout_ranks(cfg), rec, run_dir, extra={"resume": resume})
    return run_dqn(ctx)


def _final(run_dir: Path) -> dict[str, Any]:
    return checkpoint.load(run_dir)


def test_resumed_dqn_ends_equal_to_the_uninterrupted_run(tmp_path: Path) -> None:
    # 450 steps: the replay (300) wraps, episodes end mid-way, and the checkpoint at 250 falls
    # inside an episode with n-step transitions pending
    whole = make_rl_config({**SMALL, "max_env_steps": 450, "checkpoint_every": 50})
    ref = _run(whole, tmp_path / "ref")
    cut = tmp_path / "cut"
    _run(make_rl_config({**SMALL, "max_env_steps": 250, "checkpoint_every": 50}), cut)
    assert _final(cut)["env_steps"] == 250 and _final(cut)["runner"]["pending"]
    resumed = _run(resume_config(str(cut), {"algo": "dqn", "max_env_steps": 450}), cut, resume=True)
    a, b = _final(tmp_path / "ref"), _final(cut)
    assert b["env_steps"] == a["env_steps"] == 450 and b["updates"] == a["updates"] > 300
    assert b["episodes"] == a["episodes"] and b["window"] == a["window"]
    for key in ("net", "target"):
        for name, t in a[key].items():
            assert torch.equal(t, b[key][name]), (key, name)
    for name in ("rows", "ids", "sums", "mins"):  # the replay: the same transitions, once each
        assert torch.equal(a["replay"][name], b["replay"][name]), name
    assert b["replay"]["next_id"] == a["replay"]["next_id"]
    assert a["replay"]["rng"] == b["replay"]["rng"] and a["runner"]["rng"] == b["runner"]["rng"]
    assert ref["env_steps"] == resumed["env_steps"] == 450
    assert ref["learner_updates"] == resumed["learner_updates"]
    assert ref["final_mean_return"] == resumed["final_mean_return"]


def test_resume_refuses_changed_settings_and_nothing_to_do(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _run(make_rl_config({**SMALL, "max_env_steps": 100, "checkpoint_every": 100}), run)
    with pytest.raises(ConfigError, match=r"these differ: lr=0.01 \(the run's: 0.001\)"):
        resume_config(str(run), {"algo": "dqn", "lr": 0.01, "max_env_steps": 200})
    with pytest.raises(ConfigError, match=r"leaves nothing to do\. Fix: --max-env-steps above 100"):
        resume_config(str(run), {"algo": "dqn", "max_env_steps": 100})
    with pytest.raises(ConfigError, match=r"this run is dqn, asked: apex.*Fix: polytrain rl dqn --resume"):
        resume_config(str(run), {"algo": "apex"})
    with pytest.raises(ConfigError, match=r"--max-seconds 1e-09 \(the whole run's budget\) leaves nothing"):
        resume_config(str(run), {"algo": "dqn", "max_seconds": 1e-9, "max_env_steps": 200})
    with pytest.raises(ConfigError, match="no polytrain rl run there"):
        resume_config(str(tmp_path / "nothing"), {"algo": "dqn"})
    cfg = resume_config(str(run), {"algo": "dqn", "max_env_steps": 200, "hidden": 16})  # same: fine
    assert cfg.max_env_steps == 200 and cfg.hidden == 16 and cfg.lr == 0.001
    assert make_rl_config({"algo": "apex", "checkpoint_every": 100}).checkpoint_every == 100  # all do
    shutil.rmtree(run / checkpoint.ROOT)
    with pytest.raises(ConfigError, match="no checkpoint"):
        resume_config(str(run), {"algo": "dqn", "max_env_steps": 200})


@pytest.mark.slow
def test_cli_resume_continues_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    def rl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "polytrain", "rl", "dqn", "--no-plots", *args],
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=300)

    _run(make_rl_config({**SMALL, "max_env_steps": 120, "checkpoint_every": 60}), run)  # in here
    second = rl("--resume", str(run), "--max-env-steps", "240")
    assert second.returncode == 0, second.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == 240 and checkpoint.load(run)["env_steps"] == 240
    # as a resumed training run: one resume listed, the clock going on from the checkpoint's
    t = checkpoint.load(run)["t"]
    [resumed] = summary["resumes"]
    assert resumed["from_env_steps"] == 120 and resumed["updates"] > 0 and 0 < resumed["t"] < t
    assert summary["wall_s"] > resumed["t"] and summary["startup_s"] >= 0
    events = [json.loads(x) for x in (run / "ranks" / "rank0.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events[:3]] == ["process", "resume", "start"]
    assert all(e["t"] >= resumed["t"] for e in events[1:])
