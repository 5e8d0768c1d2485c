"""Tier 1: mesh layouts are validated data — -1 fills the remaining ranks, a layout that does not
multiply to the world size is refused with the numbers, and rank groups follow the layout."""

from __future__ import annotations

import pytest

from polytrain.config import load_config
from polytrain.errors import ConfigError
from polytrain.runtime.layout import RL_ORDER, Layout
from polytrain.strategies import make_strategy


def test_minus_one_means_the_remaining_ranks() -> None:
    assert Layout(dp=-1, pp=2).resolve(8) == Layout(4, 2, 1)
    assert Layout(dp=2, pp=1, tp=-1).resolve(8) == Layout(2, 1, 4)
    assert str(Layout(2, 2, 1)) == "dp=2 × pp=2 × tp=1"


def test_layout_that_does_not_multiply_to_the_world_is_refused_with_the_numbers() -> None:
    with pytest.raises(ConfigError, match=r"2·3·1 = 6 ranks but the job has --procs 4.*--procs 6"):
        Layout(2, 3, 1).resolve(4)
    with pytest.raises(ConfigError, match=r"fixed dimensions use 3 ranks, which does not divide 4"):
        Layout(-1, 3, 1).resolve(4)
    with pytest.raises(ConfigError, match=r"at most one dimension may be -1"):
        Layout(-1, -1, 1)
    with pytest.raises(ConfigError, match=r"pp=0"):
        Layout(2, 0, 1)


def test_groups_follow_the_layout() -> None:
    lay = Layout(2, 2, 1)
    assert lay.dp_groups() == [[0, 2], [1, 3]]
    assert lay.pp_groups() == [[0, 1], [2, 3]]
    assert lay.tp_groups() == [[0], [1], [2], [3]]
    lay = Layout(2, 1, 2)
    assert lay.tp_groups() == [[0, 1], [2, 3]]
    assert lay.dp_groups() == [[0, 2], [1, 3]]
    assert [lay.coords(r) for r in range(4)] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]


def test_mesh_checks_the_job_before_any_process() -> None:
    cfg = load_config(overrides={"strategy": "mesh", "model": "mlp", "dataset": "digits",
                                 "batch_size": 16})
    with pytest.raises(ConfigError, match=r"uses 2·2·1 = 4 ranks but the job has --procs 6"):
        make_strategy("mesh", {"dp": 2, "pp": 2}).check(cfg, 6)
    with pytest.raises(ConfigError, match=r"--model mlp has none"):
        make_strategy("mesh", {"dp": 2, "tp": 2}).check(cfg, 4)
    with pytest.raises(ConfigError, match=r"multiple of 3 \(got 16\)"):
        make_strategy("mesh", {"dp": 3}).check(cfg, 3)
    make_strategy("mesh", {"dp": 2, "pp": 2}).check(cfg, 4)


def test_one_layout_places_servers_coordinator_replay_and_actors() -> None:
    sandblaster = Layout(servers=2, coordinator=1).resolve(6)
    assert (sandblaster.coordinator_rank, sandblaster.server_ranks) == (0, (1, 2))
    assert sandblaster.replica_ranks == (3, 4, 5) and sandblaster.role(4) == ("replicas", 1)
    distbelief = Layout(pp=2, servers=4).resolve(8)  # 2 servers per stage, 2 replicas of 2 stages
    assert distbelief.pp_groups() == [[4, 5], [6, 7]]
    assert (distbelief.stage_servers(1), distbelief.stage_clients(1)) == ([2, 3], [5, 7])
    assert distbelief.coords(7) == (1, 1, 0)
    gorila = Layout(dp=2, servers=3, replay=1, actors=2, order=RL_ORDER).resolve(8)
    assert (gorila.replica_ranks, gorila.replay_rank, gorila.server_ranks) == ((0, 1), 2, (3, 4, 5))
    assert gorila.actor_ranks == (6, 7) and gorila.lead == 0
    with pytest.raises(ConfigError, match=r"1·2·1 = 2 ranks \+ 4 other ranks.*--procs 6"):
        Layout(dp=1, pp=2, servers=4).resolve(7)
    with pytest.raises(ConfigError, match=r"no place for \['actors'\]"):
        Layout(actors=2, order=("replicas",))
