"""Tier 1: user factories called by parameter name, outputs and losses, user datasets and the
launcher's checks (no processes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from polytrain.config import load_config
from polytrain.data import dataset_spec, load_dataset
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.models import build_model
from polytrain.models.factory import factory_kwargs
from polytrain.runtime.batches import GlobalBatches
from polytrain.runtime.job import Job

Z = "userzoo.factories"
DIGITS = dataset_spec("digits")


def test_common_factory_gets_num_classes_and_typed_options():
    net = build_model(f"{Z}:make", DIGITS, {"width": "32"})  # a string from --set, typed as int
    assert net[1].out_features == 32 and net[3].out_features == 10


@pytest.mark.parametrize(("factory", "options", "expect"), [
    ("by_shape", {}, {"in_channels": 1, "image_size": 8, "n_classes": 10}),
    ("by_features", {"depth": "2"}, {"in_features": 64, "out_features": 10, "depth": 2}),
    ("with_shape", {}, {"input_shape": (1, 8, 8), "num_classes": 10}),
])
def test_signature_styles(factory, options, expect):
    import userzoo.factories as f

    assert factory_kwargs(getattr(f, factory), DIGITS, options, factory) == expect
    assert build_model(f"{Z}:{factory}", DIGITS, options)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_spec_by_annotation_and_lm_names():
    import userzoo.factories as f

    kw = factory_kwargs(f.annotated, DIGITS, {"scale": "2"}, "annotated")
    assert kw == {"data": DIGITS, "scale": 2.0}
    chars = dataset_spec("chars", {"seq_len": 16})
    assert factory_kwargs(f.lm, chars, {}, "lm") == {"vocab_size": chars.num_classes,
                                                     "block_size": 16}


def test_config_dataclass_built_from_fields():
    net = build_model(f"{Z}:ConfigNet", DIGITS, {"hidden": 5})
    inner = net[0]
    assert inner.config.num_classes == 10 and inner.config.hidden == 5  # from the data, --set
    from userzoo.nanogpt import GPT

    chars = dataset_spec("chars", {"seq_len": 16})
    gpt = build_model("userzoo.nanogpt:GPT", chars, {"n_layer": 1, "n_head": 2, "n_embd": 8})[0]
    assert isinstance(gpt, GPT)
    assert (gpt.config.vocab_size, gpt.config.block_size, gpt.config.n_layer) == (
        chars.num_classes, 16, 1)


@pytest.mark.parametrize(("factory", "options", "words"), [
    ("make", {"depth": 3}, ["Unknown model option 'depth'", "num_classes", "width"]),
    ("ConfigNet", {"hiden": 3}, ["'hiden'", "Did you mean 'hidden'"]),
    ("needs_secret", {}, ["requires argument 'secret'", "--set model.secret=VALUE"]),
    ("make", {"width": "wide"}, ["width='wide'", "int"]),
])
def test_factory_errors(factory, options, words):
    with pytest.raises(ConfigError) as info:
        build_model(f"{Z}:{factory}", DIGITS, options)
    assert "\n" not in str(info.value)
    for w in words:
        assert w in str(info.value)


def _job(**kw):
    cfg = load_config(None, {"procs": 1, "strategy": "single", **kw})
    return cfg, Job.from_config(cfg)


def test_tuple_dict_and_user_losses():
    from userzoo.factories import smooth_loss

    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    _, job = _job(model=f"{Z}:DictNet")
    model = job.build_model()
    assert job.takes_targets
    out = model(x)
    torch.testing.assert_close(job.forward_loss(model, x, y),
                               nn.functional.cross_entropy(out["logits"], y))
    _, job = _job(model=f"{Z}:make", loss=f"{Z}:smooth_loss")
    model = job.build_model()
    torch.testing.assert_close(job.forward_loss(model, x, y), smooth_loss(model(x), y))
    chars = {"seq_len": 8, "chars": 2000}
    _, job = _job(model="userzoo.nanogpt:GPT", dataset="chars", data_options=chars,
                  model_options={"n_layer": 1, "n_head": 2, "n_embd": 8})
    gpt = job.build_model()
    xb, yb = job.dataset.x_train[:3], job.dataset.y_train[:3]
    _logits, loss = gpt(xb, yb)
    torch.testing.assert_close(job.forward_loss(gpt, xb, yb), loss)
    assert job.evaluate(gpt)["loss"] > 0


@pytest.mark.parametrize(("kw", "words"), [
    ({"model": f"{Z}:wrong_classes"}, ["7 scores per prediction", "10 classes"]),
    ({"model": f"{Z}:StringNet"}, ["returned a str", "expected a tensor of outputs"]),
    ({"model": f"{Z}:make", "loss": f"{Z}:vector_loss"}, ["not a scalar tensor"]),
    ({"model": "mlp", "loss": f"{Z}:nope"}, ["no attribute 'nope'"]),
])
def test_output_contract_checked_before_launch(kw, words):
    cfg = load_config(None, {"procs": 1, "strategy": "single", **kw})
    with pytest.raises(ConfigError) as info:
        prepare(cfg)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize(("factory", "task", "shape", "classes", "sizes"), [
    ("blobs", "classify", (8,), 4, (96, 32)),
    ("blob_tensors", "classify", (8,), 4, (64, 64)),
    ("tokens", "lm", (16,), 11, (32, 4)),
])
def test_user_datasets_infer_task_and_shapes(factory, task, shape, classes, sizes):
    spec = dataset_spec(f"{Z}:{factory}")
    assert (spec.task, spec.input_shape, spec.num_classes) == (task, shape, classes)
    assert (spec.train_size, spec.test_size) == sizes


def test_user_dataset_options_seed_and_errors():
    a = load_dataset(f"{Z}:blobs", {"n": 40}, seed=1)
    b = load_dataset(f"{Z}:blobs", {"n": 40}, seed=2)
    assert a.x_train.shape == (40, 8) and not torch.equal(a.x_train, b.x_train)
    with pytest.raises(ConfigError, match=r"Unknown data option 'm'.*seed, n"):
        load_dataset(f"{Z}:blobs", {"m": 3})
    with pytest.raises(ConfigError, match=r"Unknown dataset 'nope'.*pkg.module:factory"):
        dataset_spec("nope")


def test_user_dataset_sharded_without_repeats_per_epoch():
    """DistributedSampler semantics: over one epoch the ranks' parts cover every sample once."""
    data = load_dataset(f"{Z}:blobs", {"n": 48})
    batches = GlobalBatches(torch.arange(48), data.y_train, batch_size=8, seed=3)
    for parts in (2, 4):
        seen = torch.cat([batches.shard(s, p, parts)[0] for s in range(1, 7) for p in range(parts)])
        assert sorted(seen.tolist()) == list(range(48))


def test_user_dataset_output_vs_labels_checked_before_launch():
    cfg = load_config(None, {"procs": 1, "strategy": "single", "dataset": f"{Z}:blobs",
                             "model": f"{Z}:blob_mlp"})
    assert prepare(cfg).spec.num_classes == 4
    bad = cfg.model_copy(update={"model": f"{Z}:make"})  # 64 inputs, 10 classes: wrong on blobs
    with pytest.raises(ConfigError, match="failed on a sample batch x \\(2, 8\\)"):
        prepare(bad)


def test_torchvision_by_name():
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # the registry's wheels do not load against this CPU torch build
        with pytest.raises(ConfigError, match="needs torchvision, which does not import here"):
            build_model("torchvision:resnet18", dataset_spec("synthetic-images", {"size": 32}))
        pytest.skip(f"torchvision does not import here ({type(exc).__name__}: {exc})")
    spec = dataset_spec("synthetic-images", {"size": 32, "classes": 7})
    net = build_model("torchvision:resnet18", spec)
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 7)
    with pytest.raises(ConfigError, match="Unknown torchvision model"):
        build_model("torchvision:resnet1800", spec)
