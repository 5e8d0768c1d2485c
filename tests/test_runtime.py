"""Tier 1: batches, checkpoints and the recorder, without processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from polytrain.errors import CheckpointError, ConfigError
from polytrain.metrics.recorder import Recorder
from polytrain.runtime.batches import GlobalBatches
from polytrain.runtime.checkpoint import CheckpointStore


def test_parts_of_a_global_batch_are_the_global_batch() -> None:
    x = torch.arange(100).float().unsqueeze(1)
    b = GlobalBatches(x, torch.arange(100), batch_size=16, seed=3)
    for step in (1, 6, 7, 20):
        whole, _ = b.shard(step)
        parts = torch.cat([b.shard(step, p, 4)[0] for p in range(4)])
        assert torch.equal(whole, parts)


def test_every_sample_once_per_epoch() -> None:
    b = GlobalBatches(torch.zeros(50, 1), torch.arange(50), batch_size=10, seed=0)
    seen = torch.cat([b.indices(s) for s in range(1, 6)])
    assert sorted(seen.tolist()) == list(range(50))
    # crossing an epoch boundary keeps the stream going
    assert b.indices(6).shape == (10,)


def test_batches_follow_the_concatenated_epoch_permutations() -> None:
    # batch 16 over 50 samples: some batches lie inside one epoch (a view of the permutation),
    # others cross a boundary; all must be the stream positions [(s-1)B, sB) of the definition
    b = GlobalBatches(torch.zeros(50, 1), torch.arange(50), batch_size=16, seed=5)
    stream = torch.cat([torch.randperm(50, generator=torch.Generator().manual_seed(5 * 1_000_003 + e))
                        for e in range(8)])
    for step in range(1, 21):
        assert torch.equal(b.indices(step), stream[(step - 1) * 16 : step * 16])


def test_uneven_split_is_refused() -> None:
    b = GlobalBatches(torch.zeros(50, 1), torch.arange(50), batch_size=10, seed=0)
    with pytest.raises(ConfigError, match="multiple of 4"):
        b.shard(1, 0, 4)


def _state(v: float) -> dict[str, object]:
    return {"model": {"w": torch.full((3,), v)}, "step": torch.tensor(int(v))}


def test_checkpoint_round_trip_and_pointer(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "job-a")
    for step in (1, 2, 3, 4):
        store.write_rank(step, 0, _state(step))
        store.commit(step, keep=2)
    assert (tmp_path / "LATEST").read_text() == "step-00000004"
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000003", "step-00000004"]
    ckpt, warnings = store.find_good()
    assert warnings == [] and CheckpointStore.step_of(ckpt) == 4
    assert torch.equal(CheckpointStore.load_rank(ckpt, 0)["model"]["w"], torch.full((3,), 4.0))


def test_corrupt_checkpoint_falls_back_with_warning(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "job-a")
    for step in (1, 2):
        store.write_rank(step, 0, _state(step))
        store.commit(step, keep=3)
    with (tmp_path / "step-00000002" / "rank0.pt").open("r+b") as f:
        f.seek(40)
        f.write(b"\x00garbage")
    ckpt, warnings = store.find_good()
    assert ckpt.name == "step-00000001"
    assert "step-00000002 refused" in warnings[0] and "SHA-256" in warnings[0]


def test_half_written_checkpoint_is_not_used(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "job-a")
    store.write_rank(1, 0, _state(1))
    store.commit(1, keep=3)
    store.write_rank(2, 0, _state(2))  # staged, never committed: a crash mid-save
    ckpt, _ = store.find_good()
    assert ckpt.name == "step-00000001"


def test_no_good_checkpoint_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint"):
        CheckpointStore(tmp_path, "job-a").find_good()
    store = CheckpointStore(tmp_path, "job-a")
    store.write_rank(1, 0, _state(1))
    store.commit(1, keep=3)
    with pytest.raises(CheckpointError, match="different job"):
        CheckpointStore(tmp_path, "job-b").find_good()


class _Payload:
    """An object whose unpickling would run code (os.system)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("touch pwned",))


def test_crafted_checkpoint_cannot_run_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = CheckpointStore(tmp_path / "ck", "job-a")
    store.write_rank(1, 0, {"evil": _Payload()})
    store.commit(1, keep=3)  # manifest matches: the attacker wrote the hashes too
    with pytest.raises(CheckpointError, match=r"file rank0\.pt holds Python objects other than"):
        store.find_good()  # refused when verified (issue 22 item 8), naming the file
    with pytest.raises(CheckpointError, match=r"rank0\.pt holds Python objects") as err:
        CheckpointStore.load_rank(tmp_path / "ck" / "step-00000001", 0)
    assert "weights_only" not in str(err.value)  # no advice to load it unsafely
    assert not (tmp_path / "pwned").exists()


def test_recorder_streams_events(tmp_path: Path) -> None:
    rec = Recorder(1, tmp_path / "r.jsonl")
    rec.step(1, 0.5, 64)
    with rec.span("forward"):
        pass
    rec.close()
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines] == ["step", "span"]
    assert lines[0]["rank"] == 1 and lines[1]["end"] >= lines[1]["start"]
