"""``--precision fp32|bf16|fp16`` (issue 45 item 1): autocast with fp32 master weights; fp16's
loss scaler skips (and counts) a step whose gradient overflowed, and the run goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import polytrain
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.runtime.precision import Precision
from tests.userzoo.overflow import make


def test_fp16_scaler_skips_an_overflowed_step_and_recovers() -> None:
    torch.manual_seed(0)
    model = make(inf_at=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = Precision("fp16", torch.device("cpu"))
    x, y = torch.randn(8, 8, 8), torch.randint(0, 10, (8,))
    done, before = [], []
    for _ in range(5):
        opt.zero_grad()
        with amp.autocast():
            out = model(x)
            assert out.dtype == torch.float16  # the compute dtype
            loss = nn.functional.cross_entropy(out, y)
        amp.backward(loss)
        amp.unscale(opt)
        before.append([p.detach().clone() for p in model.parameters()])
        done.append(amp.step(opt))
        assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights
    assert done == [True, True, False, True, True] and amp.skipped == 1
    assert amp.metrics()["fp16_loss_scale"] == 65536.0 / 2
    after_skip = [p.detach() for p in model.parameters()]
    assert all(torch.isfinite(p).all() for p in after_skip)
    # the skipped step (3) left the weights as they were; step 4 moved them again
    assert all(torch.equal(a, b) for a, b in zip(before[2], before[3], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(before[3], before[4], strict=True))
    state = amp.state()
    again = Precision("fp16", torch.device("cpu"))
    again.load_state(state)
    assert again.scaler is not None and again.scaler.get_scale() == 65536.0 / 2 and again.skipped == 1


def test_precision_refused_where_not_honoured() -> None:
    with pytest.raises(ConfigError, match=r"does not support precision \(--precision bf16\).*"
                                          r"that does: 1f1b, allreduce, fsdp, gpipe, .*local-sgd, "
                                          r"mesh, .*tensor, zero"):
        prepare(make_config({"strategy": "pipedream", "procs": 2, "model": "mlp", "precision": "bf16"}))
    with pytest.raises(ConfigError, match="'precision' = 'fp8'"):
        make_config({"precision": "fp8"})


@pytest.mark.slow
def test_fp16_run_counts_the_injected_overflow(tmp_path: Path) -> None:
    out = tmp_path / "fp16"
    summary = polytrain.train(strategy="single", procs=1, model="tests.userzoo.overflow:make",
                              precision="fp16", steps=8, batch_size=32, lr=0.01, out=str(out))
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    skipped = [e["step"] for e in events if e["event"] == "skipped"]
    assert 3 in skipped and summary["steps"] == 8
    metrics = summary["strategy_metrics"]
    assert metrics["precision"] == "fp16" and metrics["fp16_skipped_steps"] == len(skipped)


@pytest.mark.slow
def test_bf16_default_job_reaches_its_accuracy(tmp_path: Path) -> None:
    """The default job (cnn on digits, allreduce on 2 processes, 300 steps) in bf16."""
    summary = polytrain.train(precision="bf16", out=str(tmp_path / "bf16"))
    assert summary["strategy_metrics"]["precision"] == "bf16"
    assert summary["eval"]["accuracy"] >= 0.95


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU: --device cuda is valid")
def test_device_cuda_refused_where_there_is_none() -> None:
    with pytest.raises(ConfigError, match=r"--device cuda: no CUDA device is visible.*--device cpu"):
        prepare(make_config({"strategy": "single", "procs": 1, "device": "cuda"}))
    with pytest.raises(ConfigError, match="'device' = 'tpu'"):
        make_config({"device": "tpu"})
