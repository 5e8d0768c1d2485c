"""User models: ``--model pkg.module:factory`` and ``--model torchvision:NAME``.

The factory is called by parameter name (see :mod:`polytrain.models.factory`) and returns an
``nn.Sequential`` (its children are the ordered layers), a list/tuple of modules (the layers), or
any other ``nn.Module``. The last is held as a one-child :class:`UserModule`; pipeline and
model-parallel strategies cut it into stages by tracing (:mod:`polytrain.models.trace`).

A module whose ``forward`` takes the targets (a parameter named ``targets``, ``target``,
``labels`` or ``y``, as nanoGPT and Hugging Face models do) receives them by that keyword; it may
return ``(output, loss)`` or a dict with ``loss`` (see :mod:`polytrain.models.outputs`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from polytrain.data import DataSpec
from polytrain.errors import ConfigError
from polytrain.models.factory import factory_kwargs
from polytrain.targets import load_callable, split_target

__all__ = ["UserModule", "as_sequential", "load_user_model", "split_target", "targets_keyword"]

_EXPECTED = "an nn.Module (ideally an nn.Sequential of its layers) or a list/tuple of nn.Modules"
TARGET_NAMES = ("targets", "target", "labels", "y")


def targets_keyword(module: nn.Module) -> str | None:
    """The name under which ``module.forward`` takes the targets, or None."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((n for n in TARGET_NAMES if n in params), None)


class UserModule(nn.Sequential):
    """One user module as a one-layer Sequential (state_dict keys ``0.*``).

    ``forward(x, targets)`` hands the targets on when the module's forward takes them.
    """

    def forward(self, x: Any, targets: torch.Tensor | None = None) -> Any:  # type: ignore[override]
        inner = self[0]
        key = targets_keyword(inner)
        if targets is not None and key is not None:
            return inner(x, **{key: targets})
        return inner(x)

    @property
    def takes_targets(self) -> bool:
        return targets_keyword(self[0]) is not None


def as_sequential(result: object, target: str) -> nn.Sequential:
    """Turn a factory's return value into the ordered-layers form strategies expect."""
    if isinstance(result, nn.Sequential):
        return result
    if isinstance(result, nn.Module):
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
    fn = load_callable(target)
    return as_sequential(_call(fn, spec, options, target), target)
