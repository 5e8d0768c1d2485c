"""The Python API takes objects: a model instance, an in-memory dataset and a loss function, sent
to the ranks (pickled, or imported by name), each refused before launch when it cannot be sent."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import polytrain
from polytrain.errors import ConfigError
from tests.conftest import assert_same_params, load_model


def summed_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="mean") * 2.0


def _data() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    y = (x[:, 0] > 0).long()
    return x[:64], y[:64], x[64:], y[64:]


@pytest.mark.slow
def test_model_instance_dataset_and_loss_objects_equal_single(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    job = {"model": net, "dataset": _data(), "loss": summed_loss, "steps": 3, "batch_size": 16,
           "optimizer": "sgd", "lr": 0.1}
    one = polytrain.train(strategy="single", procs=1, out=str(tmp_path / "one"), **job)
    two = polytrain.train(strategy="allreduce", procs=2, out=str(tmp_path / "two"), **job)
    assert one["config"]["model"] == "polytrain.memory:load_model"
    assert two["config"]["loss"].endswith("test_api_objects:summed_loss")
    assert_same_params(load_model(tmp_path / "two"), load_model(tmp_path / "one"))
    # the instance's own weights are what training started from: model.pt keys are its keys
    assert set(load_model(tmp_path / "one")) == set(net.state_dict())


def test_objects_that_cannot_be_sent_are_refused_before_launch(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"loss function .* module-level"):
        polytrain.train(model="mlp", loss=lambda o, y: o.sum(), out=str(tmp_path / "a"))
    held = nn.Linear(2, 2)
    held.lock = threading.Lock()  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"model given as a Linear cannot be sent.*pickling"):
        polytrain.train(model=held, out=str(tmp_path / "b"))
