"""Tier 1: the model zoo, user factories and the errors users see (no processes)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from polytrain.data import DataSpec, dataset_spec, load_dataset, task_correct, task_loss
from polytrain.errors import ConfigError
from polytrain.models import (
    MODELS,
    alexnet_columns,
    build_model,
    column_slice,
    count_parameters,
    describe_models,
    exchange_points,
    is_user_model,
    load_user_model,
    model_names,
    parameter_count,
    resolve_model,
    validate_model,
)

IMAGES = {"channels": 3, "size": 32, "classes": 10, "train": 8, "test": 8}
CHARS = {"seq_len": 16, "chars": 20_000}
BOW = {"features": 200, "classes": 5, "train": 8, "test": 8}
IDS_DATA = {"features": 300, "classes": 5, "nnz": 4, "train": 8, "test": 8}

# (model, model options, dataset, dataset options, output shape for a batch of 2)
CASES = [
    ("mlp", {"hidden": 16}, "digits", {}, (2, 10)),
    ("mlp", {"hidden": 16, "depth": 0}, "sparse-bow", BOW, (2, 5)),
    ("mlp", {"hidden": 16, "depth": 3}, "synthetic-images", IMAGES, (2, 10)),
    ("cnn", {}, "digits", {}, (2, 10)),
    ("cnn", {"channels": 4}, "synthetic-images", IMAGES, (2, 10)),
    ("vgg16", {"width": 4}, "synthetic-images", IMAGES, (2, 10)),
    ("vgg16", {"width": 4, "adapt_pool": True}, "digits", {}, (2, 10)),
    ("alexnet", {"width": 12}, "synthetic-images", IMAGES, (2, 10)),
    ("alexnet", {"width": 6, "groups": 1}, "digits", {}, (2, 10)),
    ("gpt-mini", {"d_model": 32}, "chars", CHARS, (2, 16, 256)),
    ("seq2seq-lstm", {"hidden": 16, "layers": 3}, "chars", CHARS, (2, 8, 256)),
    ("sparse-bow", {"dim": 8, "hidden": 8}, "bow-ids", IDS_DATA, (2, 5)),
    ("gpt-mini", {"d_model": 32, "vocab": 1000}, "chars", CHARS, (2, 16, 256)),
]
IDS = [f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)]


def sample_input(spec: DataSpec, batch: int = 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    if spec.input_dtype == "long":
        return torch.randint(spec.num_classes, (batch, *spec.input_shape), generator=gen)
    return torch.randn((batch, *spec.input_shape), generator=gen)


def test_zoo_names_and_entries():
    assert model_names() == ["alexnet", "cnn", "gpt-mini", "mlp", "seq2seq-lstm", "sparse-bow",
                             "vgg16"]
    for name, entry in MODELS.items():
        assert entry.name == name and entry.description and entry.tasks
        assert entry.default_dataset in {"digits", "synthetic-images", "chars", "bow-ids"}


@pytest.mark.parametrize(("model", "mopts", "data", "dopts", "shape"), CASES, ids=IDS)
def test_children_map_one_tensor_to_one_tensor(model, mopts, data, dopts, shape):
    spec = dataset_spec(data, dopts)
    torch.manual_seed(0)
    net = build_model(model, spec, mopts)
    assert isinstance(net, nn.Sequential) and len(net) >= (1 if mopts.get("depth") == 0 else 3)
    x = sample_input(spec)
    out = net(x)
    assert out.shape == shape
    h = x
    for child in net.children():  # what a pipeline does: one stage after another
        h = child(h)
        assert isinstance(h, torch.Tensor)
    assert torch.equal(h, out)
    y = torch.zeros((2, *spec.input_shape[:1]) if spec.task == "lm" else 2, dtype=torch.long)
    task_loss(spec, out, y).backward()  # the task helpers accept the output; gradients flow
    assert all(p.grad is not None for p in net.parameters())


@pytest.mark.parametrize(("model", "mopts", "data", "dopts", "shape"), CASES[::2], ids=IDS[::2])
def test_same_seed_same_init(model, mopts, data, dopts, shape):
    spec = dataset_spec(data, dopts)
    states = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        states.append(build_model(model, spec, mopts).state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert any(not torch.equal(states[0][k], states[2][k]) for k in states[0])


def test_parameter_counts():
    digits = dataset_spec("digits")
    assert count_parameters(build_model("mlp", digits)) == 64 * 128 + 128 + 128 * 129 + 129 * 10
    assert count_parameters(build_model("cnn", digits)) == 160 + 4640 + 32832 + 650  # 38,282
    imagenet = DataSpec("imagenet", "classify", (3, 224, 224), "float", 1000, 1, 1)
    # The real networks, counted on the meta device (nothing allocated):
    assert parameter_count("vgg16", imagenet, {"hidden": 4096}) == 138_357_544
    assert parameter_count("alexnet", imagenet) == 60_965_224  # grouped, as in the paper
    rows = {row["name"]: row for row in describe_models()}
    assert set(rows) == set(model_names())
    assert rows["cnn"]["parameters"] == 38_282 and rows["cnn"]["default_dataset"] == "digits"
    assert rows["vgg16"]["parameters"] > 100_000_000  # full width, still instant (meta device)


def layer(net: nn.Module, path: str) -> Any:
    """A submodule by dotted path, typed loosely for attribute access in tests."""
    return net.get_submodule(path)


@pytest.mark.parametrize("width", [4, 8, 64])
def test_vgg16_fc1_holds_about_three_quarters(width):
    spec = dataset_spec("synthetic-images")
    total = parameter_count("vgg16", spec, {"width": width})
    with torch.device("meta"):
        net = build_model("vgg16", spec, {"width": width})
    assert 0.65 <= count_parameters(layer(net, "fc1")) / total <= 0.85
    names = [name for name, _ in net.named_children()]
    assert len(names) == 16 and names[0] == "conv1_1" and names[-3:] == ["fc1", "fc2", "fc3"]


def test_alexnet_two_column_plan_is_exact_for_grouped_layers():
    spec = dataset_spec("synthetic-images", IMAGES)
    torch.manual_seed(0)
    net = build_model("alexnet", spec, {"width": 12})
    assert exchange_points(net) == ["conv3", "fc1", "fc2", "fc3"]
    assert [c.reads for c in alexnet_columns(net)][:5] == ["image", "own", "both", "own", "own"]
    # Column c of conv2 computed alone, from its own half of conv1's output, is exact.
    h = layer(net, "conv1")(sample_input(spec))  # (2, 12, 16, 16)
    conv = layer(net, "conv2.0")
    full = conv(h)  # (2, 32, 16, 16)
    for c in (0, 1):
        rows, cols = column_slice(conv.out_channels, c), column_slice(conv.in_channels, c)
        part = F.conv2d(h[:, cols], conv.weight[rows], conv.bias[rows], padding=2)
        torch.testing.assert_close(part, full[:, rows])
    single = build_model("alexnet", spec, {"width": 12, "groups": 1})
    assert exchange_points(single) == ["conv2", "conv3", "conv4", "conv5", "fc1", "fc2", "fc3"]


def test_gpt_heads_split_across_ranks_like_tensor_parallelism():
    spec = dataset_spec("chars", CHARS)
    torch.manual_seed(0)
    attn = layer(build_model("gpt-mini", spec, {"d_model": 32, "n_head": 4}), "block1.attn")
    x = torch.randn(2, 16, 32)  # (B, T, D)
    total = torch.zeros(2, 16, 32)
    for rank in (0, 1):  # two of the four heads per rank: rows of q/k/v, columns of proj
        rows = slice(16 * rank, 16 * rank + 16)
        shard = type(attn)(32, 4)  # head_dim 8; heads are derived from q.out_features
        with torch.no_grad():
            for name in ("q", "k", "v"):
                full = getattr(attn, name)
                lin = nn.Linear(32, 16)
                lin.weight.copy_(full.weight[rows])
                lin.bias.copy_(full.bias[rows])
                setattr(shard, name, lin)
            shard.proj = nn.Linear(16, 32)
            shard.proj.weight.copy_(attn.proj.weight[:, rows])
            shard.proj.bias.copy_(attn.proj.bias / 2)  # the sum must add the bias once
        total += shard(x)
    torch.testing.assert_close(total, attn(x))


@pytest.mark.parametrize("model", ["gpt-mini", "seq2seq-lstm"])
def test_lm_models_never_see_the_tokens_they_predict(model):
    spec = dataset_spec("chars", CHARS)
    torch.manual_seed(0)
    net = build_model(model, spec, {"d_model": 32} if model == "gpt-mini" else {"hidden": 16})
    x = sample_input(spec)
    out = net(x)
    start = x.shape[1] - out.shape[1]  # output position t predicts x[start + t + 1]
    for t in (0, out.shape[1] // 2, out.shape[1] - 1):
        changed = x.clone()
        changed[:, start + t + 1 :] = (changed[:, start + t + 1 :] + 1) % spec.num_classes
        torch.testing.assert_close(net(changed)[:, : t + 1], out[:, : t + 1])


def test_seq2seq_odd_length_predicts_the_last_half():
    spec = DataSpec("odd", "lm", (7,), "long", 11, 1, 1)
    out = build_model("seq2seq-lstm", spec, {"hidden": 8})(sample_input(spec))
    assert out.shape == (2, 3, 11)


@pytest.fixture
def one_thread():
    """Tiny models train fastest on one thread; on a shared 2-core box more threads thrash."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # long (seconds of training/sampling), not multi-process
def test_cnn_reaches_95_percent_on_digits_in_300_steps(one_thread):
    data = load_dataset("digits")
    torch.manual_seed(0)
    net = build_model("cnn", data.spec)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        idx = torch.randint(data.spec.train_size, (64,), generator=gen)
        loss = task_loss(data.spec, net(data.x_train[idx]), data.y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        correct, counted = task_correct(data.spec, net(data.x_test), data.y_test)
    assert correct / counted >= 0.95


# ------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("model", "options", "data", "dopts", "words"),
    [
        ("resnet", None, "digits", {}, ["Unknown model 'resnet'", "cnn", "pkg.module:factory"]),
        ("vgg", None, "digits", {}, ["Did you mean 'vgg16'"]),
        ("mlp", {"hiden": 8}, "digits", {}, ["option 'hiden'", "Did you mean 'hidden'"]),
        ("mlp", {"depth": -1}, "digits", {}, ["depth=-1", "greater than or equal to 0"]),
        ("mlp", None, "chars", CHARS, ["classify datasets, not lm", "fit: digits, sparse-bow"]),
        ("cnn", None, "sparse-bow", BOW, ["image inputs", "fit: digits, synthetic-images"]),
        ("gpt-mini", None, "digits", {}, ["supports lm datasets", "fit: chars"]),
        ("gpt-mini", {"n_head": 3}, "chars", CHARS, ["d_model=64", "multiple of n_head=3"]),
        ("gpt-mini", {"seq_len": 8}, "chars", CHARS, ["seq_len=8 is shorter", "(16)"]),
        ("vgg16", {"width": 4}, "digits", {}, ["at least 32×32", "got 8×8", "adapt_pool=true"]),
        ("vgg16", {"image": 64}, "synthetic-images", IMAGES, ["image=64", "32×32"]),
        ("alexnet", {"width": 10}, "digits", {}, ["width=10", "multiple of 6"]),
        ("alexnet", {"stem": "imagenet"}, "digits", {}, ["ImageNet stem", "stem=small"]),
        ("seq2seq-lstm", {"hidden": 7}, "chars", CHARS, ["hidden=7", "multiple of 2"]),
        ("gpt-mini", {"vocab": 100}, "chars", CHARS, ["vocab=100 is smaller", "(256)"]),
        ("sparse-bow", {"vocab": 10}, "bow-ids", IDS_DATA, ["vocab=10 is smaller", "300"]),
        ("sparse-bow", None, "digits", {}, ["integer feature ids", "fit: bow-ids"]),

        ("a b:c", None, "digits", {}, ["'package.module:factory'"]),
    ],
)
def test_bad_input_is_a_config_error_that_names_the_fix(model, options, data, dopts, words):
    spec = dataset_spec(data, dopts)
    with pytest.raises(ConfigError) as info:
        validate_model(model, spec, options)
    for word in words:
        assert word in str(info.value)


# ------------------------------------------------------------------------------ user models

USER_MODULE = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)
    def forward(self, x):
        return self.fc(x.flatten(1))

def sequential():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
def module():
    return Net()
def layers(spec):
    return [nn.Flatten(), nn.Linear(64, spec.num_classes)]
def with_default(spec=None):
    assert spec is not None
    return nn.Sequential(nn.Flatten(), nn.Linear(64, spec.num_classes))
def broken():
    raise RuntimeError("out of ideas")
def number():
    return 42
def empty():
    return []
def mixed():
    return [nn.Flatten(), "relu"]
NOT_CALLABLE = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "ptzoo_user_net.py").write_text(textwrap.dedent(USER_MODULE))
    (tmp_path / "ptzoo_broken_import.py").write_text("import not_a_module_anywhere_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "ptzoo_user_net"


@pytest.mark.parametrize(("factory", "children"), [("sequential", 2), ("module", 1), ("layers", 2)])
def test_user_factories_become_sequentials(user_module, factory, children):
    spec = dataset_spec("digits")
    net = load_user_model(f"{user_module}:{factory}", spec)
    assert isinstance(net, nn.Sequential) and len(net) == children
    assert net(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert is_user_model(f"{user_module}:{factory}") and not is_user_model("cnn")
    assert len(resolve_model(f"{user_module}:with_default", spec)) == 2
    assert isinstance(resolve_model("mlp", spec, {"hidden": 4}), nn.Sequential)


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("ptzoo_user_net", ["'package.module:factory'"]),
        ("ptzoo_no_such_module:f", ["Cannot import module", "PYTHONPATH", "current directory"]),
        ("ptzoo_broken_import:f", ["not_a_module_anywhere_xyz", "PYTHONPATH"]),
        ("ptzoo_user_net:nope", ["no attribute 'nope'", "sequential"]),
        ("ptzoo_user_net:NOT_CALLABLE", ["not callable"]),
        ("ptzoo_user_net:broken", ["raised RuntimeError: out of ideas"]),
        ("ptzoo_user_net:number", ["returned a int", "Expected an nn.Module"]),
        ("ptzoo_user_net:empty", ["returned an empty list"]),
        ("ptzoo_user_net:mixed", ["item 1 is a str"]),
    ],
)
def test_user_factory_errors(user_module, target, words):
    with pytest.raises(ConfigError) as info:
        load_user_model(target, dataset_spec("digits"))
    for word in words:
        assert word in str(info.value)
