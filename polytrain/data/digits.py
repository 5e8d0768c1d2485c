"""`digits`: scikit-learn's bundled 8×8 handwritten digits (1797 images, no download).

x: (N, 1, 8, 8) float32, pixels scaled to [0, 1] then standardised with ONE mean and std taken
from the training images (a per-pixel std would divide by zero on the always-blank corners).
The 1437/360 train/test split is a fixed permutation, the same for every job seed, so accuracy
numbers of different runs are comparable.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from polytrain.data.base import Dataset, DatasetEntry, DataSpec, generator, register_dataset

TRAIN, TEST = 1437, 360
_SPLIT_SEED = 881797  # fixed: the split never depends on the job seed


class DigitsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _spec(_: DigitsOptions) -> DataSpec:
    return DataSpec("digits", "classify", (1, 8, 8), "float", 10, TRAIN, TEST)


def _raw() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) in 0..16, labels (1797,)).

    Reads the CSV that scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``) directly:
    importing ``sklearn.datasets`` costs ~3 s per process, reading the file ~0.05 s. Falls back to
    ``load_digits`` if a scikit-learn version moves the file.
    """
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            table = np.loadtxt(path, delimiter=",")  # (1797, 65): 64 pixels then the label
            return table[:, :64].reshape(-1, 8, 8), table[:, 64]
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images, bunch.target


@functools.lru_cache(maxsize=1)
def _arrays() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    images, labels = _raw()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0  # (1797, 1, 8, 8)
    y = torch.tensor(labels, dtype=torch.int64)  # (1797,)
    perm = torch.randperm(x.shape[0], generator=generator(_SPLIT_SEED))
    x, y = x[perm], y[perm]
    x_train, x_test = x[:TRAIN], x[TRAIN : TRAIN + TEST]
    mean, std = x_train.mean(), x_train.std()
    return (x_train - mean) / std, y[:TRAIN], (x_test - mean) / std, y[TRAIN : TRAIN + TEST]


def _build(options: DigitsOptions, seed: int) -> Dataset:
    del seed  # fixed data: the seed changes nothing here
    x_train, y_train, x_test, y_test = (t.clone() for t in _arrays())  # callers may mutate
    return Dataset(_spec(options), x_train, y_train, x_test, y_test)


register_dataset(
    DatasetEntry(
        name="digits",
        description="scikit-learn's bundled 8×8 digits, 10 classes, 1437 train / 360 test",
        Options=DigitsOptions,
        build=_build,
        spec=_spec,
    )
)
