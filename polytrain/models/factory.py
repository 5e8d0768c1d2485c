"""Call a user's model factory the way it is written: by parameter name.

polytrain reads the factory's signature (a function, or a class's ``__init__``) and passes what it
asks for, by keyword, never positionally:

==========================================  ===================================================
parameter                                   value
==========================================  ===================================================
``spec`` or any one annotated ``DataSpec``  the dataset's :class:`~polytrain.data.DataSpec`
``num_classes``, ``n_classes``,             classes (vocabulary size for lm datasets)
``out_features``, ``num_outputs``
``vocab_size``, ``n_vocab``                 vocabulary size (lm datasets)
``in_channels``, ``in_chans``               C of (C, H, W) image inputs
``in_features``, ``input_dim``              features of (F,) inputs (C*H*W for images)
``input_shape``                             the per-sample input shape, a tuple
``image_size``, ``img_size``                H of square (C, H, H) images
``block_size``, ``seq_len``, ``max_seq_len``  T of (T,) token inputs
==========================================  ===================================================

``--set model.KEY=VALUE`` (and ``[model_options]`` in the TOML) pass further keyword arguments,
typed from the parameter's annotation or default (pydantic's lax mode: "32" becomes 32 for an
``int``). A parameter whose annotation (or default) is a dataclass — nanoGPT's ``GPT(config:
GPTConfig)`` — receives an instance built from the dataclass's fields by the same rules (so
``vocab_size`` and ``block_size`` come from the data, ``--set model.n_layer=2`` sets a field).
An option that names no parameter or field lists those that exist; a required argument nothing
supplies is named in a one-line error.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from polytrain.data import DataSpec
from polytrain.errors import ConfigError, did_you_mean


def spec_values(spec: DataSpec) -> dict[str, Any]:
    """What each conventional parameter name means for ``spec`` (only those that apply)."""
    shape = spec.input_shape
    values: dict[str, Any] = {"input_shape": tuple(shape)}
    for name in ("num_classes", "n_classes", "out_features", "num_outputs"):
        values[name] = spec.num_classes
    if spec.task == "lm":
        values.update(vocab_size=spec.num_classes, n_vocab=spec.num_classes)
        for name in ("block_size", "seq_len", "max_seq_len"):
            values[name] = shape[0]
    if spec.input_dtype == "float":
        values.update(in_features=math.prod(shape), input_dim=math.prod(shape))
        if len(shape) == 3:
            values.update(in_channels=shape[0], in_chans=shape[0])
            if shape[1] == shape[2]:
                values.update(image_size=shape[1], img_size=shape[1])
    return values


def _hints(fn: Any) -> dict[str, Any]:
    """Resolved annotations (postponed ones too); {} where they cannot be evaluated."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    try:
        return typing.get_type_hints(target)
    except Exception:  # a name only importable under TYPE_CHECKING, say: go by defaults
        return {}


def _module_config(fn: Any, name: str) -> type | None:
    """For an unannotated ``config`` parameter (nanoGPT's ``GPT.__init__(self, config)``): the one
    dataclass named ``...Config`` in the factory's own module, or None when there is not one."""
    if name not in ("config", "cfg", "conf"):
        return None
    module = inspect.getmodule(fn)
    found = [v for k, v in vars(module).items() if inspect.isclass(v) and dataclasses.is_dataclass(v)
             and k.endswith("Config") and v.__module__ == getattr(module, "__name__", None)]
    return found[0] if len(found) == 1 else None


def _annotation(fn: Any, p: inspect.Parameter, hints: dict[str, Any]) -> Any:
    """The parameter's annotation, or the module's config dataclass for a bare ``config``."""
    ann = hints.get(p.name, p.annotation)
    if ann is inspect.Parameter.empty and p.default is inspect.Parameter.empty:
        return _module_config(fn, p.name) or ann
    return ann


def _config_class(annotation: Any, default: Any) -> type | None:
    if inspect.isclass(annotation) and dataclasses.is_dataclass(annotation):
        return annotation
    if dataclasses.is_dataclass(default) and not inspect.isclass(default):
        return type(default)
    return None


def _typed(value: Any, annotation: Any, default: Any, where: str) -> Any:
    """``value`` validated against the annotation (or the default's type); unchanged if neither."""
    kind = annotation if annotation is not inspect.Parameter.empty else (
        type(default) if default not in (None, inspect.Parameter.empty) else None)
    if kind is None:
        return value
    try:
        return TypeAdapter(kind).validate_python(value)
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"]
        raise ConfigError(f"Model option {where}={value!r}: {msg} (expected {kind}).") from None
    except Exception:  # an annotation pydantic cannot check: pass the value as given
        return value


@dataclasses.dataclass
class _Call:
    """The keyword arguments being gathered and the option keys used so far."""

    spec: DataSpec
    options: Mapping[str, Any]
    values: dict[str, Any]
    used: set[str] = dataclasses.field(default_factory=set)

    def value(self, name: str, annotation: Any, default: Any, where: str) -> Any:
        """The argument for one parameter/field, or ``inspect.Parameter.empty`` for none."""
        if name in self.options:
            self.used.add(name)
            return _typed(self.options[name], annotation, default, where)
        if name == "spec" or annotation is DataSpec:
            return self.spec
        config = _config_class(annotation, default)
        if config is not None:
            return self.config(config, default, where)
        if name in self.values:
            return self.values[name]
        return inspect.Parameter.empty

    def config(self, cls: type, default: Any, where: str) -> Any:
        """A config dataclass instance: fields from options, then the data, then the defaults."""
        hints = _hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            base = getattr(default, f.name) if dataclasses.is_dataclass(default) else (
                f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty)
            v = self.value(f.name, hints.get(f.name, inspect.Parameter.empty), base, f.name)
            if v is not inspect.Parameter.empty:
                kwargs[f.name] = v
            elif base is inspect.Parameter.empty and f.default_factory is dataclasses.MISSING:
                raise ConfigError(
                    f"{where}: field '{f.name}' of {cls.__name__} has no default and polytrain "
                    f"cannot supply it; give it with --set model.{f.name}=VALUE.")
        return cls(**kwargs)


def option_names(fn: Callable[..., Any]) -> list[str]:
    """Every key ``--set model.KEY`` may name: parameters and fields of config dataclasses."""
    names: list[str] = []
    hints = _hints(fn)
    for p in _params(fn):
        names.append(p.name)
        config = _config_class(_annotation(fn, p, hints), p.default)
        if config is not None:
            names.extend(f.name for f in dataclasses.fields(config))
    return names


def _params(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: called with nothing
        return []
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p for p in sig.parameters.values() if p.kind not in skip]


def _takes_kwargs(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def factory_kwargs(fn: Callable[..., Any], spec: DataSpec, options: Mapping[str, Any],
                   label: str) -> dict[str, Any]:
    """The keyword arguments to call ``fn`` with (see the module docstring)."""
    call = _Call(spec, options, spec_values(spec))
    hints = _hints(fn)
    kwargs: dict[str, Any] = {}
    for p in _params(fn):
        if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.name not in options:
            if p.default is inspect.Parameter.empty:
                raise ConfigError(f"{label} takes '{p.name}' positionally only; polytrain "
                                  "calls factories by keyword. Make it a keyword parameter.")
            continue
        v = call.value(p.name, _annotation(fn, p, hints), p.default, p.name)
        if v is not inspect.Parameter.empty:
            kwargs[p.name] = v
        elif p.default is inspect.Parameter.empty:
            raise ConfigError(
                f"{label} requires argument '{p.name}', which polytrain cannot supply (it "
                f"passes {', '.join(sorted(call.values))}, spec by name). Give it with --set "
                f"model.{p.name}=VALUE or a default in the factory.")
    extra = [k for k in options if k not in call.used]
    if extra and _takes_kwargs(fn):  # **kwargs: the rest goes through as given
        kwargs.update({k: options[k] for k in extra})
    elif extra:
        names = option_names(fn)
        raise ConfigError(
            f"Unknown model option '{extra[0]}' for {label}. "
            + (did_you_mean(extra[0], names) if names else "It takes no parameters."))
    return kwargs
