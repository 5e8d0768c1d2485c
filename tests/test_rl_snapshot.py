"""apex and gorila checkpoints (issue 22 item 7): a consistent cut across processes, and a resume
that continues from it.

Their actors are asynchronous processes, so a resumed run cannot be the uninterrupted run bit for
bit (dqn's is: tests/test_rl_resume.py). What is checked instead is the cut itself — every
process's part names the same checkpoint and the same learner updates; each gorila learner's
pushes are in the shards exactly up to its update count (the shards' async clocks), so the
shards' version is the sum of the learners' updates: each push applied at most once — and that
the resumed run goes on from the saved counters, clocks and parameter version (the shards would
refuse a push whose clock does not follow the saved one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from polytrain.rl.api import resume_config, run_config
from polytrain.rl.checkpoint import ROOT, latest
from polytrain.rl.config import make_rl_config
from polytrain.runtime.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow  # starts processes

SMALL = {"hidden": 16, "depth": 1, "batch_size": 16, "learning_starts": 100, "target_update": 40,
         "replay_capacity": 2000, "target_return": 1e6, "eval_episodes": 1, "eval_every_s": 1e6,
         "screen_episodes": 1, "max_seconds": 120, "actors": 1, "checkpoint_every": 150}


def _parts(run: Path) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """The newest checkpoint's figures (meta.json's ``info``) and every process's part by rank."""
    ckpt = latest(run)
    parts = {int(p.stem[len("rank"):]): torch.load(p, weights_only=True) for p in ckpt.glob("rank*.pt")}
    return CheckpointStore.info_of(ckpt), parts


def _run(options: dict[str, Any], run: Path, resume: bool = False) -> dict[str, Any]:
    cfg = resume_config(str(run), options) if resume else make_rl_config({**options, "out": str(run)})
    return run_config(cfg, progress=False, plots=False, resume=resume)


def test_gorila_checkpoint_is_a_consistent_cut_and_resumes(tmp_path: Path) -> None:
    run = tmp_path / "g"
    first = _run({**SMALL, "algo": "gorila", "learners": 2, "servers": 1, "max_env_steps": 300}, run)
    meta, parts = _parts(run)
    lead, other, replay, shard = parts[0], parts[1], parts[2], parts[3]
    assert meta["save"] >= 2 and meta["env_steps"] >= 300  # every 150 env steps, and at the end
    assert {p["save"] for p in parts.values()} == {meta["save"]}
    assert replay["learner_updates"] == lead["updates"] == meta["updates"]
    per_actor = sum(a["env_steps"] for a in replay["per_actor"].values())
    assert replay["env_steps"] == meta["env_steps"] == per_actor
    assert shard["policy"]["clocks"].tolist() == [lead["updates"], other["updates"]]  # the ps cut
    assert int(shard["version"]) == lead["updates"] + other["updates"]
    assert replay["version"] == meta["params_version"] == lead["published"][0]
    assert len(parts) == 4  # both learners, the replay and the shard
    kept = sorted(p.name for p in (run / ROOT).iterdir())  # the older ones pruned, none half-written
    assert kept == ["LATEST", f"step-{meta['save'] - 1:08d}", f"step-{meta['save']:08d}"]
    assert first["resumes"] == []

    resumed = _run({"algo": "gorila", "max_env_steps": meta["env_steps"] + 200}, run, resume=True)
    assert resumed["resumes"] == [{"from_env_steps": meta["env_steps"], "updates": meta["updates"],
                                   "t": meta["t"]}]
    by_rank = {r["rank"]: r["result"] for r in resumed["per_rank"]}
    ups = [by_rank[0]["learner_updates"], by_rank[1]["learner_updates"]]
    assert ups[0] >= lead["updates"] and ups[1] >= other["updates"]  # counted on from the cut
    assert sum(ups) > lead["updates"] + other["updates"]
    assert by_rank[3]["version"] == sum(ups)  # every push of both launches, each once
    assert by_rank[2]["params_version"] > meta["params_version"]
    assert by_rank[4]["param_version"] >= meta["params_version"]  # the actor started from the saved
    assert resumed["env_steps"] >= meta["env_steps"] + 200 and resumed["wall_s"] > meta["t"]
    new, _ = _parts(run)
    assert new["save"] > meta["save"] and new["updates"] == by_rank[0]["learner_updates"]
    events = [json.loads(x) for x in (run / "ranks" / "rank0.jsonl").read_text().splitlines()]
    cut = next(i for i, e in enumerate(events) if e["event"] == "resume")
    assert all(e["t"] <= meta["t"] for e in events[:cut])  # what followed the cut ran again
    assert next(e["updates"] for e in events[cut:] if e["event"] == "progress") >= meta["updates"]


def test_apex_checkpoint_keeps_the_optimizer_and_resumes(tmp_path: Path) -> None:
    run = tmp_path / "a"
    _run({**SMALL, "algo": "apex", "max_env_steps": 300}, run)
    meta, parts = _parts(run)
    learner, replay = parts[0], parts[1]
    assert replay["learner_updates"] == learner["updates"] == meta["updates"] > 0
    assert learner["optimizer"]["state"][0]["step"] == learner["updates"]  # Adam's own count agrees
    assert replay["buffer"]["next_id"] == meta["transitions"] and replay["env_steps"] == meta["env_steps"]
    resumed = _run({"algo": "apex", "max_env_steps": meta["env_steps"] + 150}, run, resume=True)
    [back] = resumed["resumes"]
    assert back["from_env_steps"] == meta["env_steps"] and resumed["learner_updates"] > meta["updates"]
    new, parts = _parts(run)
    assert parts[0]["optimizer"]["state"][0]["step"] == parts[0]["updates"] == new["updates"]
