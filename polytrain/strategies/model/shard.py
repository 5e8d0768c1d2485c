"""Slicing layers by output rows, the building block of every intra-layer split here.

A Linear's ``weight`` is (out, in) and a Conv2d's (out, in/groups, k, k): keeping output rows
[a, b) keeps those rows of the weight and of the bias, and the layer then computes exactly those
output features/channels of the full layer for any input.
"""

from __future__ import annotations

import torch
from torch import nn

from polytrain.models.layers import WeightLayer


def out_size(layer: WeightLayer) -> int:
    return layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels


def keep_out_rows(layer: WeightLayer, rows: tuple[int, int]) -> None:
    """Keep output rows [a, b) of ``layer`` (weight and bias), in place."""
    a, b = rows
    with torch.no_grad():
        layer.weight = nn.Parameter(layer.weight[a:b].clone())
        if layer.bias is not None:
            layer.bias = nn.Parameter(layer.bias[a:b].clone())
    if isinstance(layer, nn.Linear):
        layer.out_features = b - a
    else:
        layer.out_channels = b - a


def own_group_only(conv: nn.Conv2d) -> None:
    """A 2-group conv whose output rows were cut to one group's: it now reads only that group's
    input half, i.e. it is an ordinary conv on (in/2) channels (the weight is already (out/2,
    in/2, k, k))."""
    conv.in_channels //= conv.groups
    conv.groups = 1
