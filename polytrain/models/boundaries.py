"""What crosses a stage boundary: the shape and dtype of each layer's output (`TensorMeta`).

`boundary_metas` is what every pipeline rank runs before training: one no-grad forward in eval
mode that gives the shape and dtype of every layer's output, so each stage knows the size of what
it will receive without exchanging shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from polytrain.errors import ConfigError
from polytrain.models.partition import layers_of


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of one tensor crossing a stage boundary."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorMeta:
        return cls(tuple(t.shape), t.dtype)


def one_tensor(name: str, index: int, out: object) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise ConfigError(
            f"Layer {index} ('{name}') returns a {type(out).__name__}, not one tensor. Rule: a "
            "pipeline cuts between layers and sends one tensor across, so each layer must map one "
            "tensor to one tensor. Fix: wrap the layers that pass tuples into one module."
        )
    return out


@torch.no_grad()
def boundary_metas(model: nn.Module, sample: torch.Tensor) -> list[TensorMeta]:
    """Output shape and dtype of every layer for the batch ``sample`` (one dry forward).

    Eval mode and no grad: no batch-norm statistics move, no dropout draws, nothing is stored.
    """
    was = model.training
    model.eval()
    try:
        out, metas = sample, []
        for i, (name, layer) in enumerate(layers_of(model)):
            out = one_tensor(name, i, layer(out))
            metas.append(TensorMeta.of(out))
        return metas
    finally:
        model.train(was)
