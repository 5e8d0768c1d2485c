"""A measured pipeline partition (partition=auto/time) is stored with the checkpoint and reused
on resume and restart (issue 22 item 2): a new profile could cut elsewhere, and the checkpoint's
per-stage state would then not fit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from polytrain.runtime.checkpoint import CheckpointStore
from polytrain.strategies.pipeline import planning
from polytrain.strategies.pipeline.options import PipelineOptions
from tests.conftest import assert_same_params, load_model, read_summary, run_cli


class _Comm:
    def broadcast_json(self, obj: Any, src: int = 0) -> Any:
        return json.loads(json.dumps(obj))


def _ctx(store: CheckpointStore, resume: bool) -> Any:
    return SimpleNamespace(world=2, is_leader=True, resume=resume, checkpoints=store, comm=_Comm())


def test_a_resumed_run_reuses_the_stored_partition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    sample = torch.zeros(2, 4)
    profiles = iter([[1, 4], [4, 1]])  # two measurements that disagree

    def measured(*_: Any) -> dict[str, Any]:
        return {"counts": next(profiles), "replicas": [1, 1], "profile_ms": [1.0] * 5}

    monkeypatch.setattr(planning, "_measured_plan", measured)
    opts = PipelineOptions(partition="auto")
    first = CheckpointStore(tmp_path, "job")
    part, _ = planning.resolve_partition(opts, model, _ctx(first, resume=False), sample, "gpipe")
    assert part.counts == (1, 4)
    first.write_rank(3, 0, {"x": torch.zeros(1)})
    first.commit(3, keep=2)
    again = CheckpointStore(tmp_path, "job")
    part, info = planning.resolve_partition(opts, model, _ctx(again, resume=True), sample, "gpipe")
    assert part.counts == (1, 4) and info["from_checkpoint"] is True
    assert again.plans[planning.PLAN_NAME]["counts"] == [1, 4]  # and the next checkpoint keeps it
    fresh = CheckpointStore(tmp_path, "job")  # a new run (no resume) measures again
    part, _ = planning.resolve_partition(opts, model, _ctx(fresh, resume=False), sample, "gpipe")
    assert part.counts == (4, 1)


@pytest.mark.slow
def test_pipeline_resume_with_partition_auto_succeeds_repeatedly(tmp_path: Path) -> None:
    job = ["--strategy", "gpipe", "--procs", "2", "--model", "mlp", "--set", "model.hidden=16",
           "--batch-size", "16", "--set", "partition=auto", "--no-report"]
    full = tmp_path / "full"
    r = run_cli("train", *job, "--steps", "4", "--checkpoint-every", "2", "--out", str(full))
    assert r.returncode == 0, r.stderr
    stored = json.loads((full / "checkpoints" / "step-00000002" / "meta.json").read_text())
    assert stored["plans"]["pipeline.partition"]["counts"]
    for attempt in range(2):
        part = tmp_path / f"part{attempt}"
        shutil.copytree(full, part)
        shutil.rmtree(part / "checkpoints" / "step-00000004")
        (part / "checkpoints" / "LATEST").write_text("step-00000002")
        r = run_cli("train", "--resume", str(part), "--no-report")
        assert r.returncode == 0, r.stderr
        metrics = read_summary(part)["strategy_metrics"]
        assert metrics["from_checkpoint"] is True
        assert_same_params(load_model(part), load_model(full), atol=1e-6, rtol=1e-5)
