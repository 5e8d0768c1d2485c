"""Tier 1: built-in datasets, their options, and the loss/accuracy helpers (no processes)."""

from __future__ import annotations

import math
import socket

import pytest
import torch

from polytrain.data import (
    DATASETS,
    DataSpec,
    dataset_names,
    dataset_spec,
    load_dataset,
    task_correct,
    task_loss,
    validate_dataset_options,
)
from polytrain.data import chars as chars_module
from polytrain.errors import ConfigError

SMALL = {
    "digits": {},
    "synthetic-images": {"channels": 2, "size": 16, "classes": 4, "train": 256, "test": 64},
    "chars": {"seq_len": 16, "chars": 20_000},
    "sparse-bow": {"features": 300, "classes": 5, "nnz": 6, "train": 512, "test": 128},
    "bow-ids": {"features": 400, "classes": 4, "nnz": 6, "train": 512, "test": 128},
}


@pytest.fixture
def fresh_chars_cache():
    """The chars corpus is cached per process; tests that fake the stdlib must not leak."""
    chars_module.corpus_text.cache_clear()
    chars_module._tokens.cache_clear()
    yield
    chars_module.corpus_text.cache_clear()
    chars_module._tokens.cache_clear()


def test_registry_lists_the_datasets_with_descriptions():
    assert dataset_names() == ["bow-ids", "chars", "digits", "sparse-bow", "synthetic-images"]
    for name, entry in DATASETS.items():
        assert entry.name == name
        assert entry.description and "\n" not in entry.description


@pytest.mark.parametrize("name", sorted(SMALL))
def test_tensors_match_the_spec(name):
    data = load_dataset(name, SMALL[name], seed=3)
    spec = data.spec
    assert spec == dataset_spec(name, SMALL[name])  # the cheap spec is the real one
    assert data.x_train.shape == (spec.train_size, *spec.input_shape)
    assert data.x_test.shape == (spec.test_size, *spec.input_shape)
    want = torch.float32 if spec.input_dtype == "float" else torch.int64
    assert data.x_train.dtype == data.x_test.dtype == want
    assert data.y_train.dtype == data.y_test.dtype == torch.int64
    if spec.task == "classify":
        assert data.y_train.shape == (spec.train_size,)
        assert int(data.y_train.min()) >= 0 and int(data.y_train.max()) < spec.num_classes
    else:
        assert data.y_train.shape == data.x_train.shape
        assert int(data.x_train.max()) < spec.num_classes


@pytest.mark.parametrize("name", sorted(SMALL))
def test_same_seed_same_data(name):
    a, b = load_dataset(name, SMALL[name], seed=7), load_dataset(name, SMALL[name], seed=7)
    for key in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, key), getattr(b, key))


@pytest.mark.parametrize("name", ["synthetic-images", "sparse-bow", "bow-ids"])
def test_generated_data_follows_the_seed_but_the_teacher_is_fixed(name):
    a, b = load_dataset(name, SMALL[name], seed=1), load_dataset(name, SMALL[name], seed=2)
    assert not torch.equal(a.x_train, b.x_train)
    # Classes are balanced-ish: every class has at least a third of its fair share.
    counts = torch.bincount(a.y_train, minlength=a.spec.num_classes)
    assert int(counts.min()) >= a.spec.train_size / a.spec.num_classes / 3


def test_digits_is_fixed_standardised_and_split_1437_360():
    a, b = load_dataset("digits", seed=0), load_dataset("digits", seed=99)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert a.spec == DataSpec("digits", "classify", (1, 8, 8), "float", 10, 1437, 360)
    assert abs(float(a.x_train.mean())) < 1e-5 and abs(float(a.x_train.std()) - 1) < 1e-4
    assert sorted(a.y_test.unique().tolist()) == list(range(10))
    a.x_train.zero_()  # a caller mutating its copy must not change the next load
    assert float(load_dataset("digits").x_train.abs().sum()) > 0


def test_sparse_bow_touches_few_features_per_sample():
    data = load_dataset("sparse-bow", SMALL["sparse-bow"])
    nonzero = (data.x_train != 0).sum(dim=1)
    assert int(nonzero.max()) <= 6 and int(nonzero.min()) >= 1
    assert float(data.x_train.min()) >= 0


def test_bow_ids_are_zipf_ids_in_range_and_a_batch_touches_few_rows():
    data = load_dataset("bow-ids", {"train": 4096, "test": 8})  # the 100k-id default vocabulary
    x = data.x_train
    assert data.spec.input_range == 100_000 and int(x.min()) >= 0 and int(x.max()) < 100_000
    assert int((x < 100).sum()) > int(((x >= 1000) & (x < 1100)).sum())  # frequent ids first
    assert x[:64].unique().numel() < 0.01 * 100_000  # one batch of 64: under 1 % of the rows


def test_chars_comes_from_stdlib_files_without_network(monkeypatch, fresh_chars_cache):
    def no_network(*args, **kwargs):
        raise AssertionError("chars must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    data = load_dataset("chars", SMALL["chars"])
    first = chars_module.stdlib_sources()[0].read_bytes()
    assert bytes(data.x_train[0].tolist()) == first[:16]
    # y is x shifted by one token, also across window boundaries.
    assert torch.equal(data.y_train[:, :-1], data.x_train[:, 1:])
    assert torch.equal(data.y_train[:-1, -1], data.x_train[1:, 0])
    assert data.spec.num_classes == 256
    # Contiguous split: the test windows come from the last 10% of the corpus.
    assert data.spec.train_size == (18_000 - 1) // 16 and data.spec.test_size == (2000 - 1) // 16


def test_chars_vocab_of_seen_characters():
    data = load_dataset("chars", {**SMALL["chars"], "vocab": "chars"})
    alphabet = chars_module.alphabet(chars_module.CharsOptions(**SMALL["chars"], vocab="chars"))
    assert data.spec.num_classes == len(alphabet) < 256
    text = "".join(alphabet[i] for i in data.x_train[0].tolist())
    assert text == chars_module.corpus_text(20_000)[:16]


def test_chars_skips_unreadable_files(monkeypatch, tmp_path, fresh_chars_cache):
    good = tmp_path / "b.py"
    good.write_text("x = 1\n" * 2000)
    monkeypatch.setattr(chars_module, "stdlib_sources", lambda: [tmp_path / "missing.py", good])
    data = load_dataset("chars", {"seq_len": 8, "chars": 5000})
    assert bytes(data.x_train[0].tolist()) == b"x = 1\nx "


def test_chars_refuses_a_corpus_too_small(monkeypatch, tmp_path, fresh_chars_cache):
    tiny = tmp_path / "a.py"
    tiny.write_text("pass\n" * 300)  # 1500 characters: 150 test tokens
    monkeypatch.setattr(chars_module, "stdlib_sources", lambda: [tiny])
    with pytest.raises(ConfigError, match="Lower seq_len"):
        load_dataset("chars", {"seq_len": 512, "chars": 1500})


def test_validation_is_cheap_and_coerces_strings():
    opts = validate_dataset_options("synthetic-images", {"size": "16"})
    assert opts.size == 16 and opts.channels == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "options", "words"),
    [
        ("digitz", None, ["Unknown dataset 'digitz'", "Did you mean 'digits'", "sparse-bow"]),
        ("chars", {"seqlen": 8}, ["option 'seqlen'", "Did you mean 'seq_len'", "vocab"]),
        ("synthetic-images", {"size": 0}, ["size=0", "greater than or equal to 2", "size=32"]),
        ("sparse-bow", {"nnz": "many"}, ["nnz='many'", "integer"]),
        ("chars", {"vocab": "words"}, ["vocab='words'", "bytes", "chars"]),
        ("digits", {"size": 8}, ["Dataset 'digits' takes no options", "'size'"]),
        ("digits", [1, 2], ["must be a mapping", "list"]),
    ],
)
def test_bad_input_is_a_config_error_that_names_the_fix(name, options, words):
    with pytest.raises(ConfigError) as info:
        load_dataset(name, options)
    for word in words:
        assert word in str(info.value)


# --------------------------------------------------------------------- loss and accuracy helpers

CLASSIFY = DataSpec("toy", "classify", (2,), "float", 3, 4, 4)
LM = DataSpec("toy-lm", "lm", (4,), "long", 3, 4, 4)


def test_classify_loss_and_accuracy_by_hand():
    out = torch.tensor([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0]])
    y = torch.tensor([2, 1])
    expected = (math.log(3) + (10 + math.log(1 + 2 * math.exp(-10)))) / 2
    assert task_loss(CLASSIFY, out, y).item() == pytest.approx(expected, rel=1e-5)
    assert task_correct(CLASSIFY, out, y) == (0, 2)
    assert task_correct(CLASSIFY, out, torch.tensor([2, 0])) == (1, 2)  # argmax ties -> first


def test_lm_scores_only_the_last_targets():
    y = torch.tensor([[2, 2, 0, 1]])  # (B=1, T=4)
    out = torch.full((1, 2, 3), -10.0)  # predicts only the last L=2 positions
    out[0, 0, 0] = out[0, 1, 2] = 10.0  # right at position 2 (target 0), wrong at 3 (target 1)
    assert task_correct(LM, out, y) == (1, 2)
    wrong = 20.0 + math.log(1 + math.exp(-20) * 2)  # -log softmax of a -10 entry vs one +10
    assert task_loss(LM, out, y).item() == pytest.approx((0 + wrong) / 2, abs=1e-4)
    full = torch.zeros(1, 4, 3)
    assert task_loss(LM, full, y).item() == pytest.approx(math.log(3), rel=1e-6)
    assert task_correct(LM, full, y) == (1, 4)  # argmax is 0 everywhere; one target is 0


def test_helpers_reject_outputs_of_the_wrong_shape():
    with pytest.raises(ConfigError, match="3 classes"):
        task_loss(CLASSIFY, torch.zeros(2, 4), torch.tensor([0, 1]))
    with pytest.raises(ConfigError, match="L <= 4"):
        task_loss(LM, torch.zeros(1, 5, 3), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ConfigError, match="batch, classes"):
        task_correct(CLASSIFY, torch.zeros(2, 5, 3), torch.tensor([0, 1]))
