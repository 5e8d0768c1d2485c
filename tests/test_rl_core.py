"""DQN core oracles (ε ladder, n-step returns, double-DQN targets), config rules, rank layouts."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from polytrain.errors import ConfigError
from polytrain.rl.config import check_qnet, make_rl_config
from polytrain.rl.core import (
    NStep,
    TransitionRow,
    clip_grad_norm,
    double_dqn_td,
    epsilon_ladder,
    linear_epsilon,
    make_optimizer,
)
from polytrain.rl.roles import layout_ranks


def test_epsilon_ladder_matches_hand_computation() -> None:
    assert epsilon_ladder(1) == [0.4]
    assert epsilon_ladder(2) == pytest.approx([0.4, 0.4**8])
    # N = 3: 0.4^(1 + 7·i/2) for i = 0, 1, 2
    assert epsilon_ladder(3) == pytest.approx([0.4, 0.016190861620062, 0.00065536])
    eight = epsilon_ladder(8)
    assert eight[0] == 0.4 and eight[-1] == pytest.approx(0.4**8)
    assert all(a > b for a, b in itertools.pairwise(eight))  # strictly more greedy


def test_linear_epsilon_schedule() -> None:
    assert linear_epsilon(0, 1.0, 0.1, 100) == 1.0
    assert linear_epsilon(50, 1.0, 0.1, 100) == pytest.approx(0.55)
    assert linear_epsilon(500, 1.0, 0.1, 100) == pytest.approx(0.1)


def _play(nstep: NStep, rewards: list[float], terminated: bool) -> list[np.ndarray]:
    rows = []
    for t, r in enumerate(rewards):
        end = t == len(rewards) - 1
        rows += nstep.push(np.array([float(t)]), t % 2, r, np.array([float(t + 1)]),
                           terminated and end, (not terminated) and end)
    return rows


def test_n_step_returns_match_hand_computation() -> None:
    # γ = 0.5, n = 2, rewards 1, 2, 3, 4; the episode terminates after the 4th step (state s4)
    rows = _play(NStep(2, 0.5, obs_dim=1), [1.0, 2.0, 3.0, 4.0], terminated=True)
    layout = TransitionRow(1)
    obs, action, ret, nxt, disc = (t.tolist() for t in layout.split(torch.from_numpy(np.stack(rows))))
    assert obs == [[0.0], [1.0], [2.0], [3.0]]
    assert action == [0, 1, 0, 1]
    assert ret == pytest.approx([1 + 0.5 * 2, 2 + 0.5 * 3, 3 + 0.5 * 4, 4])
    assert nxt == [[2.0], [3.0], [4.0], [4.0]]
    assert disc == [0.25, 0.25, 0.0, 0.0]  # terminal: no bootstrap


def test_n_step_keeps_bootstrapping_after_truncation() -> None:
    rows = _play(NStep(2, 0.5, obs_dim=1), [1.0, 2.0, 3.0, 4.0], terminated=False)  # time limit
    disc = [float(r[-1]) for r in rows]
    assert disc == [0.25, 0.25, 0.25, 0.5]  # the last state was not terminal: γ^m with m steps taken


def _linear(weights: list[float]) -> nn.Module:
    layer = nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weights).reshape(2, 1))
    return layer


def test_double_dqn_target() -> None:
    online = _linear([1.0, 2.0])  # Q(x) = [x, 2x]
    target = _linear([3.0, -1.0])  # Q'(x) = [3x, -x]
    # obs 1, action 0, R = 1, next 2, discount 0.5: a' = argmax_online Q(2) = 1 (online picks),
    # valued by the target net: Q'(2)[1] = -2, so y = 1 + 0.5·(-2) = 0 and Q(1)[0] = 1.
    rows = torch.tensor([[1.0, 0.0, 1.0, 2.0, 0.5]])
    q, td = double_dqn_td(online, target, TransitionRow(1), rows)
    assert q.tolist() == [1.0] and td.tolist() == [-1.0]
    assert q.requires_grad and not td.requires_grad


def test_config_errors_name_rule_value_and_fix() -> None:
    with pytest.raises(ConfigError, match=r"Unknown environment 'CartPol-v1'.*CartPole-v1.*Did you mean"):
        make_rl_config({"env": "CartPol-v1"})
    with pytest.raises(ConfigError, match=r"--actors .* at least 1 \(got 0\)\. Use --actors 1"):
        make_rl_config({"algo": "apex", "actors": 0})
    with pytest.raises(ConfigError, match=r"--servers .* at least 1 \(got 0\)"):
        make_rl_config({"algo": "gorila", "servers": 0})
    with pytest.raises(ConfigError, match=r"Unknown RL algorithm 'apx'.*Did you mean 'apex'"):
        make_rl_config({"algo": "apx"})
    with pytest.raises(ConfigError, match=r"--batch-size 128 exceeds --replay-capacity 100"):
        make_rl_config({"batch_size": 128, "replay_capacity": 100, "learning_starts": 50})
    with pytest.raises(ConfigError, match=r"unknown option 'actor'.*Did you mean 'actors'"):
        make_rl_config({"actor": 3})
    with pytest.raises(ConfigError, match=r"--gamma = 1.5"):
        make_rl_config({"gamma": 1.5})
    with pytest.raises(ConfigError, match=r"--optimizer rmsprop: gorila's parameter servers"):
        make_rl_config({"algo": "gorila", "optimizer": "rmsprop"})
    with pytest.raises(ConfigError, match=r"--model 'cnn'.*'mlp'.*pkg.module:fn"):
        make_rl_config({"model": "cnn"})


def test_rank_layouts() -> None:
    apex = layout_ranks(make_rl_config({"algo": "apex", "actors": 3}))
    assert (apex.replica_ranks, apex.replay_rank, apex.actor_ranks) == ((0,), 1, (2, 3, 4))
    gorila = layout_ranks(make_rl_config({"algo": "gorila", "actors": 2, "learners": 2, "servers": 3}))
    assert (gorila.replica_ranks, gorila.replay_rank) == ((0, 1), 2)
    assert (gorila.server_ranks, gorila.actor_ranks) == ((3, 4, 5), (6, 7))
    assert make_rl_config({"algo": "gorila"}).priority_alpha == 0.0  # uniform replay, as in Gorila
    assert make_rl_config({"algo": "apex"}).priority_alpha == 0.6


class _Constant(nn.Module):
    """Always prefers action 0 (a policy that loses CartPole in ~10 steps)."""

    def __init__(self, actions: int) -> None:
        super().__init__()
        self.actions = actions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = torch.zeros(x.shape[0], self.actions)
        q[:, 0] = 1.0
        return q


def test_greedy_evaluation_and_its_early_give_up() -> None:
    from polytrain.rl.envs import greedy_returns

    returns, gave_up = greedy_returns(_Constant(2), "CartPole-v1", 10, seed=0)
    assert not gave_up and len(returns) == 10 and max(returns) < 30
    partial, gave_up = greedy_returns(_Constant(2), "CartPole-v1", 10, seed=0, give_up_below=475)
    assert gave_up and len(partial) < 10  # out of reach after the first short episode
    # Acrobot: rewards are −1 per step, so a mean above −100 is out of reach after ~100 steps
    partial, gave_up = greedy_returns(_Constant(3), "Acrobot-v1", 4, seed=0, give_up_below=-100)
    assert gave_up and partial == []


def test_user_q_network_factory(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from polytrain.rl.core import build_qnet
    from polytrain.rl.envs import ENVS

    (tmp_path / "myq.py").write_text(
        "from torch import nn\n"
        "def make(spec):\n"
        "    return nn.Sequential(nn.Linear(spec.input_shape[0], 16), nn.ReLU(),"
        " nn.Linear(16, spec.num_classes))\n"
        "def wrong(spec):\n"
        "    return nn.Linear(spec.input_shape[0], 7)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = make_rl_config({"algo": "dqn", "env": "Acrobot-v1", "model": "myq:make"})
    net = build_qnet(cfg.model, cfg.info, cfg.hidden, cfg.depth)
    assert net(torch.zeros(5, ENVS["Acrobot-v1"].obs_dim)).shape == (5, 3)
    # checked in the launching process, before any rank starts (polytrain.rl.api.run_config)
    check_qnet(cfg)
    with pytest.raises(ConfigError, match=r"--model myq:wrong: .* to \(7,\) per row; .* \(B, 3\)"):
        check_qnet(make_rl_config({"algo": "apex", "env": "Acrobot-v1", "model": "myq:wrong"}))
    with pytest.raises(ConfigError, match=r"Cannot import module 'nosuchmod'"):
        check_qnet(make_rl_config({"algo": "apex", "model": "nosuchmod:make"}))


def test_unwritable_run_directory_is_a_config_error() -> None:
    from polytrain.rl.results import new_run_dir

    with pytest.raises(ConfigError, match=r"--out /proc/polytrain-rl: cannot create the run directory"):
        new_run_dir(make_rl_config({"out": "/proc/polytrain-rl"}))


def test_wire_message_packs_ints_and_floats_into_one_padded_payload() -> None:
    from polytrain.rl.protocol import HEADER, Kind, Msg, _tensors, _unpack

    ids = torch.tensor([0, 7, 2**31 - 1])
    floats = torch.tensor([1.5, -2.0, float("inf")])
    header, payload = _tensors(Msg(Kind.OK, [3.0, 4.5], ids, floats), pad=10)
    assert header.numel() == HEADER and payload.numel() == 10 and payload[6:].eq(0).all()
    msg = _unpack(header, payload)
    assert msg.kind == Kind.OK and msg.fields[:2] == [3.0, 4.5]
    assert msg.ints is not None and msg.ints.tolist() == ids.tolist()
    assert msg.floats is not None and msg.floats.tolist() == floats.tolist()
    assert len(_tensors(Msg(Kind.HALT))) == 1  # no payload at all...
    halt, pad = _tensors(Msg(Kind.HALT), pad=4)  # ...unless the receiver posted one
    assert _unpack(halt, pad).kind == Kind.HALT and pad.numel() == 4
    with pytest.raises(ValueError, match="exceeds the 2 its receiver posted"):
        _tensors(Msg(Kind.OK, [], ids), pad=2)


@pytest.mark.parametrize("scale", [0.01, 100.0])
def test_clip_grad_norm_matches_torch(scale: float) -> None:
    """The learner's foreach clipping gives torch's clip_grad_norm_ results (below and above)."""
    torch.manual_seed(0)
    mine = [nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    theirs = [nn.Parameter(p.detach().clone()) for p in mine]
    for a, b in zip(mine, theirs, strict=True):
        a.grad = torch.randn_like(a) * scale
        b.grad = a.grad.clone()
    clip_grad_norm(mine, 10.0)
    nn.utils.clip_grad_norm_(theirs, 10.0)
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a.grad, b.grad)


def test_adam_is_torchs_adam() -> None:
    """The DQN core's (fused) Adam takes the steps of torch's reference Adam."""
    torch.manual_seed(0)
    mine = [nn.Parameter(torch.randn(6, 4)) for _ in range(2)]
    theirs = [nn.Parameter(p.detach().clone()) for p in mine]
    ours, ref = make_optimizer("adam", mine, 1e-2), torch.optim.Adam(theirs, lr=1e-2, foreach=False)
    for _ in range(20):
        for a, b in zip(mine, theirs, strict=True):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        ours.step()
        ref.step()
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
