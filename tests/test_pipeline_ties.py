"""Tier 1: parameters shared by two pipeline stages are found by identity, with their names."""

from __future__ import annotations

import pytest
from torch import nn

from polytrain.errors import ConfigError
from polytrain.strategies.pipeline.ties import check_no_replicated_ties, find_ties


def test_ties_are_found_per_stage_and_replicated_tied_stages_refused() -> None:
    emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    full = nn.Sequential(emb, nn.Linear(4, 4), nn.Linear(4, 4), head)
    pieces = [nn.Sequential(full[0], full[1]), nn.Sequential(full[2]), nn.Sequential(full[3])]
    (tie,) = find_ties(full, pieces)
    assert (tie.stages, tie.local, tie.names) == ((0, 2), ("0.weight", "0.weight"), ("0.weight", "3.weight"))
    assert find_ties(full, [full]) == []  # one stage: simply tied
    check_no_replicated_ties([tie], [1, 2, 1])  # the replicated stage holds no tied weight
    with pytest.raises(ConfigError, match=r"stage 2 is replicated \(2 ranks\)"):
        check_no_replicated_ties([tie], [1, 1, 2])
