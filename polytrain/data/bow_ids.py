"""`bow-ids`: sparse bag-of-features classification as feature *ids*, for embedding models.

A vocabulary of ``features`` ids (default 100,000) has Zipf frequencies, id 0 the most frequent
(as in a vocabulary sorted by frequency). A fixed random split (seeded from a constant: the same
task for every job seed) gives every class an equal share of the ids as its *keywords*. A sample
of class y (uniform) is ``nnz`` ids: each, with probability ``signal``, a keyword of y drawn
with Zipf frequencies among y's keywords, else a background id drawn from the whole vocabulary.
Frequent keywords are seen often enough to be learnt; the long tail mostly is not, and a sample
may hold no keyword at all, which is what keeps accuracy below 1.

x: (N, nnz) int64 ids in [0, features) — what ``nn.EmbeddingBag`` takes; y: (N,) int64.
A batch of B samples touches at most B·nnz of an embedding's rows (with the defaults and B=64,
~800 of 100,000: under 1 %), so an embedding's gradient is row-sparse: the workload of the
``hybrid-ps-ar`` strategy and of the `sparse-bow` model.

Measured (seed 0, `sparse-bow` model defaults, plain SGD lr 0.5, batch 64): test accuracy 0.51
after 100 steps, 0.60 after 200, 0.65 after 400 (lr 0.1: 0.51 after 400); chance is 0.125.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from polytrain.data.base import Dataset, DatasetEntry, DataSpec, generator, register_dataset

_KEYWORD_SEED = 16_180
_TRAIN_STREAM, _TEST_STREAM = 1, 2


class BowIdsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    features: int = Field(100_000, ge=2, le=50_000_000, description="vocabulary size (id range)")
    classes: int = Field(8, ge=2, le=1000)
    nnz: int = Field(20, ge=1, le=10_000, description="feature ids per sample")
    skew: float = Field(1.0, ge=0.0, le=3.0, description="Zipf exponent (0: uniform ids)")
    signal: float = Field(0.25, ge=0.0, le=1.0, description="chance that an id is a class keyword")
    train: int = Field(16_384, ge=1)
    test: int = Field(2048, ge=1)


def _zipf(n: int, size: int, skew: float, g: torch.Generator) -> torch.Tensor:
    """(size,) ranks in [0, n) with P(r) ∝ (r + 1)^-skew, by inverse-CDF sampling."""
    cdf = torch.arange(1, n + 1, dtype=torch.float64).pow(-skew).cumsum(0)
    u = torch.rand(size, generator=g, dtype=torch.float64) * cdf[-1]
    return torch.searchsorted(cdf, u).clamp_(max=n - 1)


def _keywords(o: BowIdsOptions) -> torch.Tensor:
    """(classes, features // classes): class c's keyword ids, most frequent first."""
    g = generator(_KEYWORD_SEED, o.features, o.classes)
    per = o.features // o.classes
    ids = torch.randperm(o.features, generator=g)[: per * o.classes].view(o.classes, per)
    return ids.sort(dim=1).values


def _samples(o: BowIdsOptions, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (n, nnz) ids, y (n,) classes)."""
    keywords = _keywords(o)
    y = torch.randint(o.classes, (n,), generator=g)
    background = _zipf(o.features, n * o.nnz, o.skew, g).view(n, o.nnz)
    rank = _zipf(keywords.shape[1], n * o.nnz, o.skew, g).view(n, o.nnz)
    keyword = keywords[y.unsqueeze(1), rank]  # (n, nnz)
    is_keyword = torch.rand(n, o.nnz, generator=g) < o.signal
    return torch.where(is_keyword, keyword, background), y


def _spec(o: BowIdsOptions) -> DataSpec:
    return DataSpec("bow-ids", "classify", (o.nnz,), "long", o.classes, o.train, o.test,
                    input_range=o.features)


def _build(o: BowIdsOptions, seed: int) -> Dataset:
    if o.features < o.classes:
        from polytrain.errors import ConfigError

        raise ConfigError(f"bow-ids needs features >= classes (got {o.features} < {o.classes}): "
                          "every class needs at least one keyword. Raise features.")
    x_train, y_train = _samples(o, o.train, generator(seed, _TRAIN_STREAM))
    x_test, y_test = _samples(o, o.test, generator(seed, _TEST_STREAM))
    return Dataset(_spec(o), x_train, y_train, x_test, y_test)


register_dataset(
    DatasetEntry(
        name="bow-ids",
        description="bags of nnz feature ids (Zipf over 100k features), class keywords + noise",
        Options=BowIdsOptions,
        build=_build,
        spec=_spec,
    )
)
