"""Tier 1: non-Sequential modules cut into traced stage segments (polytrain/models/trace.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from userzoo.nanogpt import GPT, GPTConfig, UntiedGPT
from userzoo.resnet import resnet18

from polytrain.config import load_config
from polytrain.data import dataset_spec
from polytrain.errors import ConfigError
from polytrain.models import build_model
from polytrain.models.split import split_model
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


# --- torch.export first, torch.fx where it cannot, a clear error where neither can ------------


class Clamp(nn.Module):
    """Data-dependent Python control flow: torch.export cannot trace it; FX keeps it whole."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / 2 if float(x.abs().max()) > 1e3 else x


class ClampNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.clamp, self.b = nn.Linear(4, 8), Clamp(), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.clamp(torch.relu(self.a(x))))


class Double(nn.Module):
    """Its own ``if self.training``: export records the training branch only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if self.training else x


class ModeNet(ClampNet):
    def __init__(self) -> None:
        super().__init__()
        self.clamp = Double()


class Branchy(ClampNet):
    """The branch in its own forward: neither tracer can follow it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) if float(x.sum()) > 0 else self.b(-self.a(x))


def test_export_first_keeps_ties_modes_and_buffers() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=16, dropout=0.2)
    tied = GPT(cfg)
    cut = split_model(tied, "transformer.h.1", torch.zeros(2, 16, dtype=torch.long))
    assert (cut.tracer, cut.tracer_fallback) == ("torch.export", None)
    assert "device(type='cpu')" not in cut[0].code  # arange(T) on its input's device
    (tie,) = find_ties(cut, list(cut.children()))  # named by use: the head's segment says lm_head
    assert tie.stages == (0, 1) and any(n.endswith("lm_head.weight") for n in tie.names)
    idx = torch.randint(0, 50, (3, 16))  # another batch size than the example's
    torch.manual_seed(5)
    ours = cut(idx)  # training mode: dropout draws the same masks in the same order
    torch.manual_seed(5)
    torch.testing.assert_close(ours, tied(idx)[0], rtol=0, atol=0)
    cut.eval()
    tied.eval()
    torch.testing.assert_close(cut(idx), tied(idx)[0], rtol=0, atol=0)
    net = resnet18(num_classes=10, width=4)
    ref = copy.deepcopy(net)
    cut = split_model(net, "layer2", torch.zeros(2, 3, 16, 16))
    assert cut.tracer == "torch.export" and len(cut) == 2
    x = torch.randn(4, 3, 16, 16)
    torch.testing.assert_close(cut(x), ref(x), rtol=0, atol=0)  # batch statistics, stats updated
    cut.eval()
    ref.eval()
    torch.testing.assert_close(cut(x), ref(x), rtol=0, atol=0)  # running statistics, none updated
    ours_sd, theirs = cut.state_dict(), ref.state_dict()
    assert ours_sd["0.m.bn1.num_batches_tracked"] == theirs["bn1.num_batches_tracked"] == 1
    torch.testing.assert_close(ours_sd["1.m.layer4.1.bn2.running_var"],
                               theirs["layer4.1.bn2.running_var"], rtol=0, atol=0)


def test_export_cut_inside_a_residual_block_packs_its_values() -> None:
    """As torch.distributed.pipelining cuts: the block's input and conv1's output cross together,
    packed into one (B, 4·4·4 + 8·2·2) tensor; values and gradients are the module's."""
    torch.manual_seed(0)
    net = resnet18(num_classes=10, width=4)
    ref = copy.deepcopy(net)
    cut = split_model(net, "layer2.0.conv2", torch.randn(2, 3, 16, 16))
    assert cut.tracer == "torch.export" and len(cut) == 2
    x = torch.randn(3, 3, 16, 16)
    assert cut[0](x).shape == (3, 4 * 4 * 4 + 8 * 2 * 2)
    ours, theirs = cut(x), ref(x)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    ours.square().sum().backward()
    theirs.square().sum().backward()
    grads = {n.split(".m.", 1)[1]: p.grad for n, p in cut.named_parameters()}
    for n, p in ref.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=0, atol=0, msg=n)


def test_fx_where_export_cannot() -> None:
    torch.manual_seed(0)
    net = ClampNet()
    cut = split_model(net, "clamp,b", torch.zeros(2, 4))
    assert cut.tracer == "torch.fx" and len(cut) == 3
    assert cut.tracer_fallback.startswith("torch.export: ")
    x = torch.randn(3, 4)
    torch.testing.assert_close(cut(x), net(x), rtol=0, atol=0)


def test_fx_where_export_misses_a_mode_branch() -> None:
    torch.manual_seed(0)
    net = ModeNet()
    cut = split_model(net, "b", torch.randn(2, 4))
    assert cut.tracer == "torch.fx" and "eval mode" in cut.tracer_fallback
    x = torch.randn(3, 4)
    torch.testing.assert_close(cut(x), net(x), rtol=0, atol=0)
    torch.testing.assert_close(cut.eval()(x), net.eval()(x), rtol=0, atol=0)


def test_neither_tracer_is_refused_naming_the_module() -> None:
    with pytest.raises(ConfigError) as info:
        split_model(Branchy(), "b", torch.zeros(2, 4))
    msg = str(info.value)
    for word in ("cannot trace Branchy.forward", "torch.export: ", "torch.fx: ",
                 "named children (split=PATHS among: a, clamp, b", "nn.Sequential"):
        assert word in msg


def test_registry_splits_with_an_example_batch() -> None:
    spec = dataset_spec("chars", {"seq_len": 16})
    model = build_model("userzoo.nanogpt:GPT", spec,
                        {"n_layer": 1, "n_head": 2, "n_embd": 16, "split": "transformer.h.0"})
    assert model.tracer == "torch.export" and len(model) == 2
