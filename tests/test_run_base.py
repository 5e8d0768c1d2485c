"""Tier 1: one base under every app (issue 43, items 3 and 5).

* a run's summary.json is a typed model: written and read through it, every key kept, a
  malformed one (or one of another schema version) refused with one line naming file and field;
* ``polytrain rl`` and ``polytrain aco`` parse their jobs through one config base (one error
  style), and every checkpoint — training's, rl's dqn and an apex/gorila cut — is one
  CheckpointStore's, written and verified by the same code, so a crafted file is refused alike.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from polytrain.aco.config import ACOConfig
from polytrain.errors import ConfigError
from polytrain.metrics.summary import (
    SCHEMA_VERSION,
    ACOSummary,
    RLSummary,
    TrainSummary,
    read_summary,
)
from polytrain.rl import checkpoint as dqn_checkpoint
from polytrain.rl import snapshot
from polytrain.rl.config import make_rl_config
from polytrain.rl.resume import resume_point
from polytrain.runtime.checkpoint import CheckpointStore

# a train summary as rank 0 writes it (launch/rundir.build_summary), plus a key a caller adds
TRAIN: dict[str, Any] = {
    "strategy": "allreduce", "world_size": 2, "steps": 4, "steps_run": 4, "interrupted": None,
    "stopped": {"reason": "completed"}, "skipped_steps": [], "divergence_warnings": [],
    "resumes": [], "segments": [{"from_step": 1, "to_step": 4, "wall_s": 0.5, "samples": 256,
                                 "bytes_sent": 1000, "throughput_samples_per_s": 512.0}],
    "samples": 256, "wall_s": 0.5, "throughput_samples_per_s": 512.0, "final_loss": 0.25,
    "eval": {"accuracy": 0.9, "loss": 0.3}, "bytes_sent": 1000, "bytes_sent_per_sample": 3.9,
    "peak_rss_bytes": 1 << 28, "per_rank": [{"rank": 0, "steps": 4}, {"rank": 1, "steps": 4}],
    "strategy_metrics": {"buckets": 1}, "config": {"strategy": "allreduce", "procs": 2},
    "model_call": None, "testbed": None, "prediction": {"step_s": 0.1}, "backend": "gloo",
    "precision": "fp32", "device": "cpu", "polytrain_version": "0.1", "torch_version": "2.13.0",
    "time_to_accuracy_s": 1.5,
}
# the launcher's summary of a failed run: fewer keys, and those it lacks must stay absent
STOPPED = {"strategy": "allreduce", "world_size": 2, "steps": 4, "steps_run": 2, "samples": 128,
           "final_loss": None, "interrupted": None, "stopped": {"reason": "failed", "after_step": 2},
           "divergence_warnings": [], "config": {"strategy": "allreduce"}}


@pytest.mark.parametrize("data", [TRAIN, STOPPED], ids=["rank0", "launcher"])
def test_a_summary_round_trips_every_key_through_its_model(tmp_path: Path, data: dict[str, Any]) -> None:
    TrainSummary.of(data).write(tmp_path)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == {**data, "schema_version": SCHEMA_VERSION}
    read = read_summary(tmp_path, TrainSummary)
    assert read.to_dict() == on_disk
    assert read.world_size == 2 and read.final_loss == data["final_loss"]
    assert (read.eval or {}).get("accuracy") == data.get("eval", {}).get("accuracy")


def _write(tmp_path: Path, data: Any) -> Path:
    (tmp_path / "summary.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize(("kind", "data", "needle"), [
    (TrainSummary, {**TRAIN, "steps": "four"}, "field 'steps' is malformed"),
    (TrainSummary, {**TRAIN, "eval": [0.9]}, "field 'eval' is malformed"),
    (TrainSummary, {k: v for k, v in TRAIN.items() if k != "strategy"}, "lacks required key 'strategy'"),
    (TrainSummary, {**TRAIN, "schema_version": 0}, "field 'schema_version' is 0; this polytrain reads"),
    (TrainSummary, [TRAIN], "must be a JSON object"),
    (RLSummary, {"strategy": "apex", "algo": "apex", "env": "CartPole-v1", "world_size": 4,
                 "env_steps": "many", "episodes": 3, "config": {}}, "field 'env_steps' is malformed"),
    (ACOSummary, {"instance": "berlin52", "n": 52, "variant": "mmas", "procs": 1, "best_length": 7542,
                  "best_tour": "0 1 2", "iterations": 3, "tours": 75, "config": {}},
     "field 'best_tour' is malformed"),
])
def test_a_malformed_summary_is_refused_with_one_line(tmp_path: Path, kind: Any, data: Any,
                                                       needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        read_summary(_write(tmp_path, data), kind)
    text = str(err.value)
    assert needle in text and str(tmp_path / "summary.json") in text and "\n" not in text, text


def test_rl_and_aco_jobs_are_refused_by_one_config_base() -> None:
    with pytest.raises(ConfigError, match=r"^Invalid RL job: unknown option 'actor'\..*'actors'"):
        make_rl_config({"actor": 3})
    with pytest.raises(ConfigError, match=r"^Invalid aco job: unknown option 'antz'\..*'ants'"):
        ACOConfig.from_dict({"antz": 3})
    with pytest.raises(ConfigError, match=r"^Invalid aco job: --ants = 'many': Input should be"):
        ACOConfig.from_dict({"ants": "many"})
    with pytest.raises(ConfigError, match=r"^Invalid RL job: --hidden = 'wide': Input should be"):
        make_rl_config({"hidden": "wide"})
    cfg = ACOConfig.from_dict({"tsp": "random:30", "procs": 2})
    assert ACOConfig.from_dict(cfg.to_dict()) == cfg  # a rank re-reads its launcher's job


class _Code:
    """Pickles to a call: what a crafted checkpoint would run if it were unpickled in full."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (print, ("unpickled",))


def _plant(ckpt: Path) -> None:
    """A crafted rank0.pt in ``ckpt``, with the SHA-256 its manifest lists made to match."""
    torch.save({"net": _Code()}, ckpt / "rank0.pt")  # torch's own file format, a call inside
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    manifest["files"]["rank0.pt"] = hashlib.sha256((ckpt / "rank0.pt").read_bytes()).hexdigest()
    (ckpt / "MANIFEST.json").write_text(json.dumps(manifest))


def test_every_checkpoint_is_written_and_refused_by_the_same_store(tmp_path: Path) -> None:
    """dqn's checkpoint and an apex/gorila cut live in training's CheckpointStore layout: the
    same commit (manifest, LATEST), the same verification, the same refusal of a crafted file."""
    state = {"updates": 3, "net": {"w": torch.ones(2)}}
    dqn, apex = tmp_path / "dqn", tmp_path / "apex"
    cfgs = {dqn: make_rl_config({"algo": "dqn", "out": str(dqn)}),
            apex: make_rl_config({"algo": "apex", "out": str(apex)})}
    dqn_checkpoint.save(dqn, cfgs[dqn], {**state, "env_steps": 10, "t": 1.0})
    snapshot.write_part(apex, cfgs[apex], 0, 1, state)
    snapshot.seal(apex, cfgs[apex], {"save": 1, "env_steps": 10, "t": 1.0, "updates": 3})
    assert resume_point(dqn, cfgs[dqn])["env_steps"] == resume_point(apex, cfgs[apex])["env_steps"] == 10
    assert torch.equal(dqn_checkpoint.load_part(apex, cfgs[apex], 0)["net"]["w"], torch.ones(2))
    for run in (dqn, apex):
        assert (run / "checkpoints" / "LATEST").read_text() in {"step-00000010", "step-00000001"}
    assert not list(tmp_path.rglob("*.part"))  # written whole, by rename
    # another run's settings: its checkpoint is not this run's
    with pytest.raises(ConfigError, match="belongs to a different job"):
        dqn_checkpoint.load(dqn, make_rl_config({"algo": "dqn", "lr": 0.5}))
    # the same crafted file planted in each, its manifest made to match: refused by the same
    # line before anything runs (loaded as tensors only, never unpickled in full)
    _plant(dqn / "checkpoints" / "step-00000010")
    _plant(apex / "checkpoints" / "step-00000001")
    refusals = []
    for load in (lambda: dqn_checkpoint.load(dqn, cfgs[dqn]),
                 lambda: dqn_checkpoint.load_part(apex, cfgs[apex], 0)):
        with pytest.raises(ConfigError) as err:
            load()
        refusals.append(str(err.value))
    assert all("holds Python objects other than tensors" in r for r in refusals), refusals
    # and training's store judges such a file with the same words
    store = CheckpointStore(tmp_path / "train", "fp")
    store.write_rank(1, 0, state)
    ckpt = store.commit(1, keep=1)
    (ckpt / "rank0.pt").write_bytes(pickle.dumps(_Code(), protocol=2))
    assert "rank0.pt" in (store.verify(ckpt) or "")
