"""A stop request (SIGTERM/Ctrl-C) to a dqn run: the learner ends at its next check, writes its
checkpoint there, and a resume from it ends exactly where the uninterrupted run ends. In-process
(the launcher part is probed in tests/faults/test_rl_signals.py): a real SIGTERM, raised by the
recorder when the second episode ends, reaches the handler every RL process installs."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from polytrain.metrics.recorder import Recorder
from polytrain.rl import checkpoint
from polytrain.rl.api import resume_config
from polytrain.rl.config import make_rl_config
from polytrain.rl.dqn import run_dqn
from polytrain.rl.results import write_config
from polytrain.rl.roles import RoleContext, layout_ranks
from polytrain.runtime import interrupt

SMALL = {"algo": "dqn", "hidden": 16, "depth": 1, "batch_size": 16, "learning_starts": 64,
         "target_update": 40, "replay_capacity": 300, "eps_decay_steps": 300, "eval_every_s": 1e6,
         "eval_episodes": 1, "max_seconds": 1e6, "target_return": 1e6, "seed": 3,
         "max_env_steps": 400, "checkpoint_every": 400}


class SignalAt(Recorder):
    """Raises SIGTERM in this process when the ``n``-th episode ends (0: never)."""

    def __init__(self, n: int) -> None:
        super().__init__(0)
        self.n, self.episodes = n, 0

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        rec = super().emit(event, **fields)
        if event == "episode":
            self.episodes += 1
            if self.episodes == self.n:
                signal.raise_signal(signal.SIGTERM)
        return rec


@pytest.fixture(autouse=True)
def _handlers() -> Iterator[None]:
    """As in an RL process: one thread, the stop handler installed; all restored afterwards."""
    threads, old = torch.get_num_threads(), signal.getsignal(signal.SIGTERM)
    old_int = signal.getsignal(signal.SIGINT)
    torch.set_num_threads(1)
    interrupt.install(None)
    yield
    interrupt._state.signal = interrupt._state.stop_at = None
    signal.signal(signal.SIGTERM, old)
    signal.signal(signal.SIGINT, old_int)
    torch.set_num_threads(threads)


def _run(options: dict[str, Any], run_dir: Path, stop_at_episode: int = 0, resume: bool = False) -> Any:
    cfg = resume_config(str(run_dir), options) if resume else make_rl_config(options)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        write_config(run_dir, cfg)
    rec = SignalAt(stop_at_episode)
    rec.start_clock()
    return run_dqn(RoleContext(cfg, 0, layout_ranks(cfg), rec, run_dir, extra={"resume": resume}))


def test_stopped_dqn_checkpoints_and_resumes_to_the_uninterrupted_run(tmp_path: Path) -> None:
    ref = _run(SMALL, tmp_path / "ref")
    cut = tmp_path / "cut"
    stopped = _run(SMALL, cut, stop_at_episode=2)
    assert stopped["stop_reason"] == "interrupted" and stopped["evaluations"] == 0  # ended at once
    at = checkpoint.load(cut)["env_steps"]
    assert at == stopped["env_steps"] and 0 < at < 400  # the checkpoint is where it stopped
    interrupt._state.signal = None  # the resumed run is a new process
    resumed = _run({"algo": "dqn", "max_env_steps": 400}, cut, resume=True)
    a, b = checkpoint.load(tmp_path / "ref"), checkpoint.load(cut)
    assert a["env_steps"] == b["env_steps"] == 400 and a["updates"] == b["updates"] > 0
    for key in ("net", "target"):
        for name, t in a[key].items():
            assert torch.equal(t, b[key][name]), (key, name)
    for name in ("rows", "ids", "sums", "mins"):
        assert torch.equal(a["replay"][name], b["replay"][name]), name
    assert ref["final_mean_return"] == resumed["final_mean_return"]
