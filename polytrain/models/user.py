"""User models: ``--model pkg.module:factory``, ``--model torchvision:NAME`` and ``--model hf:TYPE``
(Hugging Face transformers from a config, :mod:`polytrain.models.hf`).

The factory is called by parameter name (see :mod:`polytrain.models.factory`) and returns an
``nn.Sequential`` (its children are the ordered layers), a list/tuple of modules (the layers), or
any other ``nn.Module``. The last is held as a one-child :class:`UserModule`; pipeline and
model-parallel strategies cut it into stages by tracing (:mod:`polytrain.models.trace`).

How the module is called and scored — ``forward(x)``, nanoGPT's ``forward(idx, targets)``, a
Hugging Face model's ``forward(input_ids=...)`` — is the model-call contract of
:mod:`polytrain.models.call`; what it may return is :mod:`polytrain.models.outputs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from polytrain.data import DataSpec
from polytrain.errors import ConfigError
from polytrain.models.call import ModelCall, is_hf_model, targets_keyword
from polytrain.models.factory import factory_kwargs
from polytrain.targets import load_callable, split_target

__all__ = ["UserModule", "as_sequential", "load_user_model", "split_target", "targets_keyword"]

_EXPECTED = "an nn.Module (ideally an nn.Sequential of its layers) or a list/tuple of nn.Modules"


class UserModule(nn.Sequential):
    """One user module as a one-layer Sequential; its forward calls the module by the model-call
    contract (:mod:`polytrain.models.call`): ``forward(x, targets)`` hands the targets on to a
    module whose forward takes them, and feeds a Hugging Face model ``input_ids``. Its
    ``state_dict`` keys carry a ``0.`` prefix; :func:`polytrain.models.export.user_state_dict`
    gives the module's own names."""

    def forward(self, x: Any, targets: torch.Tensor | None = None) -> Any:  # type: ignore[override]
        inner = self[0]
        return self.call(inner, x, targets)

    @property
    def call(self) -> ModelCall:
        cached = self.__dict__.get("_call")
        if cached is None:
            cached = self.__dict__["_call"] = ModelCall.of(self[0])
        return cached

    @property
    def user_module(self) -> nn.Module:
        return self[0]

    @property
    def takes_targets(self) -> bool:
        return self.call.kind == "targets"


def as_sequential(result: object, target: str) -> nn.Sequential:
    """Turn a factory's return value into the ordered-layers form strategies expect."""
    if isinstance(result, nn.Sequential):
        return result
    if isinstance(result, nn.Module):
        if is_hf_model(result) and hasattr(result, "config"):
            result.config.use_cache = False  # type: ignore[union-attr]  # training needs no key/value cache; export cannot trace one
        return UserModule(result)
    if isinstance(result, (list, tuple)) and result:
        for i, item in enumerate(result):
            if not isinstance(item, nn.Module):
                raise ConfigError(
                    f"User model '{target}' returned a {type(result).__name__} whose item {i} is "
                    f"a {type(item).__name__}, not an nn.Module. Expected {_EXPECTED}."
                )
        return nn.Sequential(*result)
    empty = isinstance(result, (list, tuple))  # non-empty ones returned above
    what = f"an empty {type(result).__name__}" if empty else f"a {type(result).__name__}"
    raise ConfigError(f"User model '{target}' returned {what}. Expected {_EXPECTED}.")


def _torchvision(name: str, spec: DataSpec, options: Mapping[str, Any]) -> nn.Module:
    """``torchvision.models.NAME(num_classes=classes of the data, **options)``, untrained."""
    try:
        import torchvision.models as tvm
    except Exception as exc:  # not installed, or built against another torch
        raise ConfigError(
            f"--model torchvision:{name} needs torchvision, which does not import here "
            f"({type(exc).__name__}: {exc}). Install the torchvision build matching torch "
            f"{torch.__version__}, or give the model as pkg.module:factory.") from exc
    names = sorted(tvm.list_models(module=tvm))
    if name not in names:
        from polytrain.errors import unknown

        raise unknown("torchvision model", name, names)
    if spec.input_dtype != "float" or len(spec.input_shape) != 3 or spec.input_shape[0] != 3:
        raise ConfigError(
            f"torchvision:{name} takes (3, H, W) images; dataset '{spec.name}' gives "
            f"{spec.input_shape} {spec.input_dtype}. Use e.g. --dataset synthetic-images "
            "--set data.channels=3.")
    model: nn.Module = tvm.get_model(name, weights=None, **{"num_classes": spec.num_classes,
                                                             **dict(options)})
    return model


def _call(fn: Any, spec: DataSpec, options: Mapping[str, Any], target: str) -> object:
    label = f"User model factory '{target}'"
    kwargs = factory_kwargs(fn, spec, options, label)
    try:
        return fn(**kwargs)
    except Exception as exc:
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise ConfigError(
            f"{label} raised {type(exc).__name__}: {exc}. It was called as "
            f"{target.partition(':')[2]}({shown})."
        ) from exc


def load_user_model(target: str, spec: DataSpec,
                    options: Mapping[str, Any] | None = None) -> nn.Sequential:
    """Import ``pkg.mod:factory``, call it by parameter name, and hold the result as layers."""
    options = dict(options or {})
    module, _, name = target.partition(":")
    if module == "torchvision":
        return as_sequential(_torchvision(name, spec, options), target)
    if module == "hf":
        from polytrain.models.hf import build_hf

        return as_sequential(build_hf(name, spec, options), target)
    fn = load_callable(target)
    return as_sequential(_call(fn, spec, options, target), target)
