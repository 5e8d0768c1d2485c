"""Finite divergence is caught (issue 50, item 1): a loss that blows up and stays finite stops
the run with the step named, on every strategy including asynchronous ones; summary.json says
why the run stopped; the checkpoint left as the last good one was taken before the divergence
window, never a blown-up one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import polytrain
from polytrain.config import load_config
from polytrain.errors import ConfigError, DivergedError, RankFailure
from polytrain.runtime.checkpoint import CheckpointStore
from polytrain.runtime.divergence import DivergenceWatch


def _watch(**kw: object) -> DivergenceWatch:
    return DivergenceWatch(load_config(overrides=kw))


def test_a_finite_blow_up_stops_at_its_step_with_the_window_named() -> None:
    watch = _watch(divergence_window=4)
    for step, loss in enumerate([2.3, 1.9, 1.2], start=1):
        assert watch.observe(step, loss) is None
    with pytest.raises(DivergedError, match=r"diverged at step 4: the loss 2.9e\+29") as err:
        watch.observe(4, 2.9e29)
    assert (err.value.step, err.value.since) == (4, 1)


def test_a_loss_near_zero_then_a_normal_batch_is_not_divergence() -> None:
    watch = _watch()
    for step, loss in enumerate([2.3, 0.5, 1e-6, 0.8], start=1):  # 0.8 is 8e5 x the minimum
        assert watch.observe(step, loss) is None  # ...but below the first loss: not diverged
    assert watch.observe(5, math.nan) is None  # a rank without a loss of its own


def test_a_resumed_run_bounds_its_losses_by_the_whole_run_s_history(tmp_path: Path) -> None:
    """A resume at step 2 of a run whose loss fell from 2.3 to 1e-4: an ordinary batch's 1.0
    at step 3 is under the bound (the run's first loss), as in the uninterrupted run; without
    the history the resumed segment's own first loss (1e-4) made it "diverged"."""
    from polytrain.metrics.recorder import Recorder

    rec = Recorder(0, tmp_path / "rank0.jsonl", fresh=True)
    for step, loss in ((1, 2.3), (2, 1e-4), (3, 5e-5)):
        rec.step(step, loss, 16 * step)
    rec.close()
    resumed = Recorder(0, tmp_path / "rank0.jsonl")
    resumed.rewind(2)
    assert resumed.earlier_losses() == [2.3, 1e-4]
    watch = DivergenceWatch(load_config(), resumed.earlier_losses)
    assert watch.observe(3, 1.0) is None and watch.first == 2.3
    fresh = _watch()
    fresh.observe(3, 1e-4)
    with pytest.raises(DivergedError):
        fresh.observe(4, 1.0)


def test_warn_notes_each_episode_once_and_skip_gives_up_after_the_window() -> None:
    warn = _watch(on_divergence="warn")
    verdicts = [warn.observe(s, v) for s, v in enumerate([2.0, 1.0, 5e3, 6e3, 1.0, 7e3], 1)]
    assert verdicts == [None, None, "warn", None, None, "warn"]
    skip = _watch(on_divergence="skip", divergence_window=3)
    assert [skip.observe(s, v) for s, v in enumerate([2.0, 1.0, 5e3, 5e3], 1)] == \
        [None, None, "over", "over"]
    with pytest.raises(DivergedError, match="3 steps in a row"):
        skip.observe(5, 5e3)


def test_a_negative_loss_gives_no_ratio_and_the_check_can_be_turned_off() -> None:
    watch = _watch()
    assert [watch.observe(s, v) for s, v in enumerate([-1.0, -2.0, 1e9], 1)] == [None] * 3
    off = _watch(divergence_factor=0)
    assert [off.observe(s, v) for s, v in enumerate([1.0, 1e30], 1)] == [None, None]


@pytest.mark.parametrize(("field", "value"), [("divergence_factor", 0.5), ("divergence_factor", math.inf),
                                              ("divergence_window", 0), ("max_param", -1.0),
                                              ("max_param", math.nan), ("on_divergence", "ignore")])
def test_bad_divergence_options_are_refused_before_launch(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config(overrides={field: value})


def test_skip_is_refused_where_ranks_could_not_skip_the_same_updates() -> None:
    from polytrain.launch.prepare import prepare

    with pytest.raises(ConfigError, match="--on-divergence skip is honoured by single, allreduce"):
        prepare(load_config(overrides={"strategy": "ps", "procs": 3, "model": "mlp",
                                       "on_divergence": "skip"}))


def _fake_checkpoint(root: Path, step: int) -> None:
    (root / f"step-{step:08d}").mkdir(parents=True)


def test_pruning_keeps_a_checkpoint_from_before_the_window(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "")
    for step in range(1, 21):
        _fake_checkpoint(tmp_path, step)
        store._prune(keep=2, before=step - 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step-{s:08d}" for s in range(15, 21)]
    moved, good = store.set_aside_after(15)
    assert good == "step-00000015" and len(moved) == 5
    assert (tmp_path / "LATEST").read_text() == "step-00000015"
    assert (tmp_path / "diverged-step-00000020").is_dir()


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_adam_at_lr_1e6_stops_and_the_last_good_checkpoint_is_sane(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(RankFailure, match=r"diverged at step \d+: the loss .* running minimum"):
        polytrain.train(strategy="single", procs=1, model="mlp", lr=1e6, steps=40,
                        checkpoint_every=1, divergence_window=3, out=str(out))
    stopped = _summary(out)["stopped"]
    assert stopped["reason"] == "diverged" and stopped["rank"] == 0
    good = stopped["last_good_checkpoint"]
    if good is not None:  # a checkpoint before the window: taken before the blow-up began
        ckpt = out / "checkpoints" / good
        assert CheckpointStore.step_of(ckpt) < stopped["since"]
        weights = CheckpointStore.load_rank(ckpt, 0)["model"].values()
        assert max(float(w.abs().max()) for w in weights) < 1e6
    assert all(CheckpointStore.step_of(p) < stopped["since"]
               for p in (out / "checkpoints").glob("step-*"))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ps", "pipedream"])  # local-sgd passed too (left out: time)
def test_asynchronous_strategies_stop_on_a_finite_blow_up(tmp_path: Path, strategy: str) -> None:
    out = tmp_path / strategy
    with pytest.raises(RankFailure, match=r"diverged at step \d+"):
        polytrain.train(strategy=strategy, procs=3 if strategy == "ps" else 2, model="mlp", lr=1e6,
                        steps=60, out=str(out))
    assert _summary(out)["stopped"]["reason"] == "diverged"


@pytest.mark.slow
def test_warn_finishes_the_run_and_lists_the_steps(tmp_path: Path) -> None:
    summary = polytrain.train(strategy="single", procs=1, model="mlp", lr=1e6, steps=8,
                              on_divergence="warn", max_param=0, out=str(tmp_path / "w"))
    assert summary["steps_run"] == 8 and summary["stopped"] == {"reason": "completed"}
    assert summary["divergence_warnings"]
    assert torch.load(tmp_path / "w" / "model.pt", weights_only=True)


SPIKE = '''
import os
from torch import nn

class Spike(nn.Module):
    """Rank 1's output is scaled by 1e6 in its 3rd forward (step 3): a finite loss spike."""
    def __init__(self):
        super().__init__()
        self.calls = 0
    def forward(self, x):
        self.calls += 1
        return x * 1e6 if os.environ.get("RANK") == "1" and self.calls == 3 else x

def make():
    return [nn.Flatten(), nn.Linear(64, 16), Spike(), nn.ReLU(), nn.Linear(16, 10)]
'''


@pytest.mark.slow
def test_skip_drops_a_spike_s_update_on_every_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finite spike on rank 1 only: every rank skips step 3's update (one 4-byte all-reduce
    agrees on it), the replicas stay equal and the run finishes."""
    (tmp_path / "spike.py").write_text(SPIKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    summary = polytrain.train(strategy="allreduce", procs=2, model="spike:make", optimizer="sgd",
                              lr=0.1, steps=5, on_divergence="skip", out=str(out))
    assert summary["skipped_steps"] == [3] and summary["steps_run"] == 5
    events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted((e["rank"], e["step"]) for e in events if e["event"] == "skipped") == [(0, 3), (1, 3)]
