"""The model-call contract (polytrain/models/call.py) on the real things, in one process: nanoGPT's
own model.py and Hugging Face transformers built from tiny configs. Each oracle compares with the
library's own loss, so a second shift or a last-token objective cannot pass."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from polytrain.config import load_config
from polytrain.data import dataset_spec
from polytrain.data.user import hf_sample
from polytrain.errors import ConfigError
from polytrain.models.call import ModelCall
from polytrain.models.registry import build_model
from polytrain.runtime.job import Job

CHARS = {"dataset": "chars", "data_options": {"seq_len": 16, "chars": 2000}}
GPT2 = {"n_layer": 2, "n_head": 2, "n_embd": 16, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attn_pdrop": 0.0}


def _job(model: str, options: dict[str, Any], **extra: Any) -> tuple[Job, torch.nn.Module]:
    cfg = load_config(overrides={"model": model, "model_options": options, **CHARS, **extra})
    job = Job.from_config(cfg)
    return job, job.build_model()


def _batch(job: Job, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return job.dataset.x_train[:n], job.dataset.y_train[:n]


def test_nanogpt_is_called_with_targets_and_trains_every_position() -> None:
    job, model = _job("tests.nanogpt.model:GPT", {"n_layer": 2, "n_head": 2, "n_embd": 16,
                                                   "dropout": 0.0})
    assert job.call == ModelCall("targets", "targets")
    x, y = _batch(job)
    logits, own = model[0](x, targets=y)  # nanoGPT's own loss over every position
    assert logits.shape[1] == x.shape[1]
    assert job.forward_loss(model, x, y).item() == pytest.approx(own.item(), rel=1e-6)
    last_only, _ = model[0](x)  # what a call without targets trains on: the last position
    assert last_only.shape[1] == 1
    assert "targets" in job.model_call


def test_hf_causal_lm_learns_the_next_token_not_the_one_after() -> None:
    job, model = _job("hf:gpt2", GPT2)
    assert job.call == ModelCall("hf", "input_ids")
    x, y = _batch(job)
    ours = job.forward_loss(model, x, y)
    logits = model[0](input_ids=x).logits
    assert ours.item() == pytest.approx(F.cross_entropy(logits.flatten(0, 1), y.flatten()).item())
    # Hugging Face's own loss with labels = the unshifted tokens x ++ y[-1]: the same objective
    full = torch.cat([x, y[:, -1:]], dim=1)
    hf = model[0](input_ids=full, labels=full)
    ref = F.cross_entropy(model[0](input_ids=full).logits[:, :-1].flatten(0, 1),
                          full[:, 1:].flatten())
    assert hf.loss.item() == pytest.approx(ref.item(), rel=1e-5)
    # the double shift the contract prevents: labels=y would score against token t+2
    shifted = model[0](input_ids=x, labels=y).loss
    assert shifted.item() != pytest.approx(ours.item(), rel=1e-3)


def test_hf_style_dict_samples_give_hugging_faces_own_loss() -> None:
    job, model = _job("hf:gpt2", GPT2)
    ids = job.dataset.x_train[:2]
    pairs = [hf_sample({"input_ids": r, "labels": r, "attention_mask": torch.ones_like(r)}, "s")
             for r in ids]
    x = torch.stack([p[0] for p in pairs])
    y = torch.stack([p[1] for p in pairs])
    hf = model[0](input_ids=ids, labels=ids).loss
    assert job.forward_loss(model, x, y).item() == pytest.approx(hf.item(), rel=1e-5)
    with pytest.raises(ConfigError, match="padding"):
        hf_sample({"input_ids": ids[0], "labels": ids[0], "attention_mask": torch.zeros(16)}, "s")


@pytest.mark.parametrize(("model", "options", "dataset", "data"), [
    ("hf:llama", {"num_hidden_layers": 1, "hidden_size": 16, "intermediate_size": 32,
                  "num_attention_heads": 2, "num_key_value_heads": 2}, "chars", {"seq_len": 16}),
    ("hf:bert", {"num_hidden_layers": 1, "hidden_size": 16, "intermediate_size": 32,
                 "num_attention_heads": 2}, "bow-ids", {"features": 200, "nnz": 12, "classes": 4}),
])
def test_hf_models_built_from_configs_fit_the_data(model: str, options: dict[str, Any],
                                                   dataset: str, data: dict[str, Any]) -> None:
    spec = dataset_spec(dataset, data)
    built = build_model(model, spec, options)[0]
    out = built(input_ids=torch.zeros(2, spec.input_shape[0], dtype=torch.long)).logits
    assert out.shape[-1] == spec.num_classes
    assert built.config.use_cache is False


@pytest.mark.parametrize(("model", "options", "words"), [
    ("hf:gpt2-medium", {}, "never downloads"),
    ("hf:gpt", {}, "Did you mean"),
    ("hf:gpt2", {"n_layers": 2}, "Unknown model option 'n_layers'"),
    ("hf:gpt2", {"vocab_size": 10}, "smaller than the data"),
])
def test_hf_bad_input_is_one_line(model: str, options: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        build_model(model, dataset_spec("chars", {"seq_len": 16}), options)


def test_split_names_that_do_not_exist_are_refused_with_the_paths() -> None:
    with pytest.raises(ConfigError, match=r"split path 'transformer.h.9' names no submodule.*"
                                          r"transformer.h.1"):
        build_model("hf:gpt2", dataset_spec("chars", {"seq_len": 16}),
                    {**GPT2, "split": "transformer.h.9"})
