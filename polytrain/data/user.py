"""User datasets: ``--dataset pkg.module:factory``.

The factory is called by parameter name: ``seed`` (the job's seed) and any ``--set data.KEY=VALUE``
options. It returns one of

* a map-style ``torch.utils.data.Dataset`` of ``(x, y)`` samples (the training split), or a
  tuple ``(train, test)`` of them;
* tensors: ``(x, y)`` or ``(x_train, y_train, x_test, y_test)``;
* samples may be Hugging Face style dicts (``input_ids``, ``labels``, an all-ones
  ``attention_mask``): see :func:`hf_sample` for how they become ``(x, y)``;
* a dict with ``train`` (and ``test``) datasets or ``x_train``/``y_train``/``x_test``/``y_test``
  tensors, and optionally ``task`` ("classify" | "lm") and ``num_classes`` where the sample
  cannot tell them.

Samples are stacked into tensors once (every built-in dataset is in memory too), so each rank
takes its part of each global batch as for any dataset: one seeded permutation per epoch, rank p
of D the p-th slice of each global batch (DistributedSampler's semantics: no sample twice per
epoch, the union over ranks is the whole batch). The task is inferred from a sample: integer
scalar labels -> classify with max label + 1 classes; integer token inputs with labels of the
same shape -> lm over max token + 1 symbols. Without a test split the evaluation uses the
training split (its spec's ``test_size`` is then the training size).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Mapping
from typing import Any

import torch

from polytrain.data.base import Dataset, DataSpec
from polytrain.errors import ConfigError
from polytrain.targets import load_callable

EXPECTED = ("a map-style torch Dataset of (x, y) samples, a tuple (train, test) of them, tensors "
            "(x, y) or (x_train, y_train, x_test, y_test), or a dict of those")


def _stack(ds: Any, target: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (x, y) sample of a map-style dataset as two tensors."""
    try:
        n = len(ds)
    except TypeError:
        raise ConfigError(f"Dataset '{target}' returned a {type(ds).__name__} for {split} without "
                          f"len(): polytrain takes map-style datasets. Expected {EXPECTED}.") from None
    if n == 0:
        raise ConfigError(f"Dataset '{target}': the {split} split is empty.")
    xs, ys = [], []
    for i in range(n):
        item = ds[i]
        if isinstance(item, Mapping):
            item = hf_sample(item, f"Dataset '{target}': {split}[{i}]")
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ConfigError(f"Dataset '{target}': {split}[{i}] is a {type(item).__name__}, "
                              "not an (x, y) pair. Return (input, label) from __getitem__.")
        xs.append(torch.as_tensor(item[0]))
        ys.append(torch.as_tensor(item[1]))
    try:
        return torch.stack(xs), torch.stack(ys)
    except RuntimeError as exc:
        raise ConfigError(f"Dataset '{target}': {split} samples differ in shape ({exc}); every "
                          "x must have one shape, and every y.") from None


IGNORE = -100  # F.cross_entropy's default ignore_index, and Hugging Face's


def hf_sample(item: Mapping[str, Any], where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A Hugging Face style sample ``{"input_ids", "labels" (or "label"), "attention_mask"}`` as
    the model-call contract's ``(x, y)``: x = input_ids; token labels of x's shape are Hugging
    Face's unshifted causal-LM labels, so y[t] = labels[t + 1] with the last position ignored
    (the loss Hugging Face computes); a class label is y as it is. Padding is not supported."""
    if "input_ids" not in item:
        raise ConfigError(f"{where} is a dict without 'input_ids' (keys: {', '.join(item)}); "
                          "return (input, label) pairs or Hugging Face style dicts.")
    x = torch.as_tensor(item["input_ids"])
    mask = item.get("attention_mask")
    if mask is not None and not bool(torch.as_tensor(mask).all()):
        raise ConfigError(f"{where} has padding (attention_mask zeros); polytrain feeds "
                          "input_ids alone, so give samples of one length without padding.")
    labels = item.get("labels", item.get("label"))
    if labels is None:
        raise ConfigError(f"{where} has no 'labels' (or 'label'); a training sample needs one.")
    y = torch.as_tensor(labels)
    if y.shape == x.shape and x.dim() == 1:
        y = torch.cat([y[1:], y.new_full((1,), IGNORE)])
    return x, y


def _tensors(obj: Any, target: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(obj, (tuple, list)) and len(obj) == 2 and all(
            isinstance(t, torch.Tensor) for t in obj):
        return obj[0], obj[1]
    return _stack(obj, target, split)


def _splits(result: Any, target: str) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """(x_train, y_train, x_test, y_test) (the test pair may be empty) and declared metadata."""
    meta: dict[str, Any] = {}
    train: Any
    test: Any
    if isinstance(result, Mapping):
        meta = {k: result[k] for k in ("task", "num_classes") if k in result}
        if "x_train" in result:
            parts = [result.get(k) for k in ("x_train", "y_train", "x_test", "y_test")]
            train, test = (parts[0], parts[1]), (parts[2], parts[3]) if parts[2] is not None else None
        else:
            train, test = result.get("train"), result.get("test")
    elif isinstance(result, (tuple, list)) and len(result) == 4 and all(
            isinstance(t, torch.Tensor) for t in result):
        train, test = (result[0], result[1]), (result[2], result[3])
    elif isinstance(result, (tuple, list)) and len(result) == 2 and not all(
            isinstance(t, torch.Tensor) for t in result):
        train, test = result
    else:
        train, test = result, None
    if train is None:
        raise ConfigError(f"Dataset '{target}' returned no training split. Expected {EXPECTED}.")
    x, y = _tensors(train, target, "train")
    xt, yt = _tensors(test, target, "test") if test is not None else (x[:0], y[:0])
    return (x, y, xt, yt), meta


def _check_pairs(name: str, x: torch.Tensor, y: torch.Tensor, xt: torch.Tensor,
                 yt: torch.Tensor) -> None:
    """Refuse, before any process starts, data a rank would fail on with a bare IndexError:
    no samples, inputs and labels of different lengths, float or negative labels."""
    for split, (a, b) in (("train", (x, y)), ("test", (xt, yt))):
        if a.dim() == 0 or b.dim() == 0 or a.shape[0] != b.shape[0]:
            raise ConfigError(f"Dataset '{name}': the {split} split has {len(a) if a.dim() else 0} "
                              f"inputs but {len(b) if b.dim() else 0} labels; return one label per "
                              "input (x and y of the same length).")
        if b.numel() and b.is_floating_point():
            raise ConfigError(f"Dataset '{name}': {split} labels are {b.dtype}; polytrain's tasks "
                              "take integer class ids (classify) or next-token ids (lm). Return "
                              "y as torch.long.")
        if b.numel() and int(b.min()) < 0:
            raise ConfigError(f"Dataset '{name}': {split} labels include {int(b.min())}; class ids "
                              "are 0..C-1. Map the labels to non-negative ids.")
    if x.shape[0] == 0:
        raise ConfigError(f"Dataset '{name}': the train split is empty.")


def _spec(name: str, x: torch.Tensor, y: torch.Tensor, xt: torch.Tensor, yt: torch.Tensor,
          meta: dict[str, Any]) -> DataSpec:
    floating = x.is_floating_point()
    if y.is_floating_point():
        raise ConfigError(f"Dataset '{name}': labels are {y.dtype}; polytrain's tasks take "
                          "integer class ids (classify) or next-token ids (lm).")
    lm = not floating and y.shape == x.shape and y.dim() == 2
    task = meta.get("task", "lm" if lm else "classify")
    if task not in ("classify", "lm"):
        raise ConfigError(f"Dataset '{name}': task '{task}' is not one of classify, lm.")
    if task == "classify" and y.dim() != 1:
        raise ConfigError(f"Dataset '{name}': classify labels must be one class id per sample; "
                          f"got labels of shape {tuple(y.shape[1:])} per sample.")
    top = [int(y.max()), int(yt.max()) if yt.numel() else 0]
    if task == "lm":
        top += [int(x.max()), int(xt.max()) if xt.numel() else 0]
    classes = int(meta.get("num_classes", max(top) + 1))
    return DataSpec(name, task, tuple(x.shape[1:]), "float" if floating else "long", classes,
                    int(x.shape[0]), int(xt.shape[0]) or int(x.shape[0]))


def _kwargs(fn: Any, options: Mapping[str, Any], seed: int, target: str) -> dict[str, Any]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in options if k not in params and not var_kw]
    if unknown:
        raise ConfigError(f"Unknown data option '{unknown[0]}' for dataset '{target}'. Its "
                          f"parameters: {', '.join(params) or 'none'}.")
    kwargs = dict(options)
    if "seed" in params and "seed" not in kwargs:
        kwargs["seed"] = seed
    return kwargs


@functools.lru_cache(maxsize=4)
def _load(target: str, options_json: str, seed: int) -> Dataset:
    fn = load_callable(target, "user dataset")
    kwargs = _kwargs(fn, json.loads(options_json), seed, target)
    try:
        result = fn(**kwargs)
    except Exception as exc:
        raise ConfigError(f"Dataset factory '{target}' raised {type(exc).__name__}: {exc} "
                          f"(called with {kwargs}).") from exc
    (x, y, xt, yt), meta = _splits(result, target)
    _check_pairs(target, x, y, xt, yt)
    if x.is_floating_point():
        x, xt = x.float(), xt.float()
    else:
        x, xt = x.long(), xt.long()
    y, yt = y.long(), yt.long()
    spec = _spec(target, x, y, xt, yt, meta)
    if xt.shape[0] == 0:  # no test split: evaluate on the training data (said in the summary)
        xt, yt = x, y
    return Dataset(spec, x, y, xt, yt)


def load_user_dataset(target: str, options: Mapping[str, Any] | None, seed: int = 0) -> Dataset:
    """Build (once per process) and return the user's dataset as in-memory tensors."""
    return _load(target, json.dumps(dict(options or {}), sort_keys=True, default=str), seed)
