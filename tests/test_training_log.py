"""``--log csv,tensorboard,wandb`` (issue 45 item 7): rows written while the ranks' event files
grow, each step's loss the mean over the ranks that reported it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.runtime.live_log import CsvSink, LiveLog, check_sinks


def _append(path: Path, *events: dict[str, object]) -> None:
    with path.open("a") as f:
        for ev in events:
            f.write(json.dumps(ev) + "\n")


def _rows(run: Path) -> list[dict[str, str]]:
    with (run / "log.csv").open() as f:
        return list(csv.DictReader(f))


def test_rows_are_written_as_the_ranks_report(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    r0, r1 = ranks / "rank0.jsonl", ranks / "rank1.jsonl"
    step = {"event": "step", "t": 0.1, "samples": 16}
    _append(r0, step | {"rank": 0, "step": 1, "loss": 1.0}, step | {"rank": 0, "step": 2, "loss": 0.5})
    _append(r1, step | {"rank": 1, "step": 1, "loss": 3.0}, {"event": "span", "rank": 1})
    log = LiveLog(ranks, [CsvSink(tmp_path)])
    log.poll()
    rows = _rows(tmp_path)
    assert [(r["step"], float(r["loss"])) for r in rows] == [("1", 2.0)]  # step 2: rank 1 not yet
    _append(r1, step | {"rank": 1, "step": 2, "loss": 1.5})
    _append(r0, {"event": "eval", "rank": 0, "step": 2, "t": 0.3, "accuracy": 0.9, "loss": 0.4})
    log.poll()
    rows = _rows(tmp_path)
    assert [(r["kind"], r["step"], float(r["loss"])) for r in rows] == [
        ("train", "1", 2.0), ("eval", "2", 0.4), ("train", "2", 1.0)]
    assert rows[1]["accuracy"] == "0.9"
    _append(r0, step | {"rank": 0, "step": 3, "loss": 0.2})
    log.poll(final=True)  # the end: what a rank did report is written
    assert _rows(tmp_path)[-1]["step"] == "3"


def test_no_row_until_every_rank_has_said_whether_it_reports(tmp_path: Path) -> None:
    """A rank whose first steps are still buffered must not be left out of their mean: with the
    job's world known, rows wait for every rank's start; a server (losses=False) is not waited
    for."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    step = {"event": "step", "t": 0.1, "samples": 16}
    start = {"event": "start", "first_step": 1, "steps": 3}
    _append(ranks / "rank0.jsonl", start | {"rank": 0, "losses": False})  # a server
    _append(ranks / "rank1.jsonl", start | {"rank": 1, "losses": True},
            step | {"rank": 1, "step": 1, "loss": 1.0}, step | {"rank": 1, "step": 2, "loss": 1.0})
    log = LiveLog(ranks, [CsvSink(tmp_path)], world=3)
    log.poll()
    assert not (tmp_path / "log.csv").read_text().strip().splitlines()[1:]  # rank 2 unheard of
    _append(ranks / "rank2.jsonl", start | {"rank": 2, "losses": True},
            step | {"rank": 2, "step": 1, "loss": 3.0})
    log.poll()
    assert [(r["step"], float(r["loss"])) for r in _rows(tmp_path)] == [("1", 2.0)]


def test_log_ranks_all_adds_each_ranks_own_loss(tmp_path: Path) -> None:
    """--log-ranks all: the run's row (the mean) and then one row per rank with its own loss;
    the default (0) writes the run's rows only."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    step = {"event": "step", "t": 0.1, "samples": 16, "step": 1}
    _append(ranks / "rank0.jsonl", step | {"rank": 0, "loss": 1.0})
    _append(ranks / "rank1.jsonl", step | {"rank": 1, "loss": 3.0})
    every, only = tmp_path / "all", tmp_path / "zero"
    every.mkdir(), only.mkdir()
    LiveLog(ranks, [CsvSink(every)], per_rank=True).poll()
    LiveLog(ranks, [CsvSink(only)]).poll()
    assert [(r["kind"], r["rank"], float(r["loss"])) for r in _rows(every)] == [
        ("train", "", 2.0), ("rank", "0", 1.0), ("rank", "1", 3.0)]
    assert [(r["kind"], float(r["loss"])) for r in _rows(only)] == [("train", 2.0)]


def test_log_ranks_from_every_front_end(tmp_path: Path) -> None:
    from polytrain.cli import build_parser

    toml = tmp_path / "job.toml"
    toml.write_text("log = ['csv']\nlog_ranks = 0\n")
    assert make_config({}).log_ranks == "0" and make_config({"log_ranks": 0}).log_ranks == "0"
    args = build_parser().parse_args(["train", "--log-ranks", "all"])
    assert make_config({"log_ranks": args.log_ranks}).log_ranks == "all"
    from polytrain.api import _config

    assert _config(toml, None, {}).log_ranks == "0"
    assert _config(toml, None, {"log_ranks": "all"}).log_ranks == "all"
    with pytest.raises(ConfigError, match=r"'log_ranks' = '1'"):
        make_config({"log_ranks": 1})


def test_log_sinks_validated() -> None:
    assert make_config({"log": "csv, tensorboard"}).log == ["csv", "tensorboard"]
    with pytest.raises(ConfigError, match=r"'log\.0' = 'mlflow'"):
        make_config({"log": "mlflow"})
    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="--log wandb needs the wandb package"):
            check_sinks(["wandb"])


def test_wandb_writes_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="wandb is not installed: --log wandb is refused before launch")
    from polytrain.runtime.live_log import WandbSink

    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink(tmp_path, "allreduce", {"lr": 0.1})
    sink.step(1, 0.1, 16, 2.0)
    sink.eval(1, 0.2, {"accuracy": 0.5})
    sink.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))  # written here, for `wandb sync`


def test_piped_progress_lines_show_the_mean_loss_and_evaluations(tmp_path: Path) -> None:
    from polytrain.runtime.progress import PlainLines

    step = {"event": "step", "step": 4, "t": 2.0, "samples": 64}
    _append(tmp_path / "rank0.jsonl", step | {"rank": 0, "loss": 1.0})
    _append(tmp_path / "rank1.jsonl", step | {"rank": 1, "loss": 2.0})
    lines = PlainLines(tmp_path, 10, "allreduce")
    lines.read()
    first = lines.line()
    assert first is not None and "step 4/10 loss 1.5000" in first and "eval" not in first
    assert lines.line() is None  # nothing new
    _append(tmp_path / "rank0.jsonl", {"event": "eval", "rank": 0, "step": 4, "t": 2.1,
                                       "accuracy": 0.875, "loss": 0.5})
    lines.read()
    again = lines.line()
    assert again is not None and "(eval at step 4: test accuracy 0.8750 test loss 0.5000)" in again
