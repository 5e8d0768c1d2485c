"""`gnmt`: running seq2seq-lstm chunk by chunk over time (the wave-front's unit of work) gives
the whole-sequence forward and exactly its gradients (tier 1, one process); and on 2 ranks, one
LSTM layer each, it trains exactly like `layerwise` on the same model and cut (tier 3), which
itself equals single-process training (test_model_parallel)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import polytrain
from polytrain.data import DataSpec
from polytrain.models.seq2seq import Seq2SeqOptions, build_seq2seq
from polytrain.strategies.model.gnmt import lstm_partition
from polytrain.strategies.model.gnmt_chunks import Chunks, Ready, chunked
from tests.test_model_parallel import assert_same_run
from tests.test_model_parallel_refs import SEQ2SEQ, job


def _model(layers: int) -> torch.nn.Sequential:
    spec = DataSpec(name="toy", task="lm", input_shape=(11,), input_dtype="long", num_classes=13,
                    train_size=1, test_size=1)
    torch.manual_seed(0)
    return build_seq2seq(spec, Seq2SeqOptions(layers=layers, hidden=8))


@pytest.mark.parametrize("layers,per_side", [(2, 3), (3, 2), (1, 1)])
def test_chunked_execution_equals_whole_sequence(layers: int, per_side: int) -> None:
    model = _model(layers)
    x = torch.randint(0, 13, (4, 11))
    target = torch.randn(4, 5, 13)
    (model(x) * target).sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    chunks = Chunks(11, per_side)
    runners = [chunked(c, chunks) for c in model.children()]

    def chain(k: int, t: torch.Tensor | None, backward: bool) -> Ready:
        ready: Ready = [(k, t)]
        for r in reversed(runners) if backward else runners:
            ready = [o for j, u in ready for o in (r.backward(j, u) if backward else r.forward(j, u))]
        return ready

    logits = {}
    for k, (a, e) in enumerate(chunks.bounds):
        logits.update(dict(chain(k, x[:, a:e], backward=False)))
    s = chunks.split
    got = torch.cat([logits[k] for k in sorted(logits)], dim=1)
    torch.testing.assert_close(got, model(x).detach())
    for k in reversed(range(len(chunks.bounds))):
        a, e = chunks.bounds[k]
        chain(k, target[:, a - s : e - s] if k in logits else None, backward=True)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[n], msg=f"gradient of {n}")


def test_one_lstm_layer_per_stage() -> None:
    assert str(lstm_partition(_model(2))) == "2,2,1,2"  # embed+enc1 | enc2+bridge | dec1 | dec2+head
    assert str(lstm_partition(_model(3))) == "2,1,2,1,1,2"


@pytest.mark.slow
def test_gnmt_equals_layerwise(tmp_path: Path) -> None:
    # one LSTM layer per side: embed+enc1+bridge | dec1+head, for both strategies
    ref = tmp_path / "layerwise"
    polytrain.train(strategy="layerwise", procs=2, out=str(ref), **job(SEQ2SEQ, "partition=3,2"))
    out = tmp_path / "gnmt"
    summary = polytrain.train(strategy="gnmt", procs=2, out=str(out), **SEQ2SEQ)
    assert_same_run(out, ref)
    m = summary["strategy_metrics"]
    assert m["partition"]["text"] == "3,2"
    assert len(m["chunks"]) == 8  # 4 source + 4 target chunks of the 16 positions
    # every chunk of every step crosses the cut once forward, once backward: (B, 2, H) float32
    chunk = SEQ2SEQ["batch_size"] * 2 * 16 * 4
    ops = [rec["bytes_by_op"] for rec in summary["per_rank"]]
    assert ops[0]["activation"] == ops[1]["gradient"] == 3 * 8 * chunk
