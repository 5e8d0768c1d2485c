"""Dataset registry: specs, in-memory datasets, validated options.

A dataset is a name, a one-line description, a pydantic ``Options`` model and a ``build`` function
that returns every tensor in memory. Nothing is downloaded and nothing is loaded at import; a
module registers its entry with :func:`register_dataset` when ``polytrain.data`` is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ValidationError

from polytrain.errors import ConfigError, unknown

Task = Literal["classify", "lm"]


@dataclass(frozen=True)
class DataSpec:
    """What a model needs to know about a dataset, without its tensors.

    classify: ``y`` is (N,) int64 class ids. lm: ``y`` is (N, T) int64 next-token ids.
    """

    name: str
    task: Task
    input_shape: tuple[int, ...]  # per sample: (C, H, W) images, (F,) features, (T,) tokens
    input_dtype: Literal["float", "long"]
    num_classes: int  # classes, or vocabulary size for lm
    train_size: int
    test_size: int
    #: integer inputs lie in [0, input_range) when set (e.g. feature ids), for embedding models
    input_range: int | None = None


@dataclass
class Dataset:
    """Every tensor of a dataset, in memory (x float32 or int64, y int64)."""

    spec: DataSpec
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


@dataclass(frozen=True)
class DatasetEntry:
    """One registered dataset.

    ``spec`` returns the DataSpec cheaply (no tensors are built) so that configs and model
    shapes can be validated before any process starts; ``build`` makes the tensors.
    """

    name: str
    description: str  # one line, shown by `polytrain datasets`
    Options: type[BaseModel]
    build: Callable[[Any, int], Dataset]  # (validated options, seed) -> Dataset
    spec: Callable[[Any], DataSpec]  # (validated options) -> DataSpec


DATASETS: dict[str, DatasetEntry] = {}


def register_dataset(entry: DatasetEntry) -> DatasetEntry:
    """Add ``entry`` to :data:`DATASETS` (a second registration under one name is a bug)."""
    if entry.name in DATASETS:
        raise ValueError(f"dataset '{entry.name}' is registered twice")
    DATASETS[entry.name] = entry
    return entry


def dataset_names() -> list[str]:
    return sorted(DATASETS)


def entry_of(name: str) -> DatasetEntry:
    if name not in DATASETS:
        raise unknown("dataset", name, DATASETS, fix="Or give your own as 'pkg.module:factory'.")
    return DATASETS[name]


def _defaults(options_cls: type[BaseModel]) -> str:
    fields = options_cls.model_fields
    if not fields:
        return "none (this one takes no options)"
    return ", ".join(f"{k}={f.default!r}" for k, f in fields.items())


def parse_options(
    kind: str, name: str, options_cls: type[BaseModel], options: Mapping[str, Any] | BaseModel | None
) -> BaseModel:
    """Validate user ``options`` against ``options_cls``; every failure is a ConfigError.

    ``kind`` is "dataset" or "model"; strings such as "16" from the command line are accepted
    for numbers (pydantic's lax mode).
    """
    if options is None:
        return options_cls()
    if isinstance(options, options_cls):
        return options
    if isinstance(options, BaseModel):
        options = options.model_dump()
    if not isinstance(options, Mapping):
        raise ConfigError(
            f"Options of {kind} '{name}' must be a mapping of names to values; "
            f"got {type(options).__name__}. Valid options and defaults: {_defaults(options_cls)}."
        )
    for key in options:
        if not options_cls.model_fields:
            raise ConfigError(
                f"{kind.capitalize()} '{name}' takes no options; got {sorted(map(str, options))}. "
                "Remove them."
            )
        if key not in options_cls.model_fields:
            raise unknown(
                f"{kind} '{name}' option",
                str(key),
                options_cls.model_fields,
                fix=f"Defaults: {_defaults(options_cls)}.",
            )
    try:
        return options_cls.model_validate(dict(options))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(options)"
        raise ConfigError(
            f"Invalid option {loc}={err.get('input')!r} for {kind} '{name}': {err['msg']}. "
            f"Defaults: {_defaults(options_cls)}."
        ) from None


def validate_dataset_options(name: str, options: Mapping[str, Any] | None) -> BaseModel | None:
    """Check a dataset name and its options without building anything (a user dataset,
    ``pkg.mod:factory``, is checked when it is built)."""
    if ":" in name:
        from polytrain.targets import split_target

        split_target(name, "user dataset")
        return None
    entry = entry_of(name)
    return parse_options("dataset", name, entry.Options, options)


def generator(*key: int) -> torch.Generator:
    """A private CPU generator seeded from ``key`` (the global RNG is never touched)."""
    seed = 0
    for k in key:  # a tiny mix so (a, b) and (b, a) differ; stays within 63 bits
        seed = (seed * 1_000_003 + int(k)) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)
