"""`alexnet`: AlexNet's shape (5 conv + 3 FC), scaled by `width`, ready for its two columns.

Channels keep the paper's ratio 96 : 256 : 384 : 384 : 256 with ``width`` = conv1's channels
(default 96, a multiple of 6 so every layer splits into two equal columns); the FC width is
4096 · width / 96. fc1 starts with an adaptive average pool to 6×6 (as torchvision does), so its
size does not depend on the image. No LRN and no dropout (see vgg.py for why).

Two-column structure (Krizhevsky et al. 2012, fig. 2): each GPU holds half of every layer's
kernels; conv2, conv4 and conv5 read only their own column's half of the previous layer, while
conv3 and the FC layers read both halves, so the columns exchange activations before them. With
``groups=2`` (the default, like Caffe's reference AlexNet) conv2/4/5 are grouped convolutions, so
this single-column ``nn.Sequential`` computes exactly what the two columns compute together;
:func:`alexnet_columns` states the split for the `alexnet_2col` strategy.

Stems: ImageNet-sized images (side ≥ 64) use the paper's 11×11/4 conv1 and 3×3/2 pools; smaller
images (32×32 synthetic-images, 8×8 digits) use a 3×3/1 conv1 and 2×2 pools, each pool only while
the map is at least 2×2 (digits: 8 → 4 → 2 → 1).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from polytrain.data import DataSpec
from polytrain.models.basic import needs_image
from polytrain.models.registry import ModelEntry, register_model

FC_MAP = 6
IMAGENET_MIN_SIDE = 64


class AlexOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    width: int = Field(96, ge=6, multiple_of=6, description="conv1 channels (96 in AlexNet)")
    groups: Literal[1, 2] = Field(2, description="2: conv2/4/5 see only their own column")
    stem: Literal["auto", "imagenet", "small"] = "auto"
    hidden: int | None = Field(None, ge=2, description="FC width (default 4096·width/96)")


def channels(width: int) -> tuple[int, int, int, int, int]:
    """Output channels of conv1..conv5 (96, 256, 384, 384, 256 at width 96)."""
    return width, 8 * width // 3, 4 * width, 4 * width, 8 * width // 3


def _stem(side: int, stem: str) -> str:
    return ("imagenet" if side >= IMAGENET_MIN_SIDE else "small") if stem == "auto" else stem


def _imagenet_sides(side: int) -> list[int]:
    """Map sides before each of the three 3×3/2 pools of the ImageNet stem."""
    s1 = (side + 4 - 11) // 4 + 1  # conv1 11×11, stride 4, pad 2
    s2 = (s1 - 3) // 2 + 1 if s1 >= 3 else 0  # pool, then conv2 keeps the side
    s3 = (s2 - 3) // 2 + 1 if s2 >= 3 else 0  # pool, then conv3-5 keep it
    return [s1, s2, s3]


def _check(spec: DataSpec, o: AlexOptions) -> str | None:
    problem = needs_image(spec, 1)
    if problem:
        return problem
    side = min(spec.input_shape[1:])
    if _stem(side, o.stem) == "imagenet" and min(_imagenet_sides(side)) < 3:
        return (
            f"the ImageNet stem (11×11/4 conv, 3×3/2 pools) needs images of at least "
            f"{IMAGENET_MIN_SIDE}×{IMAGENET_MIN_SIDE}, got {side}×{side}; set stem=small or auto"
        )
    return None


def _conv(c_in: int, c_out: int, k: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2, groups=groups), nn.ReLU()]


def build_alexnet(spec: DataSpec, o: AlexOptions) -> nn.Sequential:
    """(B, C, H, W) -> conv1..conv5 (B, c5, h, w) -> fc1 (B, hidden) -> fc2 -> fc3 (B, k)."""
    c_in, h, w = spec.input_shape
    c1, c2, c3, c4, c5 = channels(o.width)
    side = min(h, w)
    pools: list[list[nn.Module]] = []
    if _stem(side, o.stem) == "imagenet":
        first = [nn.Conv2d(c_in, c1, 11, stride=4, padding=2), nn.ReLU()]
        pools = [[nn.MaxPool2d(3, 2)] for _ in range(3)]
    else:
        first = _conv(c_in, c1, 3)
        for _ in range(3):
            pools.append([nn.MaxPool2d(2)] if side >= 2 else [])
            side = side // 2 if side >= 2 else side
    g = o.groups
    hidden = o.hidden or 4096 * o.width // 96
    layers: OrderedDict[str, nn.Module] = OrderedDict(
        conv1=nn.Sequential(*first, *pools[0]),
        conv2=nn.Sequential(*_conv(c1, c2, 5, groups=g), *pools[1]),
        conv3=nn.Sequential(*_conv(c2, c3, 3)),  # columns exchange: reads both halves
        conv4=nn.Sequential(*_conv(c3, c4, 3, groups=g)),
        conv5=nn.Sequential(*_conv(c4, c5, 3, groups=g), *pools[2]),
        fc1=nn.Sequential(
            nn.AdaptiveAvgPool2d(FC_MAP), nn.Flatten(), nn.Linear(c5 * FC_MAP**2, hidden), nn.ReLU()
        ),
        fc2=nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()),
        fc3=nn.Linear(hidden, spec.num_classes),
    )
    return nn.Sequential(layers)


@dataclass(frozen=True)
class ColumnLayer:
    """How one child of the AlexNet Sequential splits over the two columns.

    split: each column holds half of the layer's output channels ("out_channels", conv) or output
    neurons ("out_features", FC), i.e. rows [column_slice(n, c)] of the weight and bias.
    reads: "image" — the input, replicated to both columns; "own" — only its own column's half
    of the previous layer (no communication); "both" — the columns exchange (all-gather) their
    halves first and each column reads the whole previous layer.
    """

    child: str
    split: Literal["out_channels", "out_features"]
    reads: Literal["image", "own", "both"]


def alexnet_columns(model: nn.Sequential) -> tuple[ColumnLayer, ...]:
    """The two-column plan of an AlexNet built by this module.

    With groups=2 the columns exchange before conv3, fc1, fc2 and fc3 (as in the paper); with
    groups=1 conv2/4/5 read the whole previous layer too, so they exchange as well.
    """
    plan = []
    for name, child in model.named_children():
        if name == "conv1":
            plan.append(ColumnLayer(name, "out_channels", "image"))
        elif name.startswith("conv"):
            conv = next(m for m in child.modules() if isinstance(m, nn.Conv2d))
            grouped = conv.groups == 2
            plan.append(ColumnLayer(name, "out_channels", "own" if grouped else "both"))
        else:
            plan.append(ColumnLayer(name, "out_features", "both"))
    return tuple(plan)


def exchange_points(model: nn.Sequential) -> list[str]:
    """Children before which the two columns swap activations (conv3, fc1, fc2, fc3)."""
    return [layer.child for layer in alexnet_columns(model) if layer.reads == "both"]


def column_slice(n: int, column: int) -> slice:
    """Column 0 holds the first ⌈n/2⌉ rows, column 1 the rest (n is even for conv layers)."""
    half = (n + 1) // 2
    return slice(0, half) if column == 0 else slice(half, n)


register_model(
    ModelEntry(
        name="alexnet",
        description="AlexNet shape: 5 conv + 3 FC, grouped conv2/4/5 as in the two-column net",
        Options=AlexOptions,
        tasks=("classify",),
        factory=build_alexnet,
        default_dataset="synthetic-images",
        check=_check,
    )
)
