"""The planner prices gradient codecs from the real codecs: payload sizes as the runtime sends
them, all-gather vs in-place reduction, and a real run's counted bytes equal the prediction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from polytrain.comm.codecs.engine import Engine
from polytrain.comm.exchange import Item, units
from polytrain.comm.options import CodecOptions
from polytrain.config import load_config
from polytrain.cost.cluster import Cluster
from polytrain.cost.codecs import DEFAULT_CODECS, price
from polytrain.cost.estimate import allreduce
from polytrain.cost.scene import Scene
from polytrain.plan.commands import first_choice
from polytrain.plan.recommend import candidates, rank
from tests.test_plan_recommend import vgg_like

PARAMS = (("a.weight", (64, 33)), ("a.bias", (64,)), ("b.weight", (10, 64)), ("b.bias", (10,)))


@pytest.mark.parametrize("codec, opts", [("fp16", {}), ("bf16", {}), ("randomk", {"ratio": 0.1}),
                                         ("topk", {"ratio": 0.05}), ("onebit", {}), ("terngrad", {}),
                                         ("qsgd", {"levels": 4}), ("dgc", {"ratio": 0.01}),
                                         ("topk+onebit", {"ratio": 0.05})])
def test_payload_is_what_the_runtime_encodes(codec: str, opts: dict) -> None:
    p = price(codec, opts, PARAMS, world=2, repeats=1)
    eng = Engine.from_options(CodecOptions(compression=codec, **opts), world=2, rank=0, seed=0)
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(torch.Size(s).numel(), generator=gen) for _, s in PARAMS]
    # the runtime's grouping: one DDP bucket holds these four (flat codecs: one payload)
    named = enumerate(zip(PARAMS, grads, strict=True))
    groups = units(eng, [Item(i, n, g.view(s)) for i, ((n, s), g) in named])
    assert len(groups) == (1 if eng.codec.flat else len(PARAMS))
    if eng.codec.reducible:
        payloads = [u.encode_payload(eng) for u in groups]
        sent = sum(q["values"].numel() * q["values"].element_size() for q in payloads)
    else:
        sent = sum(u.encode(eng).numel() for u in groups)
    assert p.payload_bytes == sent and p.fp32_bytes == 4 * sum(g.numel() for g in grads)
    assert p.reducible == bool(eng.codec.reducible) and p.ratio > 1


def test_unpriceable_codecs_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="tau"):
        price("threshold", {}, PARAMS, world=2)


def test_codecs_are_listed_never_chosen_by_default_and_win_on_a_slow_link() -> None:
    scene = Scene(vgg_like(), Cluster.parse("hosts=4,nic=10mbit"), 64)  # 53 MB of fp32 per step: ~40 s
    ranked = rank(candidates(scene))
    coded = [c for c in ranked if c.options.get("compression")]
    assert {c.options["compression"] for c in coded} == {name for name, _ in DEFAULT_CODECS}
    assert not any(c.exact for c in coded)
    plain = next(c for c in ranked if c.strategy == "allreduce" and not c.options)
    topk = next(c for c in coded if c.options["compression"] == "topk")
    assert topk.estimate.bytes_per_step < plain.estimate.bytes_per_step / 10
    assert topk.estimate.step_s < plain.estimate.step_s
    cfg = load_config(None, {"strategy": "allreduce", "procs": 4})
    assert not first_choice(ranked, cfg).options.get("compression")
    # all-gather: every rank sends its frame and its size to the W-1 others
    e = allreduce(scene, 4, codec=price("topk", {"ratio": 0.01}, scene.profile.params, world=4, repeats=1))
    b = e.detail["buckets"]
    assert b >= 1
    frame = e.detail["payload_bytes"] + 4 * (b + b)  # topk is flat: one part per bucket
    assert e.bytes_per_step == 4 * 3 * (frame + 8 * b)


@pytest.mark.slow
def test_a_real_compressed_run_sends_the_predicted_bytes(tmp_path: Path) -> None:
    import polytrain

    polytrain.train(strategy="allreduce", procs=2, steps=3, out=str(tmp_path / "r"),
                    options={"compression": "topk", "ratio": 0.01})
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["prediction"]["modelled"] is True
    assert s["prediction"]["bytes_per_step"] == s["bytes_sent"] / 3
