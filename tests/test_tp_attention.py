"""Tier 1: ``tensor``'s plans for users' attention (polytrain/strategies/model/tp_attention.py).

Oracle: T = 2 shards trained in two threads of this process (LocalComm: the same sharding code,
f/g operators and gather as a real run, the all-reduce in memory) equal single-process training:
the loss of every step and the parameters gathered back to full shapes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from userzoo.attention import FusedAttention, OddNamesLM, OpaqueLM, SeparateLM
from userzoo.nanogpt import GPT, GPTConfig

from polytrain.config import load_config
from polytrain.errors import ConfigError
from polytrain.strategies import make_strategy
from polytrain.strategies.model.shard_collectives import Wire, gather_state
from polytrain.strategies.model.tensor import shard_model
from polytrain.strategies.model.tp_attention import attention_plan, local_comms, run_ranks
from polytrain.strategies.model.tp_plan import unchunk

STEPS, T = 3, 2
ODD_PLAN = ("blocks.*.attn.wqkv:qkv,blocks.*.attn.proj_out:rowwise,blocks.*.attn:heads=nh,"
            "blocks.*.mlp.fc1:colwise,blocks.*.mlp.fc2:rowwise")


def _loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    out = model(idx[:, :-1])
    logits = out[0] if isinstance(out, tuple) else out
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def _train(model: nn.Module, batches: list[torch.Tensor]) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for idx in batches:
        opt.zero_grad()
        loss = _loss(model, idx)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def tensor_equals_single(model: nn.Module, plan: str) -> int:
    """Train ``model`` single and split by ``plan`` over T threads; assert equal; return the
    number of sharded parameters."""
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 50, (4, 17), generator=gen) for _ in range(STEPS)]
    single = copy.deepcopy(model)
    want = _train(single, batches)
    full_shapes = {k: v.shape for k, v in model.state_dict().items()}
    comms = local_comms(T)
    shards = [copy.deepcopy(model) for _ in comms]
    plans = [shard_model(m, Wire(c), plan) for m, c in zip(shards, comms, strict=True)]

    def rank(comm: object) -> tuple[list[float], dict[str, torch.Tensor]]:
        r = comm.rank  # type: ignore[attr-defined]
        losses = _train(shards[r], batches)
        dims, chunked = plans[r]
        full = gather_state(Wire(comm), shards[r].state_dict(), dims, full_shapes)  # type: ignore[arg-type]
        return losses, {k: unchunk(v, T, chunked[k]) if k in chunked else v
                        for k, v in full.items()}

    results = run_ranks(comms, rank)
    for losses, state in results:
        assert losses == pytest.approx(want, rel=1e-5, abs=1e-6)
        ref = single.state_dict()
        assert state.keys() == ref.keys()
        for k in ref:
            torch.testing.assert_close(state[k], ref[k], atol=1e-5, rtol=1e-4, msg=k)
    return len(plans[0][0])


GPT_PLAN = ("transformer.h.*.attn.c_attn:qkv,transformer.h.*.attn.c_proj:rowwise,"
            "transformer.h.*.attn:heads,transformer.h.*.mlp.c_fc:colwise,"
            "transformer.h.*.mlp.c_proj:rowwise")


@pytest.mark.parametrize("plan", ["auto", GPT_PLAN])
def test_nanogpt_attention_and_mlp_equal_single(plan: str) -> None:
    """Fused c_attn (q|k|v in thirds), nanoGPT's C = x.size() read traced as the local width;
    derived, and the same plan written out."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=16))
    # per layer: c_attn weight+bias, attn c_proj weight, c_fc weight+bias, mlp c_proj weight
    assert tensor_equals_single(gpt, plan) == 12


def test_separate_qkv_derived_equal_single() -> None:
    torch.manual_seed(0)
    model = SeparateLM()
    assert tensor_equals_single(model, "auto") == 2 * (3 * 2 + 1 + 3)
    comms = local_comms(T)
    shard_model(model, Wire(comms[1]), "auto")
    attn = model.blocks[0].attn
    assert (attn.num_heads, attn.head_dim, attn.q_proj.weight.shape[0]) == (2, 4, 8)


def test_unrecognised_attention_by_named_plan() -> None:
    torch.manual_seed(0)
    model = OddNamesLM()
    assert tensor_equals_single(model, "auto") == 2 * 3  # only the MLPs: 'nh' is no known name
    assert tensor_equals_single(model, ODD_PLAN) == 2 * (2 + 1 + 3)


def test_attention_neither_way_is_refused_naming_the_module() -> None:
    with pytest.raises(ConfigError) as info:
        shard_model(OpaqueLM(), Wire(local_comms(T)[0]), "auto")
    msg = str(info.value)
    for word in ("'blocks.0.attn' (FusedAttention)", "head attributes: RuntimeError",
                 "traced width", "tp_plan"):
        assert word in msg
    odd = FusedAttention(16, 4, odd=True)
    odd.n_head = 4
    with pytest.raises(ConfigError, match=r"'attn' \(FusedAttention\).*wqkv, proj_out.*"
                                          r"attn.wqkv:qkv,attn.proj_out:rowwise,attn:heads"):
        attention_plan("attn", odd)
    with pytest.raises(ConfigError, match=r"'blocks.0.attn'.nh = 4 does not split over 3"):
        shard_model(OddNamesLM(), Wire(local_comms(3)[0]), ODD_PLAN)


def test_tensor_check_proves_the_plan_before_launch() -> None:
    cfg = load_config(overrides={"strategy": "tensor", "model": "userzoo.attention:OpaqueLM",
                                 "dataset": "chars"}, sets=["data.seq_len=16"])
    with pytest.raises(ConfigError, match=r"cannot split the heads of 'blocks\.0\.attn'"):
        make_strategy("tensor", {}).check(cfg, 2)
    ok = load_config(overrides={"strategy": "tensor", "model": "userzoo.attention:SeparateLM",
                                "dataset": "chars"}, sets=["data.seq_len=16"])
    make_strategy("tensor", {}).check(ok, 2)


def test_mesh_tensor_groups_prove_a_users_plan_before_launch() -> None:
    cfg = load_config(overrides={"strategy": "mesh", "model": "userzoo.attention:OpaqueLM",
                                 "dataset": "chars"}, sets=["data.seq_len=16"])
    with pytest.raises(ConfigError, match=r"cannot split the heads of 'blocks\.0\.attn'"):
        make_strategy("mesh", {"dp": 1, "tp": 2}).check(cfg, 2)
