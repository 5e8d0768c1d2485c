"""Model zoo. Every model is an ``nn.Sequential`` of its ordered layers, each child mapping one
tensor to one tensor, so any strategy can cut it between children.

==============  ========  =============================================================
name            task      shape
==============  ========  =============================================================
mlp             classify  flatten, depth × Linear/ReLU, Linear (any float input)
cnn             classify  2 conv + 2 FC (images; the default on digits)
vgg16           classify  13 conv + 3 FC, fc1 ≈ 3/4 of the parameters (images ≥ 32×32)
alexnet         classify  5 conv + 3 FC, grouped conv2/4/5 = the paper's two columns
gpt-mini        lm        embed, n_layer pre-LN transformer blocks, LN + head: (B, T, V)
seq2seq-lstm    lm        GNMT-like encoder/decoder LSTM, predicts the second half: (B, T//2, V)
sparse-bow      classify  EmbeddingBag over a 100k-id vocabulary + MLP (bow-ids)
==============  ========  =============================================================

A user model is ``pkg.module:factory`` (see :mod:`polytrain.models.user`).
"""

from polytrain.models import alexnet, basic, gpt, seq2seq, sparse_bow, vgg  # noqa: F401  (registers models)
from polytrain.models.alexnet import ColumnLayer, alexnet_columns, column_slice, exchange_points
from polytrain.models.registry import (
    MODELS,
    ModelEntry,
    build_model,
    count_parameters,
    describe_models,
    is_user_model,
    model_names,
    parameter_count,
    register_model,
    resolve_model,
    validate_model,
)
from polytrain.models.user import load_user_model

__all__ = [
    "MODELS",
    "ColumnLayer",
    "ModelEntry",
    "alexnet_columns",
    "build_model",
    "column_slice",
    "count_parameters",
    "describe_models",
    "exchange_points",
    "is_user_model",
    "load_user_model",
    "model_names",
    "parameter_count",
    "register_model",
    "resolve_model",
    "validate_model",
]
