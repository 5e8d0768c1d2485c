"""Model registry: validated options, task/shape checks, construction, parameter counts.

Every zoo model is an ``nn.Sequential`` whose children are its ordered layers, and every child
maps ONE tensor to ONE tensor, so pipeline and layer-wise strategies can cut between any two
children and send a single tensor across.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from polytrain.data import DATASETS, DataSpec, dataset_spec, parse_options
from polytrain.errors import ConfigError, unknown


@dataclass(frozen=True)
class ModelEntry:
    """One zoo model.

    ``check(spec, options)`` returns why the model cannot run on ``spec`` (beyond the task, which
    the registry checks), or None when it can.
    """

    name: str
    description: str  # one line, for `polytrain models`
    Options: type[BaseModel]
    tasks: tuple[str, ...]  # DataSpec.task values it supports
    factory: Callable[[DataSpec, Any], nn.Sequential]  # (spec, validated options) -> model
    default_dataset: str
    check: Callable[[DataSpec, Any], str | None] | None = None


MODELS: dict[str, ModelEntry] = {}


def register_model(entry: ModelEntry) -> ModelEntry:
    if entry.name in MODELS:
        raise ValueError(f"model '{entry.name}' is registered twice")
    MODELS[entry.name] = entry
    return entry


def model_names() -> list[str]:
    return sorted(MODELS)


class UserModelOptions(BaseModel):
    """A user factory's keyword arguments (``--set model.KEY=VALUE``), checked when it is called
    against the factory's own signature (see :mod:`polytrain.models.factory`)."""

    model_config = ConfigDict(extra="allow", frozen=True)


def is_user_model(name: str) -> bool:
    """True for ``pkg.mod:factory`` targets (a zoo name never contains ':')."""
    return ":" in name


def _problem(entry: ModelEntry, spec: DataSpec, opts: BaseModel) -> str | None:
    if spec.task not in entry.tasks:
        return f"it supports {'/'.join(entry.tasks)} datasets, not {spec.task} ones"
    return entry.check(spec, opts) if entry.check else None


def _fitting_datasets(entry: ModelEntry, opts: BaseModel) -> list[str]:
    """Datasets (with default options) this model runs on, for error messages."""
    fits = []
    for name in sorted(DATASETS):
        try:
            if _problem(entry, dataset_spec(name), opts) is None:
                fits.append(name)
        except ConfigError:  # e.g. options that only make sense for another dataset
            continue
    return fits


def validate_model(name: str, spec: DataSpec, options: Mapping[str, Any] | BaseModel | None) -> BaseModel:
    """Check a model name, its options and its fit to ``spec`` without building it.

    A user target (``pkg.mod:factory``) is only checked for syntax here (importing it may have
    side effects); its options are checked against its signature when it is built.
    """
    if is_user_model(name):
        from polytrain.models.user import split_target

        if not name.startswith("hf:"):  # hf:TYPE or hf:DIRECTORY, checked when built
            split_target(name)
        if isinstance(options, BaseModel):
            options = options.model_dump()
        return UserModelOptions(**dict(options or {}))
    if name not in MODELS:
        raise unknown("model", name, MODELS, fix="Or give your own as 'pkg.module:factory'.")
    entry = MODELS[name]
    opts = parse_options("model", name, entry.Options, options)
    problem = _problem(entry, spec, opts)
    if problem is not None:
        fits = ", ".join(_fitting_datasets(entry, opts)) or "none with these options"
        raise ConfigError(
            f"Model '{name}' cannot run on dataset '{spec.name}' (inputs "
            f"{spec.input_shape} {spec.input_dtype}, task {spec.task}): {problem}. "
            f"Datasets that fit: {fits}."
        )
    return opts


def build_model(
    name: str, spec: DataSpec, options: Mapping[str, Any] | BaseModel | None = None
) -> nn.Sequential:
    """Build zoo model ``name`` for ``spec``; initialisation follows ``torch.manual_seed``.

    The model option ``split`` (``--set split=PATHS|auto``) cuts a user's module into traced
    stage segments (:mod:`polytrain.models.trace`)."""
    if isinstance(options, BaseModel):
        options = options.model_dump()
    options = dict(options or {})
    split = options.pop("split", None)
    opts = validate_model(name, spec, options)
    if not is_user_model(name):
        if split is not None:
            raise ConfigError(f"split={split!r} applies to your own modules; zoo model '{name}' "
                              "is already a list of layers: use --set partition=... instead.")
        return MODELS[name].factory(spec, opts)
    from polytrain.models.user import UserModule, load_user_model

    model = load_user_model(name, spec, opts.model_dump())
    if split is None:
        return model
    if not isinstance(model, UserModule):
        raise ConfigError(f"split={split!r}: '{name}' already returns its layers (an "
                          "nn.Sequential or a list); use --set partition=... to place them.")
    from polytrain.models.call import is_hf_model
    from polytrain.models.split import split_model
    from polytrain.models.trace_export import example_batch

    if is_hf_model(model[0]) and hasattr(model[0], "set_attn_implementation"):
        # eager attention applies its dropout as a module, which a cut segment switches off in
        # eval mode; sdpa takes dropout_p from `self.training` at trace time and would keep it
        model[0].set_attn_implementation("eager")  # type: ignore[operator]
    return split_model(model[0], str(split), example_batch(spec))


def resolve_model(
    name: str, spec: DataSpec, options: Mapping[str, Any] | BaseModel | None = None
) -> nn.Sequential:
    """A zoo model by name, or a user model from ``pkg.mod:factory``."""
    return build_model(name, spec, options)


def count_parameters(model: nn.Module) -> int:
    """Number of parameter elements (a shared parameter counts once)."""
    return sum(p.numel() for p in model.parameters())


def parameter_count(name: str, spec: DataSpec, options: Mapping[str, Any] | BaseModel | None = None) -> int:
    """Parameter count of a zoo model without allocating it (built on the meta device)."""
    opts = validate_model(name, spec, options)
    with torch.device("meta"):
        return count_parameters(MODELS[name].factory(spec, opts))


def describe_models(spec_for: Callable[[str], DataSpec] | None = None) -> list[dict[str, Any]]:
    """Rows for `polytrain models`: name, description, tasks, default dataset, parameters.

    ``spec_for(dataset_name)`` gives the spec to count parameters on (default: the dataset's
    default options). Counting uses the meta device, so even full-width VGG-16 costs nothing.
    """
    spec_for = spec_for or dataset_spec
    rows = []
    for name in model_names():
        entry = MODELS[name]
        spec = spec_for(entry.default_dataset)
        rows.append(
            {
                "name": name,
                "description": entry.description,
                "tasks": ", ".join(entry.tasks),
                "default_dataset": entry.default_dataset,
                "parameters": parameter_count(name, spec),
            }
        )
    return rows
