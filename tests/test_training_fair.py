"""Fair comparisons (issue 45 item 8): every side of ``compare`` runs its processes with the same
threads, recorded in compare.json; ``single`` under the default --procs runs one process and
says so instead of refusing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import polytrain
from polytrain.config import load_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare


def test_single_takes_one_process_when_procs_is_left_out() -> None:
    prepared = prepare(load_config(overrides={"strategy": "single", "model": "mlp"}))
    assert prepared.config.procs == 1
    assert prepared.note and "runs on 1 process (not the default --procs 2" in prepared.note
    with pytest.raises(ConfigError, match=r"runs on exactly 1 process \(got --procs 2\)"):
        prepare(load_config(overrides={"strategy": "single", "procs": 2, "model": "mlp"}))


@pytest.mark.slow
def test_compare_gives_every_side_the_same_threads(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out = tmp_path / "cmp"
    result = polytrain.compare(["single", "allreduce"], procs=2, model="mlp", steps=2,
                               batch_size=16, out=str(out))
    stored = json.loads((out / "compare.json").read_text())
    threads = stored["threads_per_process"]
    assert threads >= 1 and result["threads_per_process"] == threads
    single, allreduce = stored["strategies"]
    assert single["threads_per_process"] == [threads]  # measured in the ranks, one process
    assert allreduce["threads_per_process"] == [threads, threads]


def test_docs_matrix_is_the_declared_one() -> None:
    from polytrain.strategies.describe import training_matrix

    root = Path(__file__).resolve().parent.parent
    assert '--8<-- "snippets/training.md"' in (root / "docs" / "training.md").read_text()
    assert (root / "docs" / "snippets" / "training.md").read_text() == training_matrix() + "\n"
