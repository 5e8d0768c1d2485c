"""The output contract, checked once on the launcher with one sample batch before any process
starts: the model's forward runs on two samples, and its output (or its own loss) must give a
scalar loss against the labels. The message says what was returned and what is expected."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from polytrain.data import DataSpec, task_loss
from polytrain.errors import ConfigError
from polytrain.models.call import call_of
from polytrain.models.outputs import EXPECTED, describe, loss_of, output_of


def sample_batch(spec: DataSpec, n: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` placeholder samples of ``spec``'s shapes (zeros: valid tokens and class ids)."""
    dtype = torch.long if spec.input_dtype == "long" else torch.float32
    x = torch.zeros((n, *spec.input_shape), dtype=dtype)
    y = torch.zeros((n, *spec.input_shape) if spec.task == "lm" else (n,), dtype=torch.long)
    return x, y


def check_output(model: torch.nn.Module, spec: DataSpec, loss_target: str | None,
                 sample: tuple[torch.Tensor, torch.Tensor] | None = None,
                 label: str = "the model") -> None:
    """Run ``model`` on a sample batch and compute its loss; a ConfigError says what is wrong."""
    x, y = sample if sample is not None else sample_batch(spec)
    takes_targets = call_of(model).kind == "targets"
    with torch.no_grad():
        try:
            out = model(x, y) if takes_targets else model(x)
        except Exception as exc:
            raise ConfigError(
                f"{label} failed on a sample batch x {tuple(x.shape)} {x.dtype} (dataset "
                f"'{spec.name}', task {spec.task}): {type(exc).__name__}: {exc}.") from exc
        loss = _loss(out, y, spec, loss_target, label)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ConfigError(f"The loss of {label} on a sample batch is {describe(loss)}, not a "
                          "scalar tensor. A loss function must return one number per batch.")


def _loss(out: Any, y: torch.Tensor, spec: DataSpec, loss_target: str | None, label: str) -> Any:
    try:
        own = loss_of(out)
        if own is not None:
            return own
        logits = output_of(out)
    except ConfigError as exc:
        raise ConfigError(f"{label} on a sample batch: {exc}") from None
    if loss_target is not None:
        from polytrain.targets import load_callable

        fn = load_callable(loss_target, "loss function")
        try:
            return fn(logits, y)
        except Exception as exc:
            raise ConfigError(
                f"Loss function '{loss_target}' failed on {label}'s output ({describe(logits)}) "
                f"and labels {tuple(y.shape)} {y.dtype}: {type(exc).__name__}: {exc}.") from exc
    try:
        return task_loss(spec, logits, y)
    except ConfigError as exc:
        raise ConfigError(
            f"{label} returned {describe(out)} on a sample batch of {y.shape[0]} inputs "
            f"{spec.input_shape} (checked before any process starts): {exc} Expected {EXPECTED}, "
            "or give --loss pkg.mod:fn."
        ) from None



def check_job(model: str, options: Mapping[str, Any], spec: DataSpec, loss: str | None,
              dataset: str, data_options: Mapping[str, Any]) -> None:
    """Build the job's model once and check its output on a sample batch (the dataset's first
    two samples for a user dataset, placeholders of the spec's shapes otherwise)."""
    from polytrain.models.registry import build_model

    sample = None
    if ":" in dataset:
        from polytrain.data import load_dataset

        data = load_dataset(dataset, data_options)
        sample = data.x_train[:2], data.y_train[:2]
    check_output(build_model(model, spec, options), spec, loss, sample, f"model '{model}'")
