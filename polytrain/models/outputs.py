"""What a model may return, and where the loss comes from.

A model's forward returns one of:

* a tensor: the output (logits); the loss is ``--loss pkg.mod:fn`` ``fn(output, targets)``, or
  the task's cross-entropy (:func:`polytrain.data.task_loss`);
* a tuple/list ``(output, loss, ...)`` as nanoGPT does: ``output`` is the first item and the loss
  is the second when it is a tensor (``None`` when the forward got no targets);
* a mapping with ``logits`` (or ``output``) and ``loss``, as Hugging Face models do.

A loss the model computed is used as is (``--loss`` then refers to the output only when the model
returned none). :func:`describe` names what was returned, for error messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from polytrain.errors import ConfigError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
EXPECTED = ("a tensor of outputs, a tuple (outputs, loss) or a dict with 'logits' and 'loss' "
            "(the loss a scalar tensor)")


def describe(out: Any) -> str:
    """A short account of a model's return value: types and shapes."""
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {tuple(out.shape)} ({out.dtype})"
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} ({', '.join(describe(o) for o in out)})"
    if isinstance(out, Mapping):
        return "a dict {" + ", ".join(f"{k!r}: {describe(v)}" for k, v in out.items()) + "}"
    return f"a {type(out).__name__}"


def output_of(out: Any) -> torch.Tensor:
    """The model's output tensor (logits) from any of the accepted return forms."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if isinstance(out, Mapping):
        for key in ("logits", "output", "out"):
            if isinstance(out.get(key), torch.Tensor):
                return out[key]
    raise ConfigError(f"The model returned {describe(out)}; expected {EXPECTED}.")


def loss_of(out: Any) -> torch.Tensor | None:
    """The loss the model computed itself, or None."""
    item = None
    if isinstance(out, (tuple, list)) and len(out) > 1:
        item = out[1]
    elif isinstance(out, Mapping):
        item = out.get("loss")
    if item is None:
        return None
    if not isinstance(item, torch.Tensor) or item.numel() != 1:
        raise ConfigError(f"The model returned {describe(out)}: its loss must be a scalar "
                          f"tensor. Expected {EXPECTED}.")
    return item.reshape(())
