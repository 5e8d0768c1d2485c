"""``pkg.module:name`` targets: user models, datasets and losses, imported by name.

Every rank imports a user's callable by the same name, so a target is a module path, a colon and
an attribute path. Every failure is a ConfigError that says what went wrong and how to fix it.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

from polytrain.errors import ConfigError


def split_target(target: str, what: str = "user model") -> tuple[str, str]:
    """'pkg.mod:factory' -> ('pkg.mod', 'factory'), or a ConfigError explaining the syntax."""
    module, sep, attr = target.partition(":")
    valid = all(p.isidentifier() for p in module.split(".")) and all(
        p.isidentifier() for p in attr.split(".")
    )
    if not sep or not valid:
        raise ConfigError(
            f"{what.capitalize()} '{target}' must be written 'package.module:factory' (a module "
            "path, a colon, then the callable's name), e.g. 'mynet:build'."
        )
    return module, attr


def import_module(module: str, target: str, what: str = "user model") -> ModuleType:
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
            f"Cannot import module '{module}' for {what} '{target}': "
            f"{type(exc).__name__}: {exc}. The module must be importable from the current "
            f"directory ({cwd}) or PYTHONPATH."
        ) from exc
    except Exception as exc:  # the module itself raised while importing (SyntaxError, ...)
        raise ConfigError(
            f"Importing module '{module}' for {what} '{target}' raised "
            f"{type(exc).__name__}: {exc}. Fix the module so that it imports cleanly."
        ) from exc


def load_callable(target: str, what: str = "user model") -> Any:
    """The callable named by ``pkg.mod:attr`` (attribute paths such as ``mod:Cls.build`` too)."""
    module_name, attr = split_target(target, what)
    obj: Any = import_module(module_name, target, what)
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_"))[:20]
            raise ConfigError(
                f"Module '{module_name}' has no attribute '{attr}' ({what} '{target}'). "
                f"Names it defines: {', '.join(public) or 'none'}."
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(
            f"{what.capitalize()} '{target}' names a {type(obj).__name__}, which is not callable. "
            "Point it at a function or class, e.g. 'mynet:build'."
        )
    return obj
