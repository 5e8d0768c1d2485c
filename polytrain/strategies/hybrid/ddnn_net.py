"""The DDNN network (Teerapittayanon et al. 2017) and its exit rule — no processes here.

E end devices each see one vertical strip of the image (a "view"; DDNN's multi-camera setting)::

    device e   view (B, C, H, w_e) ─ conv3×3 C→c, ReLU ─ f_e (B, c, H, w_e)
               └ device exit: avgpool 2×2, Linear → scores s_e (B, k)
    local exit mean (or max) of the devices' scores        (computed by the local aggregator)
    edge       cat f_e along the width (B, c, H, W) ─ conv3×3 c→2c, ReLU, maxpool 2 ─ g (B, 2c, H/2, W/2)
               └ edge exit: avgpool 2×2, Linear → (B, k)
    cloud      conv3×3 2c→4c, ReLU, avgpool 2×2, Linear(16c → hidden), ReLU, Linear → (B, k)

Training minimises w_local·CE(local) + w_edge·CE(edge) + w_cloud·CE(cloud). At inference a
sample leaves at the first exit whose normalised entropy H(softmax)/log k is below the threshold
(0: never exit early; 1: exit at once, all but exactly uniform predictions). A missing device
contributes no score to the local exit and a zero strip to the edge, as in the paper.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from polytrain.data import DataSpec
from polytrain.strategies.model.shard_collectives import shard_bounds

TIERS = ("local", "edge", "cloud")


def strips(width: int, devices: int) -> list[tuple[int, int]]:
    """Column range [a, b) of the image each device sees."""
    return shard_bounds(width, devices)


def _exit_head(channels: int, classes: int) -> nn.Sequential:
    return nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4 * channels, classes))


class Device(nn.Module):
    """(B, C, H, w) -> features (B, c, H, w), scores (B, k)."""

    def __init__(self, c_in: int, c: int, classes: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU())
        self.exit = _exit_head(c, classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.conv(x)
        return f, self.exit(f)


class Edge(nn.Module):
    """(B, c, H, W) -> features (B, 2c, H/2, W/2), logits (B, k)."""

    def __init__(self, c: int, classes: int, pool: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU()]
        if pool:
            layers.append(nn.MaxPool2d(2))
        self.conv = nn.Sequential(*layers)
        self.exit = _exit_head(2 * c, classes)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.conv(h)
        return g, self.exit(g)


def cloud_net(c: int, hidden: int, classes: int) -> nn.Sequential:
    """(B, 2c, h, w) -> logits (B, k)."""
    return nn.Sequential(nn.Conv2d(2 * c, 4 * c, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten(), nn.Linear(16 * c, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def build_ddnn(spec: DataSpec, devices: int, channels: int, hidden: int) -> nn.ModuleDict:
    """The whole network (each tier takes its part); children ``device{e}``, ``edge``, ``cloud``."""
    c_in, h, w = spec.input_shape
    k = spec.num_classes
    parts: dict[str, nn.Module] = {f"device{e}": Device(c_in, channels, k) for e in range(devices)}
    parts["edge"] = Edge(channels, k, pool=min(h, w) >= 2)
    parts["cloud"] = cloud_net(channels, hidden, k)
    return nn.ModuleDict(parts)


def aggregate(scores: list[torch.Tensor], how: str) -> torch.Tensor:
    """The local aggregator: (B, k) scores of the present devices -> (B, k)."""
    stacked = torch.stack(scores)  # (E, B, k)
    return stacked.max(dim=0).values if how == "max" else stacked.mean(dim=0)


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(softmax(logits)) / log k per sample, in [0, 1]: (B, k) -> (B,)."""
    logp = logits.log_softmax(dim=-1)
    return -(logp.exp() * logp).sum(dim=-1) / math.log(logits.shape[-1])


def exits_here(logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """Which samples leave at this exit: normalised entropy strictly below ``threshold``."""
    return normalized_entropy(logits) < threshold
