"""Tier 1: non-Sequential modules cut into traced stage segments (polytrain/models/trace.py)."""

from __future__ import annotations

import pytest
import torch
from userzoo.nanogpt import GPT, GPTConfig, UntiedGPT
from userzoo.resnet import resnet18

from polytrain.config import load_config
from polytrain.data import dataset_spec
from polytrain.errors import ConfigError
from polytrain.models import build_model
from polytrain.models.trace import split_model
from polytrain.strategies.pipeline.ties import find_ties

CFG = GPTConfig(block_size=16, vocab_size=50, n_layer=4, n_head=2, n_embd=16)


@pytest.mark.parametrize(("split", "segments"), [("layer2,layer3.1", 3), ("auto", 11)])
def test_resnet_split_computes_the_same(split: str, segments: int) -> None:
    torch.manual_seed(0)
    net = resnet18(num_classes=10, width=4).eval()
    cut = split_model(net, split).eval()
    x = torch.randn(2, 3, 16, 16)
    assert len(cut) == segments
    torch.testing.assert_close(cut(x), net(x), rtol=0, atol=0)
    names = {n for n, _ in cut.named_parameters()}
    assert sum(p.numel() for p in cut.parameters()) == sum(p.numel() for p in net.parameters())
    assert any("layer3.1.conv1" in n for n in names)


def test_gpt_split_keeps_logits_and_its_tie_across_segments() -> None:
    torch.manual_seed(0)
    tied = GPT(CFG)
    cut = split_model(tied, "transformer.h.2")
    (tie,) = find_ties(cut, list(cut.children()))  # one parameter object, used by both segments
    assert tie.stages == (0, 1) and any(n.endswith("lm_head.weight") for n in tie.names)
    idx = torch.randint(0, 50, (2, 16))
    torch.testing.assert_close(cut(idx), tied(idx)[0], rtol=0, atol=0)
    gpt = UntiedGPT(CFG)
    idx = torch.randint(0, 50, (2, 16))
    for split, n in (("transformer.h.2", 2), ("transformer.h.1,transformer.ln_f", 3), ("auto", 7)):
        cut = split_model(gpt, split)
        assert len(cut) == n
        torch.testing.assert_close(cut(idx), gpt(idx)[0], rtol=0, atol=0)


@pytest.mark.parametrize(("split", "words"), [
    ("layer9", ["'layer9' names no submodule", "Valid module paths: conv1", "layer4.1.conv2"]),
    ("layer2.0.conv2", ["carry 2 values", "layer1", "layer2.0.relu"]),
])
def test_split_errors(split: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        split_model(resnet18(num_classes=10, width=4), split)
    for w in words:
        assert w in str(info.value)


def test_split_is_a_model_option_for_any_strategy() -> None:
    cfg = load_config(None, {}, ["split=layer2", "model.width=4"])
    assert cfg.model_options == {"split": "layer2", "width": 4} and cfg.options == {}
    spec = dataset_spec("synthetic-images", {"size": 16})
    model = build_model("userzoo.resnet:resnet18", spec, cfg.model_options)
    assert len(model) == 2
    with pytest.raises(ConfigError, match="zoo model 'cnn' is already a list of layers"):
        build_model("cnn", dataset_spec("digits"), {"split": "auto"})
