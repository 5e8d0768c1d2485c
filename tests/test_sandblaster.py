"""``sandblaster``: the shard-wise two-loop recursion against torch.optim.LBFGS in one process
(tier 1), and a real run — coordinator, 2 servers, 2 workers, one of them slow — against
torch.optim.LBFGS on the full batch (tier 3)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

import polytrain
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.strategies import make_strategy
from polytrain.strategies.ps.lbfgs import LbfgsShard, run_shards
from tests.conftest import assert_same_params, load_model, step_losses
from tests.test_ps_oracles import _job

COMMON = {"model": "mlp", "dataset": "digits", "steps": 6, "seed": 3, "lr": 0.5}
SETS = ["model.hidden=32"]


def lbfgs_reference(history: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """torch.optim.LBFGS, fixed step, on the whole training set, once per iteration."""
    job = _job(COMMON, SETS)
    model = job.build_model()
    opt = torch.optim.LBFGS(model.parameters(), lr=COMMON["lr"], max_iter=1, history_size=history)
    x, y = job.dataset.x_train, job.dataset.y_train

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = job.loss(model(x), y)
        loss.backward()
        return loss

    losses = [float(opt.step(closure).detach()) for _ in range(job.steps)]  # type: ignore[union-attr]
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


@pytest.mark.parametrize("cuts", [[0, None], [0, 100, 700, None]])
def test_shards_equal_torch_lbfgs(cuts: list[int | None]) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(200, 10), torch.randint(0, 3, (200,))

    def model() -> torch.nn.Sequential:
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))

    ref = model()
    opt = torch.optim.LBFGS(ref.parameters(), lr=0.5, max_iter=1, history_size=3)
    ours = model()
    params = list(ours.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    bounds = [c if c is not None else flat.numel() for c in cuts]
    shards = [LbfgsShard(flat[a:b].clone(), 0.5, 3) for a, b in itertools.pairwise(bounds)]
    for _ in range(8):
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ref(x), y)
            loss.backward()
            return loss
        opt.step(closure)
        torch.nn.utils.vector_to_parameters(torch.cat([s.x for s in shards]), params)
        ours.zero_grad()
        torch.nn.functional.cross_entropy(ours(x), y).backward()
        g = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
        moved, rounds = run_shards(shards, [g[a:b] for a, b in itertools.pairwise(bounds)])
        assert moved
    assert rounds == 2 * 3 + 3  # max|g|, (ys, yy), 3 + 3 two-loop rounds, g·d
    torch.testing.assert_close(torch.cat([s.x for s in shards]),
                               torch.cat([p.detach().reshape(-1) for p in ref.parameters()]),
                               atol=1e-4, rtol=1e-4)


def test_roles_and_checks() -> None:
    assert make_strategy("sandblaster", {"servers": 2}).roles(5) == [
        "coordinator", "server", "server", "worker", "worker"]
    cfg = make_config({"strategy": "sandblaster", "procs": 2, "model": "mlp"})
    with pytest.raises(ConfigError, match="needs at least one worker"):
        make_strategy("sandblaster", {}).check(cfg, 2)


@pytest.mark.slow
def test_equals_torch_lbfgs_on_the_full_batch(tmp_path: Path) -> None:
    out = tmp_path / "sb"
    summary = polytrain.train(strategy="sandblaster", procs=5, out=str(out),
                              sets=[*SETS, "servers=2", "history=4", "slow_rank=4", "slow_factor=20"],
                              **COMMON)
    ref, ref_losses = lbfgs_reference(history=4)
    assert_same_params(load_model(out), ref, atol=1e-4, rtol=1e-3)
    ours = step_losses(out)
    assert list(ours.values()) == pytest.approx(ref_losses, rel=1e-4)
    m = summary["strategy_metrics"]
    assert sum(m["portions_per_worker"]) == 6 * m["portions"] == 6 * 8
    assert m["portions_per_worker"][1] < m["portions_per_worker"][0]  # the slow worker did fewer
    assert m["server_params"][0] - m["server_params"][1] in (0, 1)
