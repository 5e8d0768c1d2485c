"""`vgg16`: VGG-16's shape (13 conv + 3 FC), scaled by `width`, for image classification.

Convolutions: 3×3, channels (64, 64, M, 128, 128, M, 256×3, M, 512×3, M, 512×3, M) × width/64,
each with its ReLU (and the block's 2×2 max-pool) folded into one child, so layer-wise sharding
sees whole layers: children conv1_1 … conv5_3, fc1, fc2, fc3 (16 in all).

As in torchvision, fc1 starts with an adaptive average pool to 7×7, so fc1 is flatten(8w·7·7) →
hidden whatever the image side (a 32×32 image leaves a 1×1 map that is replicated to 7×7). That
keeps the defining property of VGG for parallelism experiments: the convolutions hold the compute
and fc1 holds about three quarters of the parameters.

Hidden width rule: ``hidden = √(conv parameters)`` rounded to a multiple of 8. With P conv
parameters, D = 392·w fc1 inputs and k classes, fc1's share D·h / (P + D·h + h² + h·k) is largest
at h = √P — and that is VGG-16's own choice (√14.7 M ≈ 3835 ≈ 4096). It gives fc1 ≈ 0.76 of all
parameters for any width (0.74 in the real network).

No dropout: strategies are compared against single-process training to float tolerance, and
dropout would make that depend on per-rank RNG streams. ``batch_norm=true`` is VGG-16-BN
(BatchNorm2d between each conv and its ReLU), for jobs that train with plain SGD + momentum.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from polytrain.data import DataSpec
from polytrain.models.basic import needs_image
from polytrain.models.registry import ModelEntry, register_model

# Output channels of each conv, in multiples of `width`; every block ends with a 2×2 max-pool.
BLOCKS: tuple[tuple[int, ...], ...] = ((1, 1), (2, 2), (4, 4, 4), (8, 8, 8), (8, 8, 8))
FC_MAP = 7  # fc1 sees an 8w × 7 × 7 map, as in VGG-16 on 224×224 images
MIN_SIDE = 2 ** len(BLOCKS)  # 32: five 2×2 poolings


class VggOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    width: int = Field(64, ge=1, description="first block's channels (64 in VGG-16)")
    image: int | None = Field(None, ge=1, description="input side (default: the dataset's)")
    adapt_pool: bool = Field(False, description="skip poolings that do not fit a small image")
    hidden: int | None = Field(None, ge=1, description="FC width (default: √(conv params))")
    batch_norm: bool = Field(False, description=(
        "VGG-16-BN: a BatchNorm2d after every convolution (torchvision's vgg16_bn); trains with "
        "plain SGD + momentum where the plain shape does not. Its statistics depend on each rank's "
        "batch, so strategies that split the batch no longer equal single-process training"))


def conv_parameters(width: int, in_channels: int) -> int:
    """Parameters of the 13 convolutions (weights + biases)."""
    total, c_in = 0, in_channels
    for block in BLOCKS:
        for mult in block:
            c_out = mult * width
            total += c_in * c_out * 9 + c_out
            c_in = c_out
    return total


def hidden_width(width: int, in_channels: int) -> int:
    """The FC width that maximises fc1's share of the parameters: √P to a multiple of 8."""
    return max(8, 8 * round(math.sqrt(conv_parameters(width, in_channels)) / 8))


def pooling_plan(side: int) -> list[bool]:
    """Which of the five poolings run: each halves the side; one that would go below 1 is
    skipped (only with adapt_pool; without it such images are refused)."""
    plan = []
    for _ in BLOCKS:
        plan.append(side >= 2)
        side = side // 2 if side >= 2 else side
    return plan


def _check(spec: DataSpec, o: VggOptions) -> str | None:
    problem = needs_image(spec, 1)
    if problem:
        return problem
    _, h, w = spec.input_shape
    if o.image is not None and (o.image != h or o.image != w):
        return f"option image={o.image} but the dataset's images are {h}×{w}; drop the option"
    if min(h, w) < MIN_SIDE and not o.adapt_pool:
        skipped = pooling_plan(min(h, w)).count(False)
        return (
            f"VGG-16 pools 5 times (÷32) and needs images of at least {MIN_SIDE}×{MIN_SIDE}, "
            f"got {h}×{w}; use a 32×32 dataset (synthetic-images) or set adapt_pool=true to "
            f"skip the {skipped} pooling(s) that do not fit"
        )
    return None


def _init(model: nn.Module) -> None:
    if next(model.parameters()).is_meta:
        return  # only counting: normal_ on meta loads torch's meta kernels (~2.5 s, once)
    # torchvision's VGG init: He for convs (no batch norm to rescue a bad start), small FC.
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)


def build_vgg16(spec: DataSpec, o: VggOptions) -> nn.Sequential:
    """(B, C, H, W) -> 13 conv children -> fc1 (B, hidden) -> fc2 (B, hidden) -> fc3 (B, k)."""
    c_in, h, w = spec.input_shape
    plan = iter(pooling_plan(min(h, w)))
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    channels = c_in
    for b, block in enumerate(BLOCKS, start=1):
        pool = next(plan)
        for i, mult in enumerate(block, start=1):
            parts: list[nn.Module] = [nn.Conv2d(channels, mult * o.width, 3, padding=1), nn.ReLU()]
            if o.batch_norm:
                parts.insert(1, nn.BatchNorm2d(mult * o.width))
            if pool and i == len(block):
                parts.append(nn.MaxPool2d(2))
            layers[f"conv{b}_{i}"] = nn.Sequential(*parts)
            channels = mult * o.width
    hidden = o.hidden or hidden_width(o.width, c_in)
    layers["fc1"] = nn.Sequential(
        nn.AdaptiveAvgPool2d(FC_MAP),
        nn.Flatten(),
        nn.Linear(channels * FC_MAP * FC_MAP, hidden),
        nn.ReLU(),
    )
    layers["fc2"] = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU())
    layers["fc3"] = nn.Linear(hidden, spec.num_classes)
    model = nn.Sequential(layers)
    _init(model)
    return model


register_model(
    ModelEntry(
        name="vgg16",
        description="VGG-16 shape: 13 conv + 3 FC, fc1 ≈ 3/4 of the parameters; width=8 is small",
        Options=VggOptions,
        tasks=("classify",),
        factory=build_vgg16,
        default_dataset="synthetic-images",
        check=_check,
    )
)
