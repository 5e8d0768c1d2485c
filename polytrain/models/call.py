"""The model-call contract: how every strategy and every pipeline stage feeds a batch to the
user's model and obtains the loss. It is decided once, from the model's signature and type, before
any process starts, and recorded in ``summary.json`` as ``model_call``.

==============  ===========================================  ===================================
kind            the call                                     the loss
==============  ===========================================  ===================================
``x``           ``model(x)`` → output                        ``--loss pkg.mod:fn(output, y)``, else
                                                             the task's cross-entropy
``targets``     ``model(x, targets=y)`` → ``(logits, loss)``  the model's own loss (nanoGPT)
                (the keyword: ``targets``/``target``/``y``)
``hf``          ``model(input_ids=x)`` → ``ModelOutput``     the task's loss on ``.logits``
==============  ===========================================  ===================================

The language-modelling target convention, for every kind: a batch is ``x`` (B, T) tokens and
``y`` (B, T) with ``y[:, t] = x[:, t + 1]`` (already shifted), and the loss is the mean next-token
cross-entropy over all T positions. A Hugging Face causal LM is therefore never given ``labels``
(it would shift them a second time and learn token t+2); polytrain scores its logits itself. A
nanoGPT-style model gets ``targets`` on every call, training and evaluation alike, because without
them it returns the logits of the last position only.

A user dataset may give Hugging Face style dict samples; :func:`polytrain.data.user.hf_sample`
turns them into this ``(x, y)`` form (``labels`` shifted, the last position ignored), so the loss
equals the one the model would compute from ``labels`` itself.

When a pipeline or tensor-parallel strategy cuts the model by tracing, the traced root calls the
model the same way (:meth:`ModelCall.logits`) and keeps the logits of every position; the job's
loss is then taken on the last stage. A ``targets`` model's own loss and the job's task loss are the
same cross-entropy, so the objective is one under every strategy.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.fx as fx
from torch import nn

from polytrain.models.outputs import output_of

Kind = Literal["x", "targets", "hf"]
#: parameter names under which a forward takes the targets (``labels`` is HF's, handled as ``hf``)
TARGET_NAMES = ("targets", "target", "labels", "y")


def is_hf_model(module: nn.Module) -> bool:
    """A Hugging Face ``PreTrainedModel`` (detected without importing transformers)."""
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers")
               for c in type(module).__mro__)


def targets_keyword(module: nn.Module) -> str | None:
    """The name under which ``module.forward`` takes the targets, or None."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((n for n in TARGET_NAMES if n in params), None)


@dataclass(frozen=True)
class ModelCall:
    """How one model is called (see the module doc). ``keyword``: the targets' keyword
    (``targets`` kind) or the inputs' (``hf``: ``input_ids``)."""

    kind: Kind = "x"
    keyword: str | None = None

    @classmethod
    def of(cls, module: nn.Module) -> ModelCall:
        """The call for ``module`` (the user's own module, not a wrapper around it)."""
        if is_hf_model(module):
            return cls("hf", "input_ids")
        key = targets_keyword(module)
        return cls("targets", key) if key is not None else cls("x")

    def __call__(self, forward: Any, x: torch.Tensor, y: torch.Tensor | None) -> Any:
        """The model's raw output for one batch (``y`` None only where no targets exist)."""
        if self.kind == "hf":
            return forward(**{self.keyword or "input_ids": x})
        if self.kind == "targets" and y is not None:
            return forward(x, **{self.keyword or "targets": y})
        return forward(x)

    def logits(self, module: nn.Module, x: torch.Tensor, tokens: bool = True) -> Any:
        """The output of every position for ``x`` alone, as a traced root computes it: a
        ``targets`` model gets placeholder targets (so it returns all positions' logits; the
        loss it computes from them is dropped by the tracer as unused). ``tokens``: ``x`` is
        (B, T) token ids, decided before tracing (a traced value cannot be branched on)."""
        y = placeholder_targets(x, tokens) if self.kind == "targets" else None
        return traced_output(self(module, x, y))

    def describe(self) -> str:
        """The one line ``summary.json`` records as ``model_call``."""
        if self.kind == "hf":
            return ("hf: model(input_ids=x).logits, scored by the task's loss against y "
                    "(no labels passed: the targets are already shifted)")
        if self.kind == "targets":
            return f"targets: model(x, {self.keyword}=y) -> (logits, loss), the model's own loss"
        return "x: model(x) -> output, scored by the job's loss (--loss or the task's)"


def traced_output(out: Any) -> Any:
    """:func:`~polytrain.models.outputs.output_of` for values being traced (``torch.fx``
    proxies stand for tensors): the first item of a tuple, a mapping's ``logits``."""
    if isinstance(out, (torch.Tensor, fx.Proxy)):
        return out
    if isinstance(out, (tuple, list)) and out:
        return traced_output(out[0])
    if isinstance(out, Mapping):
        for key in ("logits", "output", "out"):
            if key in out and out[key] is not None:
                return out[key]
    return output_of(out)  # raises, naming what was returned


def placeholder_targets(x: torch.Tensor, tokens: bool) -> torch.Tensor:
    """Targets of the shape a ``targets`` model expects for ``x``: (B, T) token ids for token
    inputs (language models), (B,) class ids otherwise. Their values are never used."""
    if tokens:
        return torch.zeros_like(x)
    return x.new_zeros(x.shape[0], dtype=torch.long)


def token_inputs(example: torch.Tensor | None) -> bool:
    """Whether an example batch is (B, T) token ids (no example: assume a language model)."""
    return example is None or (not example.is_floating_point() and example.dim() == 2)


def call_of(model: nn.Module) -> ModelCall:
    """The call of a built job model: the zoo's Sequentials and traced splits take ``x`` alone
    (their segments already call the user's module by its contract); a user module held whole
    (:class:`polytrain.models.user.UserModule`) is called by its own contract."""
    inner = getattr(model, "user_module", None)
    return ModelCall.of(inner) if isinstance(inner, nn.Module) else ModelCall()
