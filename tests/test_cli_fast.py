"""Answers that need no training import no torch: ``--version``, ``--help``, ``strategies`` and
the refusals a job's fields and strategy id decide (issue 49). Behavioural, not timed: each runs
in a fresh interpreter and looks at what it imported."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.conftest import ROOT

# Runs the CLI's main() on each argument list (JSON in argv[1]) in one fresh interpreter and
# reports each exit code and output, and whether torch was imported by any of them (argparse's
# --version/--help exit through SystemExit).
PROBE = """
import contextlib, io, json, sys
from polytrain.cli import main
results = []
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(args)
        except SystemExit as e:
            rc = e.code
    results.append({"rc": rc, "out": out.getvalue(), "err": " ".join(err.getvalue().split())})
print(json.dumps({"torch": "torch" in sys.modules, "results": results}))
"""


def _probe(cases: list[list[str]]) -> tuple[bool, list[dict[str, object]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    return got["torch"], got["results"]


def test_importing_the_cli_imports_no_torch() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import sys, polytrain, polytrain.cli; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


ANSWERS = [
    (["--version"], "polytrain 0.1.0"),
    (["--help"], "usage: polytrain"),
    (["strategies"], "allreduce"),
]
REFUSALS = [
    (["train", "--steps", "-1"], "'steps' = -1: must be at least 1"),
    (["train", "--procs", "0"], "at least 1"),
    (["train", "--strategy", "allreduc"], "Unknown strategy 'allreduc'.*allreduce"),
    (["train", "--set", "slow_rank=5"], "slow_rank=5 is not a rank of this job"),
    (["train", "--model", "resnet999"], "Unknown model 'resnet999'"),
    (["train", "--dataset", "imagenet"], "Unknown dataset 'imagenet'"),
    (["train", "--strategy", "gpipe", "--on-nonfinite", "skip"], "honoured by single, allreduce"),
    (["train", "--set", "servers"], "--set expects KEY=VALUE"),
    (["train", "--config", "/nonexistent/job.toml"], "Cannot read config file"),
    (["compare", "--strategies", "single,nope"], "Unknown strategy 'nope'"),
]


def test_answers_and_refusals_without_torch() -> None:
    """Every answer and refusal above, in one interpreter: none of them imports torch."""
    torch_imported, results = _probe([args for args, _ in ANSWERS + REFUSALS])
    for (args, expect), r in zip(ANSWERS, results[: len(ANSWERS)], strict=True):
        assert r["rc"] in (0, None) and expect in str(r["out"]), (args, r)
    for (args, expect), r in zip(REFUSALS, results[len(ANSWERS):], strict=True):
        assert r["rc"] == 2 and re.search(expect, str(r["err"])), (args, r)
    assert not torch_imported


def test_catalog_lists_what_the_registry_registers() -> None:
    """The source-read catalogue and the imported classes agree on every id, family, summary."""
    from polytrain.strategies import registry
    from polytrain.strategies.catalog import catalog

    imported = {n: (c.family, c.summary, c.__module__) for n, c in registry().items()}
    read = {n: (e.family, e.summary, e.module) for n, e in catalog().items()}
    assert read == imported


def test_zoo_names_are_the_registries() -> None:
    from polytrain.data import DATASETS
    from polytrain.models import MODELS
    from polytrain.strategies.catalog import zoo_names

    assert zoo_names("models") == tuple(sorted(MODELS))
    assert zoo_names("data") == tuple(sorted(DATASETS))
