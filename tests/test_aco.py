"""ACO-DP (tier 1, no processes): TSPLIB parsing, vectorised == one-ant-at-a-time construction,
the optimum on enumerable instances, MMAS bounds, 2-opt, shares of one colony, bad input."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from polytrain.aco.colony import Colony, Draws, Params
from polytrain.aco.config import ACOConfig
from polytrain.aco.launch import run_aco
from polytrain.aco.local_search import two_opt
from polytrain.aco.reference import Reference
from polytrain.aco.run import ant_slice
from polytrain.aco.tsp import FORMATS, coord_distances, enumerate_optimum, load_instance, random_instance
from polytrain.cli import main
from polytrain.errors import ConfigError

DATA = Path(__file__).resolve().parents[1] / "polytrain" / "aco" / "data"  # the shipped TSPLIB files


def _is_perm(tours: torch.Tensor, n: int) -> bool:
    return all(sorted(t.tolist()) == list(range(n)) for t in tours)


def test_berlin52_parsed_with_tsplib_rounding() -> None:
    inst = load_instance(str(DATA / "berlin52.tsp"))
    assert inst.n == 52 and inst.optimum == 7542
    assert inst.dist[0, 1] == 666  # nint(sqrt(540² + 390²)) = nint(666.1)
    assert torch.equal(inst.dist, inst.dist.T) and bool((inst.dist.diagonal() == 0).all())


def test_coordinate_rules() -> None:
    xy = torch.tensor([[0.0, 0.0], [3.0, 4.2]], dtype=torch.float64)
    assert coord_distances(xy, "EUC_2D")[0, 1] == 5  # nint(5.12)
    assert coord_distances(xy, "CEIL_2D")[0, 1] == 6
    r = math.sqrt((9 + 4.2**2) / 10)  # ATT: ceil-like rounding of sqrt(d²/10)
    assert coord_distances(xy, "ATT")[0, 1] == (round(r) + 1 if round(r) < r else round(r))
    geo = torch.tensor([[38.24, 20.42], [39.57, 26.15]], dtype=torch.float64)  # ulysses16 nodes 1, 2
    assert coord_distances(geo, "GEO")[0, 1] == 509  # TSPLIB's ulysses16 distance


def _explicit_file(tmp: Path, fmt: str, d: list[list[int]]) -> Path:
    n = len(d)
    order = {"FULL_MATRIX": [(i, j) for i in range(n) for j in range(n)],
             "UPPER_ROW": [(i, j) for i in range(n) for j in range(i + 1, n)],
             "LOWER_ROW": [(i, j) for i in range(n) for j in range(i)],
             "UPPER_DIAG_ROW": [(i, j) for i in range(n) for j in range(i, n)],
             "LOWER_DIAG_ROW": [(i, j) for i in range(n) for j in range(i + 1)],
             "UPPER_COL": [(i, j) for j in range(n) for i in range(j)],
             "LOWER_COL": [(i, j) for j in range(n) for i in range(j + 1, n)],
             "UPPER_DIAG_COL": [(i, j) for j in range(n) for i in range(j + 1)],
             "LOWER_DIAG_COL": [(i, j) for j in range(n) for i in range(j, n)]}[fmt]
    vals = [str(d[i][j]) for i, j in order]
    body = "\n".join(" ".join(vals[k:k + 4]) for k in range(0, len(vals), 4))
    path = tmp / f"m_{fmt}.tsp"
    path.write_text(f"NAME: m\nTYPE: TSP\nDIMENSION: {n}\nEDGE_WEIGHT_TYPE: EXPLICIT\n"
                    f"EDGE_WEIGHT_FORMAT: {fmt}\nEDGE_WEIGHT_SECTION\n{body}\nEOF\n")
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_explicit_formats(tmp_path: Path, fmt: str) -> None:
    n = 6
    d = [[0 if i == j else 10 + (i + 1) * (j + 1) + abs(i - j) for j in range(n)] for i in range(n)]
    inst = load_instance(str(_explicit_file(tmp_path, fmt, d)))
    assert inst.dist.tolist() == d
    assert inst.optimum == enumerate_optimum(torch.tensor(d, dtype=torch.float64))[0]


@pytest.mark.parametrize(("text", "needle"), [
    ("NAME: x\nTYPE: TSP\nDIMENSION: 3\nEDGE_WEIGHT_TYPE: EUC_2D\nNODE_COORD_SECTION\n1 0 0\n2 1 x\n",
     ":7: NODE_COORD_SECTION: 'x' is not a number"),
    ("NAME: x\nTYPE: TSP\nDIMENSION: 3\nEDGE_WEIGHT_TYPE: MAN_3D\nNODE_COORD_SECTION\n1 0 0\n",
     ":4: EDGE_WEIGHT_TYPE 'MAN_3D' is not supported"),
    ("NAME: x\nTYPE: ATSP\nDIMENSION: 3\n", ":2: TYPE: 'ATSP' is not supported"),
    ("NAME: x\nDIMENSION: 2\nEDGE_WEIGHT_TYPE: EUC_2D\n", ":2: DIMENSION: 2 cities"),
    ("NAME: x\nDIMENSION: three\n", ":2: DIMENSION: 'three' is not an integer"),
    ("NAME: x\nDIMENSION: 3\nEDGE_WEIGHT_TYPE: EUC_2D\nNODE_COORD_SECTION\n1 0 0\n2 1 1\nEOF\n",
     "NODE_COORD_SECTION: expected 9 numbers, found 6"),
    ("NAME: x\nDIMENSION: 3\nEDGE_WEIGHT_TYPE: EXPLICIT\nEDGE_WEIGHT_FORMAT: FUNCTION\n",
     ":4: EDGE_WEIGHT_FORMAT: 'FUNCTION' is not supported"),
])
def test_malformed_files_name_line_and_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.tsp"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as err:
        load_instance(str(path))
    assert needle in str(err.value), str(err.value)


def _colony(inst_n: int, variant: str, cand: int, ants: int, seed: int = 0) -> tuple[Colony, torch.Generator]:
    inst = random_instance(inst_n, seed)
    return Colony(inst, Params(variant=variant, ants=ants, candidates=cand, rho=0.1)), \
        torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("variant", ["as", "acs", "mmas"])
@pytest.mark.parametrize("cand", [0, 5])
def test_vectorised_equals_one_ant_at_a_time(variant: str, cand: int) -> None:
    col, gen = _colony(30, variant, cand, ants=17)
    for _ in range(4):
        draws = Draws.draw(gen, col.n, 17)
        before = col.tau.clone()
        fast = col.construct(draws)
        after = col.tau.clone()
        col.tau.copy_(before)
        slow = Reference(col).construct(draws)
        assert torch.equal(fast, slow)
        assert torch.equal(col.tau, after)  # ACS: the same local updates
        assert _is_perm(fast, col.n)
        col.update(fast, col.lengths(fast))


@pytest.mark.parametrize("variant", ["as", "mmas"])
@pytest.mark.parametrize("cand", [0, 5])
def test_underflowed_rows_fall_back_like_the_reference(variant: str, cand: int) -> None:
    """Rows whose every unvisited weight is zero (pheromone underflow on a long AS run): the
    roulette finds no city and the ant takes the best unvisited one, in both constructions."""
    col, gen = _colony(30, variant, cand, ants=17)
    col.tau[:, ::2] = 0.0  # ants run out of positive weights half-way through their tours
    draws = Draws.draw(gen, col.n, 17)
    fast = col.construct(draws)
    assert torch.equal(fast, Reference(col).construct(draws))
    assert _is_perm(fast, col.n)
    fast[0, 0] = fast[0, 0]  # the tours are ordinary tensors (2-opt edits them in place)


@pytest.mark.parametrize("variant", ["as", "acs", "mmas"])
@pytest.mark.parametrize("n", [5, 8, 9])
def test_optimum_on_enumerable_instances(variant: str, n: int) -> None:
    inst = random_instance(n, seed=n)
    assert inst.optimum is not None
    col = Colony(inst, Params(variant=variant, ants=n, rho=0.1))
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        tours = col.construct(Draws.draw(gen, n, n))
        assert _is_perm(tours, n)
        col.update(tours, col.lengths(tours))
    assert col.best_len == inst.optimum
    assert col.best_tour is not None and inst.tour_length(col.best_tour) == inst.optimum


def test_mmas_bounds_hold_and_stagnation_restarts() -> None:
    inst = random_instance(25, 3)
    col = Colony(inst, Params(variant="mmas", ants=10, rho=0.2, restart_after=5))
    gen = torch.Generator().manual_seed(1)
    for _ in range(60):
        tours = col.construct(Draws.draw(gen, inst.n, 10))
        col.update(tours, col.lengths(tours))
        lo, hi = col.bounds()
        assert lo < hi
        assert float(col.tau.min()) >= lo * (1 - 1e-12) and float(col.tau.max()) <= hi * (1 + 1e-12)
    assert col.restarts >= 1


def test_two_opt_reaches_a_local_optimum() -> None:
    inst = random_instance(40, 7)
    gen = torch.Generator().manual_seed(0)
    tours = torch.stack([torch.randperm(40, generator=gen) for _ in range(6)])
    out = two_opt(tours, inst.dist, torch.arange(40).expand(40, 40)[~torch.eye(40, dtype=torch.bool)]
                  .view(40, 39))  # full neighbour lists: plain 2-opt
    assert _is_perm(out, 40)
    d = inst.dist.tolist()
    for t in out.tolist():
        for i, j in itertools.combinations(range(40), 2):
            a, b, c, e = t[i], t[(i + 1) % 40], t[j], t[(j + 1) % 40]
            assert d[a][c] + d[b][e] - d[a][b] - d[c][e] >= -1e-9
    before = inst.dist[tours, tours.roll(-1, 1)].sum(1)
    assert bool((inst.dist[out, out.roll(-1, 1)].sum(1) <= before).all())


@pytest.mark.parametrize("variant", ["as", "mmas"])
def test_shares_of_the_random_numbers_build_the_same_colony(variant: str) -> None:
    """What --procs P with --exchange 1 relies on: each rank's slice of the same draws builds
    exactly its ants' tours of the one colony (ACS is excluded: its local update couples the
    ants of a step; there the ranks replay all local updates to keep identical replicas)."""
    col, gen = _colony(20, variant, 0, ants=7)
    draws = Draws.draw(gen, col.n, 7)
    whole = col.construct(draws)
    parts = [col.construct(draws.share(*ant_slice(7, 3, r))) for r in range(3)]
    assert torch.equal(torch.cat(parts), whole)
    assert [ant_slice(7, 3, r) for r in range(3)] == [(0, 3), (3, 5), (5, 7)]


@pytest.mark.parametrize(("data", "needle"), [
    ({"ants": 0}, "--ants 0 must be >= 1"),
    ({"rho": 1.5}, "--rho 1.5 is out of range (0, 1)"),
    ({"alpha": -1.0}, "--alpha -1 is out of range"),
    ({"beta": float("nan")}, "--beta nan is out of range"),
    ({"variant": "mmax"}, "Did you mean 'mmas'"),
    ({"exchange": 5}, "--exchange 5 needs --procs 2"),
    ({"procs": 0}, "--procs 0 must be >= 1"),
    ({"variant": "acs", "alpha": 2.0}, "ACS's rule uses tau^1"),
    ({"tsp": "random:2"}, "a tour needs N >= 3"),
    ({"tsp": "random:ten"}, "expected random:N"),
    ({"tsp": "/nonexistent.tsp"}, "cannot read it"),
    ({"tsp": "random:20", "ants": 3, "procs": 4}, "every process needs at least one ant"),
    ({"tsp": "random:20", "target_gap": 0.01}, "--target-gap needs the optimum"),
])
def test_bad_input_is_refused_before_anything_starts(tmp_path: Path, data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        run_aco(ACOConfig.from_dict({"out": str(tmp_path / "run"), **data}), progress=False)
    assert needle in str(err.value), str(err.value)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


def test_cli_single_process_writes_the_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    assert main(["aco", "--tsp", "random:9:4", "--iterations", "15", "--ants", "9",
                 "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    for key in ("best_length", "best_tour", "optimum", "gap", "iterations", "wall_s", "tours_per_s",
                "bytes_sent"):
        assert key in s
    assert s["iterations"] == 15 and sorted(s["best_tour"]) == list(range(9))
    assert s["best_length"] == s["optimum"] and s["gap"] == 0.0
    rows = [json.loads(x) for x in (out / "iterations.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(1, 16))
    assert all(r["best"] <= r["iter_best"] <= r["mean"] for r in rows)
    for png in ("tour.png", "length_vs_iterations.png", "length_vs_time.png"):
        assert (out / png).stat().st_size > 1000
    assert main(["aco", "--tsp", "random:9", "--rho", "2"]) == 2
    assert "--rho 2 is out of range" in capsys.readouterr().err


@pytest.mark.slow  # long (seconds of training/sampling), not multi-process
def test_berlin52_mmas_2opt_reaches_the_optimum(tmp_path: Path) -> None:
    s = run_aco(ACOConfig.from_dict({"tsp": str(DATA / "berlin52.tsp"), "iterations": 40,
                                     "target_gap": 0.0, "out": str(tmp_path / "r")}), progress=False)
    assert s["best_length"] == 7542 and s["iterations"] <= 40
