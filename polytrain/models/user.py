"""User models: ``--model pkg.module:factory``.

``factory()`` or ``factory(spec)`` (spec is passed when the callable takes at least one positional
parameter) returns an ``nn.Sequential``, any other ``nn.Module`` (wrapped as a one-child
Sequential, so layer-wise strategies see it as a single layer), or a list/tuple of modules (the
ordered layers). Every failure is a ConfigError that says what went wrong and how to fix it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from torch import nn

from polytrain.data import DataSpec
from polytrain.errors import ConfigError

_EXPECTED = "an nn.Module (ideally an nn.Sequential of its layers) or a list/tuple of nn.Modules"


def split_target(target: str) -> tuple[str, str]:
    """'pkg.mod:factory' -> ('pkg.mod', 'factory'), or a ConfigError explaining the syntax."""
    module, sep, attr = target.partition(":")
    valid = all(p.isidentifier() for p in module.split(".")) and all(
        p.isidentifier() for p in attr.split(".")
    )
    if not sep or not valid:
        raise ConfigError(
            f"User model '{target}' must be written 'package.module:factory' (a module path, a "
            "colon, then the callable's name), e.g. 'mynet:build'."
        )
    return module, attr


def _import(module: str, target: str) -> ModuleType:
    # A console script does not put the working directory on sys.path; `python -m` does. Users
    # expect `--model mynet:build` to find ./mynet.py, so the cwd is appended (last: installed
    # packages still win).
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    importlib.invalidate_caches()
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"Cannot import module '{module}' for user model '{target}': "
            f"{type(exc).__name__}: {exc}. The module must be importable from the current "
            f"directory ({cwd}) or PYTHONPATH."
        ) from exc
    except Exception as exc:  # the module itself raised while importing (SyntaxError, ...)
        raise ConfigError(
            f"Importing module '{module}' for user model '{target}' raised "
            f"{type(exc).__name__}: {exc}. Fix the module so that it imports cleanly."
        ) from exc


def _takes_argument(factory: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: call with nothing
        return False
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    return any(p.kind in positional for p in params)


def as_sequential(result: object, target: str) -> nn.Sequential:
    """Turn a factory's return value into the ordered-layers form strategies expect."""
    if isinstance(result, nn.Sequential):
        return result
    if isinstance(result, nn.Module):
        return nn.Sequential(result)
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


def load_user_model(target: str, spec: DataSpec) -> nn.Sequential:
    """Import ``pkg.mod:factory``, call it (with ``spec`` if it takes a parameter), wrap it."""
    module_name, attr = split_target(target)
    obj: Any = _import(module_name, target)
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_"))[:20]
            raise ConfigError(
                f"Module '{module_name}' has no attribute '{attr}' (user model '{target}'). "
                f"Names it defines: {', '.join(public) or 'none'}."
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(
            f"User model '{target}' names a {type(obj).__name__}, which is not callable. Point "
            "it at a function or class that returns the model, e.g. 'mynet:build'."
        )
    args = (spec,) if _takes_argument(obj) else ()
    try:
        result = obj(*args)
    except Exception as exc:
        called = f"{attr}(spec)" if args else f"{attr}()"
        raise ConfigError(
            f"User model factory {module_name}.{called} raised {type(exc).__name__}: {exc}. "
            f"It was called with {'the dataset spec ' + repr(spec) if args else 'no arguments'}."
        ) from exc
    return as_sequential(result, target)
