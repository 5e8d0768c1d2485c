"""Tier 1: the job description, its file format and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from polytrain.config import apply_sets, load_config, parse_value, to_toml, total_steps
from polytrain.errors import ConfigError


def test_defaults_are_the_documented_job() -> None:
    cfg = load_config()
    assert (cfg.strategy, cfg.procs, cfg.model, cfg.dataset) == ("allreduce", 2, "cnn", "digits")


def test_file_then_flags_then_sets(tmp_path: Path) -> None:
    f = tmp_path / "job.toml"
    f.write_text('strategy = "single"\nprocs = 1\nsteps = 7\n[options]\nbucket_mb = 1.0\n')
    cfg = load_config(f, {"steps": 9, "lr": None}, ["bucket_mb=2", "model.width=8", "data.size=16"])
    assert cfg.strategy == "single" and cfg.steps == 9
    assert cfg.options == {"bucket_mb": 2}
    assert cfg.model_options == {"width": 8} and cfg.data_options == {"size": 16}


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(None, {"steps": 5}, ["servers=2"])
    f = tmp_path / "c.toml"
    f.write_text(to_toml(cfg))
    assert load_config(f) == cfg


@pytest.mark.parametrize("text,value", [("2", 2), ("0.5", 0.5), ("true", True), ("3,5,5", "3,5,5"),
                                        ("halton", "halton"), ('"x y"', "x y")])
def test_set_values_parse_like_toml(text: str, value: object) -> None:
    assert parse_value(text) == value


def test_unknown_key_lists_valid_ones(tmp_path: Path) -> None:
    f = tmp_path / "job.toml"
    f.write_text("stepz = 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'stepz'.*Did you mean 'steps'"):
        load_config(f)


def test_bad_values_name_rule_and_value() -> None:
    with pytest.raises(ConfigError, match=r"procs.*at least 1.*got 0"):
        load_config(None, {"procs": 0})
    with pytest.raises(ConfigError, match="optimizer"):
        load_config(None, {"optimizer": "lbfgsx"})


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Cannot read config file"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("model = cnn\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_set_syntax_errors() -> None:
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        apply_sets({}, ["servers"])
    with pytest.raises(ConfigError, match=r"must start with 'model\.' or 'data\.'"):
        apply_sets({}, ["opt.lr=3"])


def test_epochs_override_steps() -> None:
    cfg = load_config(None, {"epochs": 2.0, "batch_size": 64})
    assert total_steps(cfg, 1437) == 45
    assert total_steps(load_config(None, {"steps": 11}), 1437) == 11
