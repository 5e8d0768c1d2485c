"""Shared single-process references for the model-parallel and hybrid tests (no tests here).

Every launch costs 10-20 s of start-up on a loaded 2-core machine, so each reference job runs
once per pytest session and is reused by every module that trains the same network.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import polytrain

GPT = {"model": "gpt-mini", "dataset": "chars", "steps": 3, "batch_size": 8, "optimizer": "sgd",
       "lr": 0.1, "seed": 1,
       "sets": ["model.n_layer=1", "model.d_model=32", "model.n_head=4", "data.chars=20000"]}
ALEXNET = {"model": "alexnet", "dataset": "digits", "steps": 3, "batch_size": 15, "optimizer": "sgd",
           "lr": 0.05, "seed": 2, "sets": ["model.width=12", "model.hidden=48"]}
MLP = {"model": "mlp", "dataset": "digits", "steps": 3, "batch_size": 16, "optimizer": "sgd",
       "lr": 0.1, "seed": 3, "sets": ["model.depth=3", "model.hidden=32"]}
SEQ2SEQ = {"model": "seq2seq-lstm", "dataset": "chars", "steps": 3, "batch_size": 8,
           "optimizer": "sgd", "lr": 0.5, "seed": 4,
           "sets": ["model.layers=1", "model.hidden=16", "data.seq_len=16", "data.chars=20000"]}

_DONE: dict[str, Path] = {}


def job(base: dict[str, Any], *extra_sets: str, **changes: Any) -> dict[str, Any]:
    """``base`` with more --set pairs and changed fields (a fresh dict)."""
    out = {**base, **changes}
    out["sets"] = [*base.get("sets", []), *extra_sets]
    return out


def single_reference(factory: pytest.TempPathFactory, cfg: dict[str, Any]) -> Path:
    """The run directory of ``single`` on ``cfg`` (run once per session)."""
    key = json.dumps(cfg, sort_keys=True)
    if key not in _DONE:
        out = factory.mktemp("single-ref") / "run"
        polytrain.train(strategy="single", procs=1, out=str(out), **cfg)
        _DONE[key] = out
    return _DONE[key]
