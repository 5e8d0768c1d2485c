"""TSP instances: TSPLIB files (symmetric ``TYPE: TSP``) and random uniform instances.

Supported ``EDGE_WEIGHT_TYPE``: EUC_2D, CEIL_2D, ATT, GEO (with the TSPLIB rounding rules of
Reinelt's TSPLIB 95 documentation, §2) and EXPLICIT with every symmetric ``EDGE_WEIGHT_FORMAT``
(FULL_MATRIX, UPPER_ROW, LOWER_ROW, UPPER_DIAG_ROW, LOWER_DIAG_ROW and the four *_COL forms).

polytrain parses TSPLIB itself rather than through the ``tsplib95`` package: its errors carry no
line numbers (a malformed file must be refused naming the line and the field), and a parser of
these six distance rules is short. Every error is a :class:`ConfigError` raised before any
process starts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from itertools import permutations
from pathlib import Path

import torch

from polytrain.errors import ConfigError

COORD_TYPES = ("EUC_2D", "CEIL_2D", "ATT", "GEO")
FORMATS = ("FULL_MATRIX", "UPPER_ROW", "LOWER_ROW", "UPPER_DIAG_ROW", "LOWER_DIAG_ROW",
           "UPPER_COL", "LOWER_COL", "UPPER_DIAG_COL", "LOWER_DIAG_COL")
# Optimal tour lengths published with TSPLIB (used for the gap when the file does not say).
KNOWN_OPTIMA = {"berlin52": 7542, "eil51": 426, "kroA100": 21282, "eil76": 538, "st70": 675,
                "pr76": 108159, "rat99": 1211, "eil101": 629, "ch130": 6110, "ch150": 6528,
                "ulysses16": 6859, "ulysses22": 7013, "att48": 10628, "gr17": 2085, "gr24": 1272}
ENUMERATE_MAX = 9  # instances this small get their optimum by enumeration


@dataclass
class Instance:
    """A symmetric TSP: ``dist`` (N x N, float64, zero diagonal); ``coords`` when drawable."""

    name: str
    dist: torch.Tensor
    coords: torch.Tensor | None = None
    optimum: float | None = None
    source: str = ""
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.dist.shape[0])

    def tour_length(self, tour: list[int] | torch.Tensor) -> float:
        t = torch.as_tensor(tour, dtype=torch.long)
        return float(self.dist[t, t.roll(-1)].sum())


def _nint(x: torch.Tensor) -> torch.Tensor:
    return torch.floor(x + 0.5)


def coord_distances(xy: torch.Tensor, kind: str) -> torch.Tensor:
    """TSPLIB distances between all pairs of ``xy`` (N x 2, float64) under rule ``kind``."""
    dx = xy[:, None, 0] - xy[None, :, 0]
    dy = xy[:, None, 1] - xy[None, :, 1]
    if kind == "EUC_2D":
        d = _nint(torch.sqrt(dx * dx + dy * dy))
    elif kind == "CEIL_2D":
        d = torch.ceil(torch.sqrt(dx * dx + dy * dy))
    elif kind == "ATT":
        r = torch.sqrt((dx * dx + dy * dy) / 10.0)
        t = _nint(r)
        d = torch.where(t < r, t + 1, t)
    elif kind == "GEO":
        deg = torch.trunc(xy)
        rad = math.pi * (deg + 5.0 * (xy - deg) / 3.0) / 180.0
        lat, lon = rad[:, 0], rad[:, 1]
        q1 = torch.cos(lon[:, None] - lon[None, :])
        q2 = torch.cos(lat[:, None] - lat[None, :])
        q3 = torch.cos(lat[:, None] + lat[None, :])
        arg = (0.5 * ((1.0 + q1) * q2 - (1.0 - q1) * q3)).clamp(-1.0, 1.0)
        d = torch.trunc(6378.388 * torch.acos(arg) + 1.0)
    else:
        raise ValueError(kind)
    d.fill_diagonal_(0.0)
    return d


def _positions(fmt: str, n: int) -> list[tuple[int, int]]:
    """The (row, col) each number of an EXPLICIT section fills, in file order."""
    r = range(n)
    table = {
        "FULL_MATRIX": [(i, j) for i in r for j in r],
        "UPPER_ROW": [(i, j) for i in r for j in range(i + 1, n)],
        "LOWER_ROW": [(i, j) for i in r for j in range(i)],
        "UPPER_DIAG_ROW": [(i, j) for i in r for j in range(i, n)],
        "LOWER_DIAG_ROW": [(i, j) for i in r for j in range(i + 1)],
        "UPPER_COL": [(i, j) for j in r for i in range(j)],
        "LOWER_COL": [(i, j) for j in r for i in range(j + 1, n)],
        "UPPER_DIAG_COL": [(i, j) for j in r for i in range(j + 1)],
        "LOWER_DIAG_COL": [(i, j) for j in r for i in range(j, n)],
    }
    return table[fmt]


class _Reader:
    """Line-numbered access to a TSPLIB file; every error names the file, line and field."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.lines = path.read_text(errors="replace").splitlines()
        except OSError as e:
            raise ConfigError(f"--tsp {path}: cannot read it ({e.strerror}). Fix: give an existing "
                              "TSPLIB .tsp file, or random:N.") from None

    def fail(self, line: int, what: str) -> ConfigError:
        return ConfigError(f"{self.path}:{line}: {what}")

    def numbers(self, start: int, count: int, field_: str) -> tuple[list[tuple[float, int]], int]:
        """``count`` numbers from line index ``start`` on (each with its 1-based line number)."""
        out: list[tuple[float, int]] = []
        i = start
        while len(out) < count and i < len(self.lines):
            text = self.lines[i].strip()
            if re.match(r"^[A-Z_]+", text) and not re.match(r"^[-+.\d]", text):
                break
            for tok in text.split():
                try:
                    value = float(tok)
                except ValueError:
                    raise self.fail(i + 1, f"{field_}: '{tok}' is not a number.") from None
                if not math.isfinite(value):
                    raise self.fail(i + 1, f"{field_}: '{tok}' is not a finite number.")
                out.append((value, i + 1))
            i += 1
        if len(out) < count:
            raise self.fail(i + 1 if i < len(self.lines) else len(self.lines),
                            f"{field_}: expected {count} numbers, found {len(out)}.")
        return out, i


def _header(r: _Reader) -> tuple[dict[str, tuple[str, int]], dict[str, int]]:
    """Keyword lines (``KEY: value``) and where each data section starts."""
    keys: dict[str, tuple[str, int]] = {}
    sections: dict[str, int] = {}
    for i, raw in enumerate(r.lines):
        text = raw.strip()
        if not text or text == "EOF":
            continue
        m = re.match(r"^([A-Z_]+)\s*:\s*(.*)$", text)
        if m and m.group(1) != "COMMENT":
            keys.setdefault(m.group(1), (m.group(2).strip(), i + 1))
        elif m:
            keys.setdefault("COMMENT", (m.group(2).strip(), i + 1))
        elif text.endswith("_SECTION"):
            sections[text] = i + 1
    return keys, sections


def _dimension(r: _Reader, keys: dict[str, tuple[str, int]]) -> int:
    if "DIMENSION" not in keys:
        raise ConfigError(f"{r.path}: DIMENSION is missing. Fix: add 'DIMENSION: N' to the header.")
    value, line = keys["DIMENSION"]
    try:
        n = int(value)
    except ValueError:
        raise r.fail(line, f"DIMENSION: '{value}' is not an integer.") from None
    if n < 3:
        raise r.fail(line, f"DIMENSION: {n} cities; a tour needs N >= 3.")
    return n


def _explicit(r: _Reader, keys: dict[str, tuple[str, int]], sections: dict[str, int], n: int) -> torch.Tensor:
    fmt, fline = keys.get("EDGE_WEIGHT_FORMAT", ("", 0))
    if fmt not in FORMATS:
        raise (r.fail(fline, f"EDGE_WEIGHT_FORMAT: '{fmt}' is not supported; use one of "
                             f"{', '.join(FORMATS)}.") if fline else
               ConfigError(f"{r.path}: EXPLICIT weights need EDGE_WEIGHT_FORMAT ({', '.join(FORMATS)})."))
    if "EDGE_WEIGHT_SECTION" not in sections:
        raise ConfigError(f"{r.path}: EDGE_WEIGHT_SECTION is missing.")
    pos = _positions(fmt, n)
    nums, _ = r.numbers(sections["EDGE_WEIGHT_SECTION"], len(pos), "EDGE_WEIGHT_SECTION")
    d = torch.zeros(n, n, dtype=torch.float64)
    for (i, j), (v, line) in zip(pos, nums[: len(pos)], strict=True):
        if v < 0:
            raise r.fail(line, f"EDGE_WEIGHT_SECTION: negative weight {v:g} between {i + 1} and {j + 1}.")
        if fmt == "FULL_MATRIX" and j < i and v != d[j, i]:
            raise r.fail(line, f"EDGE_WEIGHT_SECTION: weight {i + 1}-{j + 1} is {v:g} but {j + 1}-{i + 1} "
                               f"is {float(d[j, i]):g}; only symmetric TSP is supported.")
        d[i, j] = d[j, i] = v
    d.fill_diagonal_(0.0)
    return d


def _coords(r: _Reader, sections: dict[str, int], n: int, section: str) -> torch.Tensor:
    if section not in sections:
        raise ConfigError(f"{r.path}: {section} is missing (needed by the coordinates' weight type).")
    nums, end = r.numbers(sections[section], 3 * n, section)
    more = end < len(r.lines) and re.match(r"^[-+.\d]", r.lines[end].strip())
    if len(nums) > 3 * n or more:
        raise r.fail(end + 1 if more else nums[3 * n][1],
                     f"{section}: DIMENSION says {n} cities but the section lists more. Fix: make "
                     "DIMENSION the number of cities listed.")
    xy = torch.zeros(n, 2, dtype=torch.float64)
    seen: set[int] = set()
    for k in range(n):
        (idx, line), (x, _), (y, _) = nums[3 * k: 3 * k + 3]
        if idx != int(idx) or not 1 <= idx <= n or int(idx) in seen:
            raise r.fail(line, f"{section}: node id {idx:g} must be a new integer in 1..{n}.")
        seen.add(int(idx))
        xy[int(idx) - 1] = torch.tensor([x, y], dtype=torch.float64)
    return xy


def read_tsplib(path: Path) -> Instance:
    """Parse a symmetric TSPLIB file; ConfigError names the line and field of any problem."""
    r = _Reader(path)
    keys, sections = _header(r)
    kind, kline = keys.get("TYPE", ("TSP", 0))
    if kind.split()[0] != "TSP":
        raise r.fail(kline, f"TYPE: '{kind}' is not supported; polytrain aco solves symmetric TSP only.")
    n = _dimension(r, keys)
    wtype, wline = keys.get("EDGE_WEIGHT_TYPE", ("", 0))
    coords = None
    if wtype in COORD_TYPES:
        coords = _coords(r, sections, n, "NODE_COORD_SECTION")
        dist = coord_distances(coords, wtype)
    elif wtype == "EXPLICIT":
        dist = _explicit(r, keys, sections, n)
        if "DISPLAY_DATA_SECTION" in sections:
            coords = _coords(r, sections, n, "DISPLAY_DATA_SECTION")
    else:
        where = f"{path}:{wline}: EDGE_WEIGHT_TYPE" if wline else f"{path}: EDGE_WEIGHT_TYPE"
        raise ConfigError(f"{where} '{wtype}' is not supported; use one of "
                          f"{', '.join(COORD_TYPES)}, EXPLICIT.")
    off = dist[~torch.eye(n, dtype=torch.bool)]
    if n > 1 and not bool((off > 0).any()):
        raise ConfigError(f"{path}: every city is at the same place (all distances 0): no tour is "
                          "shorter than another. Fix: give the cities' real coordinates.")
    name = keys.get("NAME", (path.stem, 0))[0] or path.stem
    return Instance(name, dist, coords, _optimum(name, keys, dist), str(path),
                    {k: v for k, (v, _) in keys.items()})


def _optimum(name: str, keys: dict[str, tuple[str, int]], dist: torch.Tensor) -> float | None:
    if name in KNOWN_OPTIMA:
        return float(KNOWN_OPTIMA[name])
    m = re.search(r"optimal tour length\s*:?\s*(\d+)", keys.get("COMMENT", ("", 0))[0], re.I)
    if m:
        return float(m.group(1))
    return enumerate_optimum(dist)[0] if dist.shape[0] <= ENUMERATE_MAX else None


def enumerate_optimum(dist: torch.Tensor) -> tuple[float, list[int]]:
    """The exact optimum of a small instance (city 0 fixed first): (length, tour)."""
    n = int(dist.shape[0])
    d = dist.tolist()
    best, best_tour = math.inf, list(range(n))
    for perm in permutations(range(1, n)):
        if perm[0] > perm[-1]:
            continue  # each direction once
        tour = (0, *perm)
        length = sum(d[tour[i]][tour[(i + 1) % n]] for i in range(n))
        if length < best:
            best, best_tour = length, list(tour)
    return best, best_tour


def random_instance(n: int, seed: int = 0) -> Instance:
    """N cities uniform in a 1000 x 1000 square, EUC_2D distances (integers, as TSPLIB)."""
    if n < 3:
        raise ConfigError(f"random:{n}: a tour needs N >= 3 cities. Fix: random:10 or more.")
    g = torch.Generator().manual_seed(seed)
    xy = torch.floor(torch.rand(n, 2, generator=g, dtype=torch.float64) * 1000.0)
    dist = coord_distances(xy, "EUC_2D")
    opt = enumerate_optimum(dist)[0] if n <= ENUMERATE_MAX else None
    return Instance(f"random{n}-s{seed}", dist, xy, opt, f"random:{n}:{seed}")


# TSPLIB instances shipped with the package (berlin52, eil51, kroA100): ``--tsp berlin52.tsp``
# finds them when no such file exists where the user runs.
SHIPPED = Path(__file__).resolve().parent / "data"


def load_instance(spec: str) -> Instance:
    """``FILE.tsp`` (a bare name not found here: a shipped instance) or ``random:N[:SEED]``."""
    if spec.startswith("random:"):
        parts = spec.split(":")
        try:
            n = int(parts[1])
            seed = int(parts[2]) if len(parts) > 2 else 0
            if len(parts) > 3:
                raise ValueError
        except (ValueError, IndexError):
            raise ConfigError(f"--tsp {spec}: expected random:N or random:N:SEED with integers, "
                              "e.g. random:100.") from None
        return random_instance(n, seed)
    path = Path(spec)
    if not path.exists() and path.parent == Path() and (SHIPPED / path.name).is_file():
        path = SHIPPED / path.name
    return read_tsplib(path)
