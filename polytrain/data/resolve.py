"""A dataset by name: a built-in entry (:mod:`polytrain.data.base`'s registry) or a user's
``pkg.module:factory`` (:mod:`polytrain.data.user`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polytrain.data.base import Dataset, DataSpec, entry_of, parse_options
from polytrain.data.user import load_user_dataset


def dataset_spec(name: str, options: Mapping[str, Any] | None = None) -> DataSpec:
    """The DataSpec of ``name`` with ``options``, without building the tensors (a user
    dataset is built, once per process, to read its spec from a sample)."""
    if ":" in name:
        return load_user_dataset(name, options).spec
    entry = entry_of(name)
    return entry.spec(parse_options("dataset", name, entry.Options, options))


def load_dataset(name: str, options: Mapping[str, Any] | None = None, seed: int = 0) -> Dataset:
    """Build dataset ``name`` in memory; the same (name, options, seed) gives the same tensors."""
    if ":" in name:
        return load_user_dataset(name, options, seed)
    entry = entry_of(name)
    opts = parse_options("dataset", name, entry.Options, options)
    return entry.build(opts, seed)
