"""Hugging Face transformers as a model source: ``--model hf:TYPE`` or ``--model hf:DIR``.

``hf:gpt2``, ``hf:bert``, ``hf:llama`` ... (any ``model_type`` transformers knows) build the model
from a fresh config with random initialisation — never a download. ``--set model.KEY=VALUE`` sets
config fields (``n_layer``, ``hidden_size``, ``num_attention_heads``, dropouts ...); a key the
config does not have is refused with the nearest names. ``hf:path/to/dir`` reads a local
directory holding ``config.json`` (and its weights, when present) with ``local_files_only``.

The head follows the dataset's task: a language-modelling dataset (``chars``) gets
``AutoModelForCausalLM`` with the vocabulary of the data; a classification dataset of token ids
(``bow-ids``) gets ``AutoModelForSequenceClassification`` with ``num_labels`` = its classes. The
vocabulary and the position table are sized from the data unless options set them; the key/value
cache is off (training needs none). How the model is then called and scored — ``input_ids`` in,
the task's loss on ``.logits``, never ``labels`` — is :mod:`polytrain.models.call`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from polytrain.data import DataSpec
from polytrain.errors import ConfigError, did_you_mean

PREFIX = "hf:"
#: config fields that size the position table, by model family
_POSITIONS = ("n_positions", "max_position_embeddings", "n_ctx")


def _transformers() -> Any:
    try:
        import transformers
    except Exception as exc:
        raise ConfigError(
            f"--model hf:... needs the transformers package, which does not import here "
            f"({type(exc).__name__}: {exc}). Install it: pip install transformers.") from exc
    return transformers


def _config(tf: Any, name: str, options: Mapping[str, Any]) -> tuple[Any, Path | None]:
    """The config for ``name`` (a model type or a local directory) with ``options`` applied."""
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        config = tf.AutoConfig.from_pretrained(str(path), local_files_only=True)
        local: Path | None = path
    else:
        types = sorted(tf.CONFIG_MAPPING.keys())
        if name not in types:
            hint = did_you_mean(name, types)
            raise ConfigError(
                f"--model hf:{name}: not a transformers model type nor a local directory with "
                f"config.json (polytrain never downloads from a hub). {hint} Use a model type "
                "(hf:gpt2, hf:bert, hf:llama, ...) with --set model.KEY=VALUE, or a directory.")
        config = tf.CONFIG_MAPPING[name]()
        local = None
    known = set(config.to_dict()) | set(getattr(config, "attribute_map", {}))
    for key, value in options.items():
        if key not in known:
            raise ConfigError(f"Unknown model option '{key}' for hf:{name} ({type(config).__name__}). "
                              + did_you_mean(key, sorted(known)))
        setattr(config, key, value)
    return config, local


def _fit_to_data(config: Any, spec: DataSpec, options: Mapping[str, Any]) -> None:
    """Vocabulary, positions and labels from the data, where the options leave them open."""
    if spec.input_dtype != "long":
        raise ConfigError(
            f"hf models take token ids; dataset '{spec.name}' gives {spec.input_dtype} inputs "
            f"{spec.input_shape}. Use --dataset chars (language modelling) or bow-ids "
            "(classification of token ids), or your own dataset of token ids.")
    vocab = spec.num_classes if spec.task == "lm" else (spec.input_range or spec.num_classes)
    if "vocab_size" not in options:
        config.vocab_size = vocab
    elif config.vocab_size < vocab:
        raise ConfigError(f"hf model vocab_size={config.vocab_size} is smaller than the data's "
                          f"{vocab} token ids (dataset '{spec.name}'). Raise it or leave it unset.")
    seq = spec.input_shape[0]
    for key in _POSITIONS:
        if hasattr(config, key) and key not in options and getattr(config, key) < seq:
            setattr(config, key, seq)
    if spec.task == "classify":
        config.num_labels = spec.num_classes
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = 0
    config.use_cache = False


def build_hf(name: str, spec: DataSpec, options: Mapping[str, Any] | None = None) -> nn.Module:
    """The Hugging Face model ``hf:NAME`` for ``spec`` (see the module doc)."""
    tf = _transformers()
    options = dict(options or {})
    config, local = _config(tf, name, options)
    _fit_to_data(config, spec, options)
    auto = tf.AutoModelForCausalLM if spec.task == "lm" else tf.AutoModelForSequenceClassification
    try:
        weights = local is not None and (any(local.glob("*.safetensors")) or any(local.glob("*.bin")))
        if local is not None and weights:
            model = auto.from_pretrained(str(local), config=config, local_files_only=True)
        else:
            model = auto.from_config(config)
    except ValueError as exc:  # a type with no such head (e.g. a vision model for text)
        raise ConfigError(f"--model hf:{name}: transformers has no {auto.__name__} for "
                          f"{type(config).__name__} ({exc}). Pick a model type with that head.") from exc
    return model  # type: ignore[no-any-return]
