"""Factories, datasets and losses in the styles users write them (called by parameter name)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from polytrain.data import DataSpec


def make(num_classes: int = 10, width: int = 64) -> nn.Module:
    """The common way: a class count and a width, both with defaults."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))


def by_shape(in_channels: int, image_size: int, n_classes: int, *, hidden: int = 16) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size**2, hidden), nn.ReLU(),
                         nn.Linear(hidden, n_classes))


def by_features(in_features, out_features, depth=1):  # type: ignore[no-untyped-def]
    """No annotations: options are typed from the defaults."""
    layers: list[nn.Module] = [nn.Flatten()]
    for _ in range(depth - 1):
        layers += [nn.Linear(in_features, in_features), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(in_features, out_features))


def annotated(data: DataSpec, scale: float = 1.0) -> nn.Module:
    assert isinstance(scale, float)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, data.num_classes))


def per_row(num_classes: int = 10) -> nn.Module:
    """A Linear applied to each row of an 8x8 digit: its output is (B, 8, classes), not a vector."""
    return nn.Sequential(nn.Flatten(1, 2), nn.Linear(8, num_classes))


def with_shape(input_shape: tuple[int, ...], num_classes: int) -> list[nn.Module]:
    return [nn.Flatten(), nn.Linear(int(torch.Size(input_shape).numel()), num_classes)]


def lm(vocab_size: int, block_size: int, n_embd: int = 8) -> nn.Module:
    return nn.Sequential(nn.Embedding(vocab_size, n_embd), nn.Linear(n_embd, vocab_size))


def needs_secret(secret: int, num_classes: int = 10) -> nn.Module:
    return nn.Linear(secret, num_classes)


@dataclass
class NetConfig:
    num_classes: int = 3
    hidden: int = 32


class ConfigNet(nn.Module):
    def __init__(self, config: NetConfig) -> None:
        super().__init__()
        self.config = config
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, config.hidden), nn.ReLU())
        self.head = nn.Linear(config.hidden, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class DictNet(nn.Module):
    """Hugging Face style: forward(x, labels=None) -> {'logits', 'loss'}."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.fc(x.flatten(1))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


def wrong_classes() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 7))


class StringNet(nn.Module):
    def forward(self, x: torch.Tensor) -> str:
        return "not a tensor"


def smooth_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A user loss: label-smoothed cross-entropy."""
    return F.cross_entropy(output, target, label_smoothing=0.1)


def vector_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, target, reduction="none")


class Blobs(Dataset[tuple[torch.Tensor, int]]):
    """A map-style dataset: 4 Gaussian blobs in 8 dimensions, one (x, label) per index."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 4, (n,), generator=g)
        centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(99)) * 3
        self.x = centres[self.y] + torch.randn(n, 8, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], int(self.y[i])


def blobs(seed: int = 0, n: int = 96) -> tuple[Blobs, Blobs]:
    """(train, test) map-style datasets."""
    return Blobs(n, seed), Blobs(32, seed + 1)


def blob_tensors(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    ds = Blobs(n, 0)
    return ds.x, ds.y


def tokens(n: int = 32, t: int = 16) -> dict[str, object]:
    stream = torch.arange(n * t + 1) % 11
    x = torch.stack([stream[i * t : i * t + t] for i in range(n)])
    y = torch.stack([stream[i * t + 1 : i * t + t + 1] for i in range(n)])
    return {"x_train": x, "y_train": y, "x_test": x[:4], "y_test": y[:4]}


def blob_mlp(in_features: int, num_classes: int, hidden: int = 16) -> nn.Module:
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
