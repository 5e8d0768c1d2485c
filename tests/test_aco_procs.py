"""ACO-DP across processes (real torch.distributed over gloo, started by polytrain's launcher)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from polytrain.aco.config import ACOConfig
from polytrain.aco.launch import run_aco
from polytrain.testbed.netns import missing_privileges

pytestmark = pytest.mark.slow


def _run(tmp: Path, name: str, **kw: object) -> tuple[dict, list[dict]]:
    base = {"tsp": "random:30:2", "ants": 9, "iterations": 12, "local_search": "2opt", "seed": 3}
    s = run_aco(ACOConfig.from_dict({**base, **kw, "out": str(tmp / name)}), progress=False)
    rows = [json.loads(x) for x in (tmp / name / "iterations.jsonl").read_text().splitlines()]
    return s, rows


def test_two_processes_sharing_one_colony_equal_one_process(tmp_path: Path) -> None:
    """--procs 2 --exchange 1: same draws, each rank its slice of the ants, tours all-gathered,
    the same update on every replica: tour for tour equal to one process with all the ants."""
    one, rows1 = _run(tmp_path, "p1", procs=1)
    two, rows2 = _run(tmp_path, "p2", procs=2)
    assert two["best_tour"] == one["best_tour"] and two["best_length"] == one["best_length"]
    keys = ("best", "iter_best", "mean", "restarts")
    assert [[r[k] for k in keys] for r in rows2] == [[r[k] for k in keys] for r in rows1]
    # every iteration moves each rank's tours to the other: ring all-gather of a ceil(9/2) x 30
    # int32 block, 12 times, by both ranks
    assert two["bytes_sent"] == 2 * 12 * 5 * 30 * 4
    assert two["exchanges"] == 12 and two["bytes_per_exchange"] == 2 * 5 * 30 * 4


def test_island_colonies_exchange_pheromone_and_best_tour(tmp_path: Path) -> None:
    s, rows = _run(tmp_path, "isl", procs=2, exchange=4, variant="acs", local_search="none",
                   iterations=10)
    assert sorted(s["best_tour"]) == list(range(30))
    assert s["exchanges"] == 3  # at 4, 8 and a last one at the end
    tau = 30 * 30 * 8
    per_rank = {r["rank"]: r for r in s["per_rank"]}
    assert per_rank[0]["bytes_by_op"]["pheromone"] == 3 * tau  # ring all-reduce, W=2: 2·(W−1)/W
    assert per_rank[0]["best_length"] == per_rank[1]["best_length"]  # both adopted the best
    assert [r["iteration"] for r in rows] == list(range(1, 11))


def test_plain_torchrun_runs_island_colonies(tmp_path: Path) -> None:
    """``torchrun -m polytrain aco``: the world size is torchrun's (here --exchange needs it)."""
    import subprocess
    import sys

    out = tmp_path / "tr"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "polytrain", "aco", "--tsp", "random:20:1", "--iterations", "6", "--exchange", "3",
           "--ants", "6", "--no-plots", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["procs"] == 2 and s["exchanges"] == 2 and sorted(s["best_tour"]) == list(range(20))
    assert s["bytes_sent"] > 0


NO_NET = missing_privileges()


@pytest.mark.skipif(NO_NET is not None, reason=str(NO_NET))
def test_aco_on_the_testbed_equals_one_process_and_counts_the_wire(tmp_path: Path) -> None:
    """`polytrain testbed -- aco`: 2 emulated hosts (one rank each, a real multi-node rendezvous
    over shaped links) sharing one colony build the same tours as one process, and the
    interface counters of both hosts are added to the summary beside polytrain's own count."""
    import subprocess
    import sys

    one, _ = _run(tmp_path, "p1", procs=1)
    out = tmp_path / "tb"
    cmd = [sys.executable, "-m", "polytrain", "testbed", "--hosts", "2", "--nic", "1gbit", "--",
           "aco", "--tsp", "random:30:2", "--ants", "9", "--iterations", "12", "--local-search",
           "2opt", "--seed", "3", "--procs", "2", "--no-plots", "--out", str(out)]
    tmp = tmp_path / "tmp"  # nothing may be left in the temporary folder by a successful run
    tmp.mkdir()
    subprocess.run(cmd, check=True, timeout=300, capture_output=True, env={**os.environ, "TMPDIR": str(tmp)})
    assert not [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")]
    s = json.loads((out / "summary.json").read_text())
    assert s["procs"] == 2 and s["best_tour"] == one["best_tour"]
    wire = s["testbed"]["wire_bytes_tx"]
    assert set(wire) == {"0", "1"}
    # the links carried at least the tours polytrain counted (plus rendezvous, TCP, headers)
    assert sum(wire.values()) >= s["bytes_sent"] > 0


def test_testbed_aco_refuses_bad_options_before_any_host_starts() -> None:
    import argparse

    from rich.console import Console

    from polytrain.cli import cmd_testbed
    from polytrain.errors import ConfigError

    bed = argparse.Namespace(hosts=2, nic="1gbit", latency=None, loss=None, procs_per_host=None)
    with pytest.raises(ConfigError, match="ants"):
        cmd_testbed(bed, ["aco", "--tsp", "random:30", "--ants", "0"], Console())
    with pytest.raises(ConfigError, match="invalid 'aco' options"):
        cmd_testbed(bed, ["aco", "--tsp", "random:30", "--nope", "1"], Console())
