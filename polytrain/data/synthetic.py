"""Generated classification data: `synthetic-images` and `sparse-bow`.

Both label their samples with a fixed random *teacher* (seeded from a constant, so the task is the
same for every job seed) while the samples themselves come from the job seed. A student model can
therefore learn the teacher and test accuracy measures something real.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from polytrain.data.base import DataSpec, Dataset, DatasetEntry, generator, register_dataset

_IMAGE_TEACHER_SEED = 31_337
_BOW_TEACHER_SEED = 27_182
_TRAIN_STREAM, _TEST_STREAM, _CALIBRATION_STREAM = 1, 2, 3


# --------------------------------------------------------------------------- synthetic-images


class ImageOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    channels: int = Field(3, ge=1, le=64)
    size: int = Field(32, ge=2, le=512, description="image side (square images)")
    classes: int = Field(10, ge=2, le=1000)
    train: int = Field(4096, ge=1)
    test: int = Field(1024, ge=1)


class _ImageTeacher:
    """A fixed random conv net: average-pool to ≤8×8 → conv3×3(C→16)/ReLU → pool to ≤4×4 → linear.

    Pooling first puts the signal in coarse structure that a small CNN (or an MLP) can learn from a
    few thousand samples. The logits are standardised per class on a fixed calibration set, so
    ``argmax`` gives roughly balanced classes instead of one class winning most of the time.
    """

    def __init__(self, opts: ImageOptions) -> None:
        g = generator(_IMAGE_TEACHER_SEED, opts.channels, opts.size, opts.classes)
        self.side1, self.side2 = min(opts.size, 8), min(opts.size, 4)
        self.w1 = torch.randn(16, opts.channels, 3, 3, generator=g) / math.sqrt(9 * opts.channels)
        self.b1 = 0.1 * torch.randn(16, generator=g)
        fan_in = 16 * self.side2 * self.side2
        self.w2 = torch.randn(opts.classes, fan_in, generator=g) / math.sqrt(fan_in)
        self.mean = torch.zeros(opts.classes)
        self.std = torch.ones(opts.classes)
        shape = (2048, opts.channels, opts.size, opts.size)
        calib = self.logits(torch.randn(shape, generator=g))  # (2048, classes)
        self.mean, self.std = calib.mean(0), calib.std(0) + 1e-6

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        h = F.adaptive_avg_pool2d(x, self.side1) * (x.shape[-1] / self.side1)  # keep unit scale
        h = F.relu(F.conv2d(h, self.w1, self.b1, padding=1))  # (N, 16, s1, s1)
        h = F.adaptive_avg_pool2d(h, self.side2).flatten(1)  # (N, 16·s2·s2)
        return (h @ self.w2.T - self.mean) / self.std  # (N, classes)

    def label(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.logits(c).argmax(1) for c in x.split(4096)])


def _image_spec(o: ImageOptions) -> DataSpec:
    shape = (o.channels, o.size, o.size)
    return DataSpec("synthetic-images", "classify", shape, "float", o.classes, o.train, o.test)


def _image_build(o: ImageOptions, seed: int) -> Dataset:
    teacher = _ImageTeacher(o)
    shape = (o.channels, o.size, o.size)
    x_train = torch.randn((o.train, *shape), generator=generator(seed, _TRAIN_STREAM))
    x_test = torch.randn((o.test, *shape), generator=generator(seed, _TEST_STREAM))
    return Dataset(_image_spec(o), x_train, teacher.label(x_train), x_test, teacher.label(x_test))


register_dataset(
    DatasetEntry(
        name="synthetic-images",
        description="N(0,1) images (default 3×32×32) labelled by a fixed random conv teacher",
        Options=ImageOptions,
        build=_image_build,
        spec=_image_spec,
    )
)


# --------------------------------------------------------------------------------- sparse-bow


class BowOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    features: int = Field(2000, ge=2, le=1_000_000)
    classes: int = Field(8, ge=2, le=1000)
    nnz: int = Field(10, ge=1, description="feature draws per sample (duplicates add up)")
    train: int = Field(8192, ge=1)
    test: int = Field(2048, ge=1)


def _bow_teacher(o: BowOptions) -> torch.Tensor:
    """(classes, features) sparse weights: each feature votes for one class (round-robin, so the
    classes are balanced) with a strength in [0.5, 1.5)."""
    g = generator(_BOW_TEACHER_SEED, o.features, o.classes)
    owner = torch.randperm(o.features, generator=g) % o.classes  # (F,) class of each feature
    strength = 0.5 + torch.rand(o.features, generator=g)
    weight = torch.zeros(o.classes, o.features)
    weight[owner, torch.arange(o.features)] = strength
    return weight


def _bow_samples(o: BowOptions, n: int, g: torch.Generator) -> torch.Tensor:
    """(n, features) float counts; each row touches at most ``nnz`` features (Hogwild-sparse)."""
    idx = torch.randint(o.features, (n, o.nnz), generator=g)
    counts = torch.randint(1, 4, (n, o.nnz), generator=g, dtype=torch.float32)
    return torch.zeros(n, o.features).scatter_add_(1, idx, counts)


def _bow_spec(o: BowOptions) -> DataSpec:
    return DataSpec("sparse-bow", "classify", (o.features,), "float", o.classes, o.train, o.test)


def _bow_build(o: BowOptions, seed: int) -> Dataset:
    weight = _bow_teacher(o)
    x_train = _bow_samples(o, o.train, generator(seed, _TRAIN_STREAM))
    x_test = _bow_samples(o, o.test, generator(seed, _TEST_STREAM))
    y_train, y_test = (x_train @ weight.T).argmax(1), (x_test @ weight.T).argmax(1)
    return Dataset(_bow_spec(o), x_train, y_train, x_test, y_test)


register_dataset(
    DatasetEntry(
        name="sparse-bow",
        description="bag-of-words counts, ~nnz of 2000 features per sample, sparse linear teacher",
        Options=BowOptions,
        build=_bow_build,
        spec=_bow_spec,
    )
)
