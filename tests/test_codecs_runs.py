"""Codecs where they apply: refusals before launch, training oracles, residuals across resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import polytrain
from polytrain.comm import Comm
from polytrain.comm import exchange as ex
from polytrain.comm.codecs.engine import DecodeError, Engine
from polytrain.comm.options import CodecOptions
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.metrics.recorder import Recorder
from tests.conftest import assert_same_params, load_model
from tests.test_resume_all import _cut_back as cut_back

SMALL = {"model": "mlp", "dataset": "digits", "batch_size": 32, "seed": 4, "optimizer": "sgd", "lr": 0.1}


@pytest.mark.parametrize("strategy,options,match", [
    ("malt", {"compression": "topk"}, r"does not support compression.*allreduce, local-sgd"),
    ("allreduce", {"compression": "zip"}, r"unknown codec 'zip'; valid: none, fp16"),
    ("allreduce", {"compression": "topk", "ratio": 0}, r"ratio must be in \(0, 1\]"),
    ("allreduce", {"compression": "threshold", "tau": -0.5}, "tau must be > 0"),
    ("local-sgd", {"compression": "powersgd"}, "only 'allreduce' runs"),
    ("allreduce", {"compression": "powersgd", "collective": "ring"}, "drop collective=ring"),
    ("ps", {"compression": "powersgd"}, "only 'allreduce' runs"),
    ("ps", {"compression": "ring"}, "unknown codec 'ring'"),
    ("ps", {"compression": "topk", "select": "tensor"}, "shard as one vector, so select=tensor"),
    ("allreduce", {"compression": "onebit", "select": "tensor"}, "select=tensor .* applies to topk and dgc"),
    ("allreduce", {"compression": "fp16", "ratio": 0.1}, r"ratio= is read only by compression=topk"),
    ("local-sgd", {"compression": "topk", "dgc_masking": False}, "dgc_masking= is read only by"),
    ("allreduce", {"entropy": "zstd"}, "entropy= is read only by .* not by compression=none"),
])
def test_bad_codec_options_are_refused_before_launch(strategy: str, options: dict[str, Any],
                                                     match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        prepare(make_config({"strategy": strategy, "procs": 2, "options": options}))


def test_a_message_that_does_not_decode_fails_naming_the_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine.from_options(CodecOptions(compression="topk", ratio=0.5), 1, 0, 0)
    items = [ex.Item(0, "fc1.weight", torch.randn(4, 3)), ex.Item(1, "fc1.bias", torch.randn(4))]
    real = ex.frame
    monkeypatch.setattr(ex, "frame", lambda msgs: real(msgs)[:-2])  # truncated on the wire
    with pytest.raises(DecodeError, match=r"rank 0 for parameters fc1.weight..fc1.bias.*nothing was applied"):
        ex.compressed_mean(engine, Comm(0, 1), items, rec=Recorder(0))
    monkeypatch.setattr(ex, "frame", real)
    msg = real([engine.encode(0, "fc1.weight", items[0].tensor, (4, 3))])
    with pytest.raises(DecodeError, match=r"parameter 'fc1.weight' from rank 1"):
        engine.decode(0, "fc1.weight", ex.unframe(msg, 1)[0][:-1], (4, 3), source=" from rank 1")


@pytest.mark.slow
def test_lossless_codecs_equal_uncompressed(tmp_path: Path) -> None:
    runs = {}
    for name, sets in [("none", []), ("fp16", ["compression=fp16"]),
                       ("topk1", ["compression=topk", "ratio=1.0", "collective=ring"]),
                       ("mesh-topk1", ["compression=topk", "ratio=1.0", "dp=2"])]:
        runs[name] = tmp_path / name
        polytrain.train(strategy="mesh" if name.startswith("mesh") else "allreduce", procs=2, steps=4,
                        out=str(runs[name]), sets=sets, **SMALL)
    ref = load_model(runs["none"])
    assert_same_params(load_model(runs["topk1"]), ref)  # float32 tolerance: sums in another order
    assert_same_params(load_model(runs["mesh-topk1"]), ref)  # mesh's dp dimension, same codec path
    assert_same_params(load_model(runs["fp16"]), ref, atol=2e-3, rtol=1e-2)  # fp16 rounding


@pytest.mark.slow
def test_ps_pushes_through_a_lossless_codec_equal_plain_pushes(tmp_path: Path) -> None:
    runs = {}
    for name, sets in [("none", []), ("topk1", ["compression=topk", "ratio=1.0", "entropy=zstd"])]:
        runs[name] = tmp_path / name
        s = polytrain.train(strategy="ps", procs=3, steps=4, out=str(runs[name]), sets=sets, **SMALL)
    assert s["strategy_metrics"]["codec"]["entropy"] and s["per_rank"][1]["bytes_by_op"]["ps_push"] > 0
    pulls = s["strategy_metrics"]["pull_codec"]  # the replies went through the codec as well
    assert pulls["dense_replies"] == 2 and pulls["payload_bytes"] != pulls["fp32_bytes"]
    assert_same_params(load_model(runs["topk1"]), load_model(runs["none"]), atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_topk_one_percent_with_error_feedback_keeps_accuracy(tmp_path: Path) -> None:
    """Within 1 point of uncompressed test accuracy in the same steps (SGD+momentum, 300 steps)."""
    acc = {}
    for name, sets in [("none", []), ("topk", ["compression=topk", "ratio=0.01"])]:
        s = polytrain.train(strategy="allreduce", procs=2, steps=300, out=str(tmp_path / name), sets=sets,
                            **{**SMALL, "lr": 0.05, "momentum": 0.9, "seed": 1})
        acc[name] = s["eval"]["accuracy"]
        if name == "topk":
            codec = s["strategy_metrics"]["codec"]
            assert codec["error_feedback"] and codec["ratio_vs_fp32"] > 40
    assert acc["none"] > 0.9 and acc["topk"] >= acc["none"] - 0.01, acc


@pytest.mark.slow
@pytest.mark.parametrize("strategy,procs,sets", [
    ("allreduce", 2, ["compression=topk", "ratio=0.05"]),
    ("local-sgd", 2, ["compression=onebit", "period=3"]),
    ("ps", 3, ["compression=dgc", "ratio=0.05"]),
    ("ps", 3, ["compression=topk", "ratio=0.05"]),  # compressed pulls: dense again after a checkpoint
])
def test_residuals_survive_checkpoint_and_resume(tmp_path: Path, strategy: str, procs: int,
                                                 sets: list[str]) -> None:
    """Cut a checkpointed run back to its step-3 checkpoint and resume: the same parameters (the
    residuals, dgc's velocity and local-sgd's anchor come back; without them the runs differ)."""
    full, part = tmp_path / "full", tmp_path / "part"
    polytrain.train(strategy=strategy, procs=procs, steps=6, checkpoint_every=3, out=str(full), sets=sets,
                    **SMALL)
    cut_back(full, part, 3)
    polytrain.train(resume=str(part))
    assert_same_params(load_model(part), load_model(full), atol=1e-6, rtol=1e-6)


def test_every_codec_option_names_the_codecs_that_read_it() -> None:
    """The refusal table covers every codec option and every codec, so a new one cannot slip
    through unchecked."""
    from polytrain.comm.codecs import SINGLE
    from polytrain.comm.options import OPTION_CODECS

    assert set(OPTION_CODECS) == set(CodecOptions.model_fields) - {"compression"}
    assert set(OPTION_CODECS["entropy"]) == set(SINGLE) | {"onebit-adam"}
    assert {c for users in OPTION_CODECS.values() for c in users} == set(SINGLE) | {"powersgd", "onebit-adam"}
