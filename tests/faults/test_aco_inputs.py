"""ACO inputs that tracebacked or were accepted silently (issue 50, item 11): each refused in
one line naming the file, line and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from polytrain.aco.tsp import read_tsplib
from polytrain.errors import ConfigError


def _tsp(tmp_path: Path, dimension: int, coords: list[tuple[str, str]]) -> Path:
    body = "".join(f"{i} {x} {y}\n" for i, (x, y) in enumerate(coords, start=1))
    path = tmp_path / "t.tsp"
    path.write_text(f"NAME: t\nTYPE: TSP\nDIMENSION: {dimension}\nEDGE_WEIGHT_TYPE: EUC_2D\n"
                    f"NODE_COORD_SECTION\n{body}EOF\n")
    return path


@pytest.mark.parametrize(("dimension", "coords", "says"), [
    (3, [("0", "0"), ("nan", "1"), ("2", "2")], "'nan' is not a finite number"),
    (3, [("0", "0"), ("1", "inf"), ("2", "2")], "'inf' is not a finite number"),
    (3, [("5", "5")] * 3, "every city is at the same place"),
    (5, [(str(i), str(i * i)) for i in range(12)], "DIMENSION says 5 cities but the section lists more"),
])
def test_bad_tsp_files_are_refused_in_one_line(tmp_path: Path, dimension: int,
                                                coords: list[tuple[str, str]], says: str) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        read_tsplib(_tsp(tmp_path, dimension, coords))
    assert "\n" not in str(err.value)


def test_a_good_file_still_reads(tmp_path: Path) -> None:
    assert read_tsplib(_tsp(tmp_path, 4, [("0", "0"), ("0", "3"), ("4", "3"), ("4", "0")])).n == 4
