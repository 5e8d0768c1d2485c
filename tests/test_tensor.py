"""`tensor` (Megatron): T = 2 and 4 equal single-process training of the same gpt-mini —
per-step losses and the parameters gathered back to full shapes — and the traffic is exactly the
four activation all-reduces per layer and step the paper counts."""

from __future__ import annotations

from pathlib import Path

import pytest

import polytrain
from polytrain.config import load_config
from polytrain.errors import ConfigError
from polytrain.strategies import make_strategy
from tests.conftest import assert_same_params, load_model, step_losses
from tests.test_model_parallel_refs import GPT, single_reference

SEQ, D_MODEL, LAYERS = 64, 32, 1  # chars' default T; GPT's model options


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return single_reference(tmp_path_factory, GPT)


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_equals_single(reference: Path, tmp_path: Path, tp: int) -> None:
    out = tmp_path / f"tp{tp}"
    summary = polytrain.train(strategy="tensor", procs=tp, out=str(out), **GPT)
    assert_same_params(load_model(out), load_model(reference))
    ours, theirs = step_losses(out), step_losses(reference)
    assert list(ours) == [1, 2, 3]
    for s in ours:
        assert ours[s] == pytest.approx(theirs[s], rel=1e-5, abs=1e-6)
    assert summary["strategy_metrics"]["allreduces_per_step"] == 4 * LAYERS
    # each all-reduce carries a (B, T, D) float32 activation or its gradient; ring traffic
    # 2(T-1)/T of it per rank
    activation = GPT["batch_size"] * SEQ * D_MODEL * 4
    per_rank = 3 * 4 * LAYERS * 2 * (tp - 1) * activation // tp
    for rec in summary["per_rank"]:
        assert rec["bytes_by_op"]["tp_allreduce"] == per_rank
        assert rec["bytes_by_op"]["eval_tp_allreduce"] > 0  # the parallel forward on the test set
    assert summary["eval"]["accuracy"] > 0


def test_tensor_refuses_heads_that_do_not_split() -> None:
    strategy = make_strategy("tensor", {})
    cfg = load_config(overrides={"strategy": "tensor", "model": "gpt-mini", "dataset": "chars"},
                      sets=["model.n_head=4"])
    strategy.check(cfg, 4)
    with pytest.raises(ConfigError, match=r"n_head.*multiple.*--set model.n_head=3"):
        strategy.check(cfg, 3)


def test_tensor_refuses_models_without_transformer_blocks() -> None:
    cfg = load_config(overrides={"strategy": "tensor", "model": "cnn", "dataset": "digits"})
    with pytest.raises(ConfigError, match=r"--model cnn has none.*gpt-mini"):
        make_strategy("tensor", {}).check(cfg, 2)
