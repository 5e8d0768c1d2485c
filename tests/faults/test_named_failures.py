"""Failures named for what they are (issue 50, item 9): a checkpoint write that fails on a full
disk says so (``/dev/full`` stands in for the disk: every write to it fails with ENOSPC); a
rank's error record is whole or absent, never empty, and lands in memory-backed storage when
the run directory cannot take it; the kernel's OOM kills are counted where the cgroup says."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from polytrain.errors import CheckpointError
from polytrain.launch import records
from polytrain.runtime.checkpoint import CheckpointStore

FULL = Path("/dev/full")
needs_full = pytest.mark.skipif(not FULL.exists(), reason="needs Linux's /dev/full")


@needs_full
def test_a_checkpoint_on_a_full_disk_is_named(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints", "job")
    os.symlink(FULL, store.stage(200) / "rank0.part")
    with pytest.raises(CheckpointError) as err:
        store.write_rank(200, 0, {"w": torch.zeros(1000)})
    assert str(err.value).startswith("rank 0 could not write step-00000200: no space left on device")
    assert "\n" not in str(err.value)


@needs_full
def test_an_error_record_is_never_empty_and_finds_its_way_out(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    spare = tmp_path / "shm"
    spare.mkdir()
    monkeypatch.setattr(records, "SPARE_DIR", spare)
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    os.symlink(FULL, run / "ranks" / "rank0.error.json.tmp")  # the run's disk is full
    records.write_error_record(run, 0, OSError(28, "No space left on device"), step=199)
    assert not (run / "ranks" / "rank0.error.json").exists()  # no empty record
    record = records.read_error_record(run, 0)
    assert record is not None and record["step"] == 199 and "No space left" in record["error"]
    records.clear_error_record(run, 0)
    assert records.read_error_record(run, 0) is None and not list(spare.iterdir())


def test_oom_kills_are_read_from_the_memory_cgroup() -> None:
    count = records.oom_kills()
    assert count is None or count >= 0
