"""Built-in datasets (no downloads; every tensor in memory; deterministic for a seed).

==================  ========  ======================  =======================================
name                task      x per sample            source
==================  ========  ======================  =======================================
digits (default)    classify  (1, 8, 8) float         scikit-learn's bundled 8×8 digits
synthetic-images    classify  (C, H, W) float         smooth noise, fixed random conv teacher
chars               lm        (T,) long               Python's stdlib source, bytes or chars
sparse-bow          classify  (F,) float counts       ~nnz features/sample, sparse teacher
bow-ids             classify  (nnz,) long ids         Zipf ids of a 100k vocabulary, teacher
==================  ========  ======================  =======================================

Importing this package only registers the entries; data is built by :func:`load_dataset`.
"""

from polytrain.data import bow_ids, chars, digits, synthetic  # noqa: F401  (registers the datasets)
from polytrain.data.base import (
    DATASETS,
    Dataset,
    DatasetEntry,
    DataSpec,
    dataset_names,
    parse_options,
    register_dataset,
    validate_dataset_options,
)
from polytrain.data.resolve import dataset_spec, load_dataset
from polytrain.data.tasks import task_correct, task_loss

__all__ = [
    "DATASETS",
    "DataSpec",
    "Dataset",
    "DatasetEntry",
    "dataset_names",
    "dataset_spec",
    "load_dataset",
    "parse_options",
    "register_dataset",
    "task_correct",
    "task_loss",
    "validate_dataset_options",
]
