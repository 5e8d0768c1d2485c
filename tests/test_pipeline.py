"""Pipeline strategies without extra processes: weight policies, metrics, options, and whole runs
on ONE stage in this process (a world of 1 needs no process group; the wire format:
tests/test_pipeline_wire.py). One stage
exercises the whole executor path — micro-batching, loss scaling, re-materialisation, weight
versions, segments, checkpoints — and must equal ``single``; tests/test_pipeline_runs.py does the
same across real processes."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import polytrain
from polytrain.comm import Comm
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.metrics.recorder import Recorder
from polytrain.runtime.checkpoint import CheckpointStore
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.schedules.registry import Action, stage_orders
from polytrain.strategies import make_strategy
from polytrain.strategies.pipeline.metrics import (
    bubble_fraction,
    overhead_fraction,
    segment_bubbles,
    theoretical_bubble,
)
from polytrain.strategies.pipeline.weights import (
    PredictedWeights,
    StashedWeights,
    backward_distances,
    predict,
)

COMMON: dict[str, Any] = {
    "model": "mlp",
    "dataset": "digits",
    "steps": 3,
    "batch_size": 24,
    "optimizer": "momentum",
    "lr": 0.05,
    "seed": 3,
}

# --- weight policies ------------------------------------------------------------------------------


def test_backward_distances_follow_the_schedule() -> None:
    order = stage_orders("pipedream", 3, 5)[0]  # stage 0: F0 F1 F2 B0 F3 B1 F4 B2 B3 B4
    assert backward_distances(order) == {0: 0, 1: 1, 2: 2, 3: 2, 4: 2}
    assert backward_distances(stage_orders("pipedream", 3, 5)[2]) == dict.fromkeys(range(5), 0)


def test_spectrain_prediction_formula() -> None:
    w, v = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.25])
    torch.testing.assert_close(predict(w, v, lr=0.1, distance=3), w - 3 * 0.1 * v)
    torch.testing.assert_close(predict(w, None, lr=0.1, distance=3), w)
    torch.testing.assert_close(predict(w, v, lr=0.1, distance=0), w)


def _stage() -> tuple[nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layer = nn.Linear(3, 1)
    return layer, torch.optim.SGD(layer.parameters(), lr=0.1)


def _fb(policy: StashedWeights, layer: nn.Module, mb: int, x: torch.Tensor, phase: str) -> None:
    if phase == "F":
        params = policy.forward_params(mb, 0.0)
        assert params is not None
        policy.out_ = getattr(policy, "out_", {})  # type: ignore[attr-defined]
        policy.out_[mb] = torch.func.functional_call(layer, params, (x,)).sum()  # type: ignore[attr-defined]
    else:
        policy.out_.pop(mb).backward()  # type: ignore[attr-defined]
        policy.after_backward(mb)


def test_weight_stashing_differentiates_the_version_the_forward_used() -> None:
    """F0 F1 B0 B1: B1 must use version 0 although the stage updated after B0."""
    layer, opt = _stage()
    policy = StashedWeights(layer, opt, stage=0)
    policy.begin_segment([])
    w0 = layer.weight.detach().clone()
    x0, x1 = torch.ones(1, 3), torch.full((1, 3), 2.0)
    for mb, x, phase in [(0, x0, "F"), (1, x1, "F"), (0, x0, "B"), (1, x1, "B")]:
        _fb(policy, layer, mb, x, phase)
    # d(sum(W x + b))/dW = x, both taken at version 0: two SGD steps of 0.1·x0 then 0.1·x1
    torch.testing.assert_close(layer.weight.detach(), w0 - 0.1 * x0 - 0.1 * x1)
    assert policy.staleness == {0: 1, 1: 1} and policy.version == 2
    assert policy.peak_versions == 2 and policy.peak_stash_bytes == 2 * 4 * 4
    assert set(policy.versions) == {2}  # versions no in-flight micro-batch needs are dropped


def test_vertical_sync_runs_the_input_stage_version() -> None:
    layer, opt = _stage()
    policy = StashedWeights(layer, opt, stage=1, vertical_sync=True)
    policy.begin_segment([])
    x = torch.ones(1, 3)
    policy.forward_params(0, 0.0)
    policy.out_ = {0: torch.func.functional_call(layer, policy.versions[0], (x,)).sum()}  # type: ignore[attr-defined]
    _fb(policy, layer, 0, x, "B")
    assert policy.version == 1
    assert policy.forward_params(1, 0.0) is policy.versions[0]  # tagged with version 0: still kept
    assert policy.out_tag(1, 0.0) == 0.0
    with pytest.raises(RuntimeError, match="no longer stashed"):
        policy.forward_params(2, -1.0)


def test_spectrain_forward_runs_on_predicted_weights() -> None:
    layer, opt = _stage()
    opt = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    policy = PredictedWeights(layer, opt, stage=0)
    order = [Action(0, "F", 0), Action(0, "F", 1), Action(0, "B", 0), Action(0, "B", 1)]
    policy.begin_segment(order)
    x = torch.ones(1, 3)
    _fb(policy, layer, 0, x, "F")
    _fb(policy, layer, 0, x, "B")  # one update: momentum buffer v = grad = x
    w = layer.weight.detach().clone()
    params = policy.forward_params(1, 0.0)
    assert params is not None
    torch.testing.assert_close(params["weight"].detach(), w - 1 * 0.1 * x)  # distance(mb 1) = 1
    assert policy.metrics()["predicted_distance"] == {"0": 1, "1": 1}


# --- measured bubble ------------------------------------------------------------------------------


def test_bubble_fraction_from_windows() -> None:
    # two stages, one segment of wall 10: stage 0 busy 8, stage 1 busy 6 -> idle 6 of 20
    assert bubble_fraction([[[0.0, 8.0, 8.0]], [[2.0, 10.0, 6.0]]]) == pytest.approx(0.3)
    assert bubble_fraction([[[0.0, 4.0, 4.0], []], [[0.0, 4.0, 2.0], []]]) == pytest.approx(0.25)
    assert theoretical_bubble(4, 8) == pytest.approx(3 / 11) and bubble_fraction([]) == 0.0


def test_overhead_fraction_is_the_time_neither_computing_nor_waiting() -> None:
    # stage 0: window 0..8, busy 6, waited 1 -> 1 of runtime overhead; stage 1: window 2..10,
    # busy 6, waited 2 -> none; wall 10 over 2 stages
    windows = [[[0.0, 8.0, 6.0, 1.0]], [[2.0, 10.0, 6.0, 2.0]]]
    assert overhead_fraction(windows) == pytest.approx(1 / 20)
    assert bubble_fraction(windows) == pytest.approx(8 / 20)


def test_segment_bubbles_are_per_mini_batch() -> None:
    windows = [[[0.0, 8.0, 8.0], [10.0, 14.0, 4.0]], [[2.0, 10.0, 6.0], [10.0, 14.0, 2.0]]]
    assert segment_bubbles(windows) == pytest.approx([0.3, 0.25])


# --- options and refusals before any process -------------------------------------------------------


@pytest.mark.parametrize(
    "strategy,sets,match",
    [
        ("gpipe", ["microbatches=5"], r"batch of 24 samples into 5 micro-batches.*--batch-size 20 or 25"),
        ("1f1b", ["partition=1,1"], r"Partition 1,1 holds 2 layers but the model has 3.*partition=2,1"),
        ("gpipe", ["partition=1,1,1"], r"needs 3 ranks .* --procs 2.*partition=2,1, or --procs 3"),
        ("gpipe", ["partition=2x1,1x2"], r"Partition 2,1x2 needs 3 ranks"),
        ("pipedream", ["partition=3;4"], r"Cannot read partition '3;4'"),
        ("gpipe", ["checkpoint=sometimes"], r"checkpoint"),
        ("gpipe", ["microbatches=0"], r"microbatches"),
    ],
)
def test_bad_pipeline_jobs_are_refused_before_launch(strategy: str, sets: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        polytrain.train(strategy=strategy, procs=2, sets=sets, out=tempfile.mkdtemp(), **COMMON)


def test_replicated_stages_under_an_asynchronous_schedule_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"replicates stage\(s\) \[1\] under 'pipedream'.*"
                                          r"--strategy 1f1b.*partition=2,1 with --procs 2"):
        polytrain.train(strategy="pipedream", procs=3, sets=["partition=2,1x2"], out=tempfile.mkdtemp(),
                        **COMMON)
    with pytest.raises(ConfigError, match=r"replicate=true with 'spectrain'"):
        polytrain.train(strategy="spectrain", procs=2, sets=["replicate=true"], out=tempfile.mkdtemp(),
                        **COMMON)


def test_more_stages_than_layers_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"has 3 layer\(s\) but the pipeline needs at least one per stage"):
        polytrain.train(strategy="1f1b", procs=4, out=tempfile.mkdtemp(), **COMMON)


def test_spectrain_needs_sgd() -> None:
    with pytest.raises(ConfigError, match="--optimizer sgd or momentum"):
        polytrain.train(
            strategy="spectrain", procs=2, out=tempfile.mkdtemp(), **{**COMMON, "optimizer": "adam"}
        )


def test_a_user_model_that_is_not_a_list_of_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "usernet_pp.py").write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.a = torch.nn.Linear(64, 10)\n"
        "    def forward(self, x):\n"
        "        return self.a(x.flatten(1))\n"
        "def build():\n"
        "    return Net()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    kw = {**COMMON, "model": "usernet_pp:build"}
    with pytest.raises(ConfigError,
                       match=r"1 layer\(s\).*held as ONE layer.*split=auto.*ordered list of layers"):
        polytrain.train(strategy="gpipe", procs=2, out=str(tmp_path / "run"), **kw)


# --- whole runs on one stage, in this process -----------------------------------------------------


def run_here(
    strategy: str,
    options: dict[str, Any] | None = None,
    run_dir: Path | None = None,
    resume: bool = False,
    **overrides: Any,
) -> tuple[RankResult, list[float], Recorder]:
    """``strategy`` on a world of 1 in this process; (result, per-step losses, recorder)."""
    run_dir = run_dir or Path(tempfile.mkdtemp())
    cfg = make_config({**COMMON, "strategy": strategy, "procs": 1, "options": options or {}, **overrides})
    strategy_obj = make_strategy(cfg.strategy, cfg.options)
    strategy_obj.check(cfg, 1)
    rec = Recorder(0)
    ctx = RankContext(
        rank=0,
        world=1,
        local_rank=0,
        device=torch.device("cpu"),
        backend="gloo",
        comm=Comm(0, 1),
        recorder=rec,
        run_dir=run_dir,
        checkpoints=CheckpointStore(run_dir / "checkpoints", "test"),
        resume=resume,
    )
    result = strategy_obj.run(Job.from_config(cfg), ctx)
    return result, [e["loss"] for e in rec.events if e["event"] == "step"], rec


@pytest.fixture(scope="module")
def reference() -> Iterator[tuple[RankResult, list[float]]]:
    result, losses, _ = run_here("single")
    yield result, losses


def _assert_equal(result: RankResult, losses: list[float], ref: tuple[RankResult, list[float]]) -> None:
    assert result.model_state is not None and ref[0].model_state is not None
    assert result.model_state.keys() == ref[0].model_state.keys()
    for k, v in ref[0].model_state.items():
        torch.testing.assert_close(result.model_state[k], v, atol=1e-6, rtol=1e-5)
    assert losses == pytest.approx(ref[1], rel=1e-6)


@pytest.mark.parametrize(
    "strategy,options",
    [
        ("gpipe", {"microbatches": 1}),
        ("gpipe", {"microbatches": 4, "checkpoint": "always"}),
        ("gpipe", {"microbatches": 6, "checkpoint": "except_last"}),
        ("1f1b", {"microbatches": 3}),
        ("1f1b", {"microbatches": 8, "checkpoint": "always"}),
        ("pipedream", {}),
        ("spectrain", {}),
    ],
)
def test_one_stage_equals_single(
    reference: tuple[RankResult, list[float]], strategy: str, options: dict[str, Any]
) -> None:
    result, losses, rec = run_here(strategy, options)
    _assert_equal(result, losses, reference)
    m = result.strategy_metrics
    assert (
        m["stages"] == 1
        and m["partition"]["text"] == "3"
        and m["layers_per_stage"] == [["fc1", "fc2", "head"]]
    )
    assert result.eval is not None and 0.0 <= result.eval["accuracy"] <= 1.0
    spans = [e for e in rec.events if e["event"] == "span" and e["name"] in ("forward", "backward")]
    per_step = options.get("microbatches", 1)
    assert len(spans) == 2 * per_step * COMMON["steps"]
    assert {(e["stage"], e["step"]) for e in spans} == {(0, s) for s in (1, 2, 3)}


def test_rematerialisation_and_1f1b_hold_less_activation_memory() -> None:
    peaks = {}
    for strategy, ckpt in [("gpipe", "never"), ("gpipe", "always"), ("1f1b", "never")]:
        result, _, _ = run_here(strategy, {"microbatches": 4, "checkpoint": ckpt}, steps=1)
        peaks[(strategy, ckpt)] = result.strategy_metrics["peak_activation_bytes_per_stage"][0]
    assert peaks[("gpipe", "always")] < peaks[("gpipe", "never")]
    assert peaks[("1f1b", "never")] < peaks[("gpipe", "never")]  # 1 micro-batch in flight, not 4


def test_stream_segments_checkpoint_and_resume_to_the_same_weights(tmp_path: Path) -> None:
    full, losses, _ = run_here("pipedream", steps=4, checkpoint_every=2, eval_every=2)
    assert full.steps == 4 and len(losses) == 4
    run_here("pipedream", run_dir=tmp_path, steps=2, checkpoint_every=2)  # drains, checkpoints step 2
    resumed, resumed_losses, _ = run_here(
        "pipedream", run_dir=tmp_path, resume=True, steps=4, checkpoint_every=2
    )
    assert resumed.steps == 2 and resumed_losses == pytest.approx(losses[2:])
    assert resumed.model_state is not None and full.model_state is not None
    for k, v in full.model_state.items():
        torch.testing.assert_close(resumed.model_state[k], v)


@pytest.mark.parametrize("mode", ["uniform", "params", "time", "auto", "2,1"])
def test_partition_modes_resolve_to_a_valid_partition(mode: str) -> None:
    from polytrain.strategies.pipeline.options import PipelineOptions
    from polytrain.strategies.pipeline.planning import resolve_partition

    cfg = make_config({**COMMON, "strategy": "gpipe"})
    job = Job.from_config(cfg)
    model = job.build_model()
    # a world of 2 seen from rank 0 whose communicator is local: broadcast_json returns its input
    ctx = RankContext(
        rank=0,
        world=2,
        local_rank=0,
        device=torch.device("cpu"),
        backend="gloo",
        comm=Comm(0, 1),
        recorder=Recorder(0),
        run_dir=Path(tempfile.mkdtemp()),
        checkpoints=CheckpointStore(Path(tempfile.mkdtemp()), "test"),
    )
    part, info = resolve_partition(PipelineOptions(partition=mode), model, ctx, job.dataset.x_train[:8],
                                   "gpipe")
    assert part.stages == 2 and part.layers == 3
    if mode == "params":  # fc1 64x128, fc2 128x128, head 128x10: the heavy layers apart
        assert part.counts == (1, 2)
    if mode == "2,1":
        assert part.counts == (2, 1)
    if mode in ("time", "auto"):
        assert len(info["profile_ms"]) == 3
        assert ("predicted_period_ms" in info) == (mode == "auto")


def test_timed_replay_equal_costs_gives_the_textbook_bubble() -> None:
    from polytrain.schedules.checks import simulate_times, timed_bubble
    from polytrain.schedules.registry import gpipe_orders, one_f_one_b_orders
    from polytrain.strategies.pipeline.metrics import schedule_bubble, theoretical_bubble

    for build in (gpipe_orders, one_f_one_b_orders):
        for p, m in ((2, 1), (2, 8), (4, 4)):
            orders = build(p, m)
            costs = {a: (0.01 if a.op == "F" else 0.02) for row in orders.values() for a in row}
            assert abs(timed_bubble(simulate_times(orders, costs)) - theoretical_bubble(p, m)) < 1e-9
            # per-message latency only adds idle time
            assert timed_bubble(simulate_times(orders, costs, latency=0.001)) > theoretical_bubble(p, m)
            # the metric replays recorded [op, mb, seconds] lists, two identical segments
            ops = [[[[a.op, a.microbatch, costs[a]] for a in orders[s]]] * 2 for s in range(p)]
            replayed, per_segment = schedule_bubble(ops)
            assert abs(replayed - theoretical_bubble(p, m)) < 1e-9 and len(per_segment) == 2
    # a slower second stage in the forward phase alone adds bubble under GPipe
    orders = gpipe_orders(2, 8)
    costs = {a: (0.018 if a.op == "F" and a.stage == 1 else 0.01 if a.op == "F" else 0.02)
             for row in orders.values() for a in row}
    assert timed_bubble(simulate_times(orders, costs)) > theoretical_bubble(2, 8) + 0.05


def test_collector_paused_during_a_flush_segment_only() -> None:
    import gc

    from polytrain.strategies.pipeline.shell import _collector_paused

    assert gc.isenabled()
    with _collector_paused(True):
        assert not gc.isenabled()
    assert gc.isenabled()
    with _collector_paused(False):  # a pipedream stream: collection stays on
        assert gc.isenabled()
    gc.disable()
    try:
        with _collector_paused(True):
            pass
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
