"""Tier 1: the plan names what polytrain measured about how an inexact candidate learns (its
strategy's results pages), "unmeasured" where nothing did, and "= single" for exact ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polytrain.cli import main
from polytrain.strategies import registry
from polytrain.strategies.base import CODEC_EVIDENCE
from tests.test_plan_recommend import vgg_like

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def test_every_named_page_exists_and_measured_that_strategy() -> None:
    for name, cls in registry().items():
        for page in cls.learning_evidence:
            path = RESULTS / f"{page}.md"
            assert path.is_file(), (name, page)
            assert name in path.read_text(), (name, page)
    for page in CODEC_EVIDENCE:
        assert "compress" in (RESULTS / f"{page}.md").read_text().lower() or "codec" in (
            RESULTS / f"{page}.md").read_text().lower(), page


def test_the_plan_says_what_is_known_of_each_candidates_learning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "p.json"
    vgg_like().save(prof)
    assert main(["plan", "--profile", str(prof), "--cluster", "hosts=4,nic=1gbit", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    seen = {}
    for r in rows:
        codec = r["options"].get("compression", "none") != "none"
        key = "codec" if codec else r["strategy"]
        seen.setdefault(key, set()).add(r["accuracy_evidence"])
        if r["exact"]:
            assert r["accuracy_evidence"] == "= single"
    assert seen["pipedream"] == {"docs/results/pipeline_convergence.md"}
    assert seen["local-sgd"] == {"unmeasured"}
    assert seen["codec"] == {", ".join(f"docs/results/{p}.md" for p in CODEC_EVIDENCE)}
    assert "docs/results/ps_consistency.md" in seen["ps"] and "= single" in seen["ps"]  # async; bsp
    from rich.console import Console

    from polytrain.cost.cluster import Cluster
    from polytrain.plan.calibration import PHYSICAL
    from polytrain.plan.recommend import candidates, rank
    from polytrain.plan.show import ranking_table

    ranked = rank(candidates(PHYSICAL.scene(vgg_like(), Cluster.parse("hosts=4,nic=1gbit"), 64)))
    console = Console(width=300, record=True)
    console.print(ranking_table(ranked, len(ranked), "plan"))
    table = console.export_text()
    assert "accuracy evidence" in table and "unmeasured" in table and "pipeline_convergence" in table
