"""The run directory of ``polytrain aco``: ``config.json``, ``iterations.jsonl`` (one line per
iteration, written by rank 0 as it goes), ``summary.json`` and three pictures: ``tour.png`` (the
best tour over the cities), ``length_vs_iterations.png`` and ``length_vs_time.png``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from matplotlib.figure import Figure

from polytrain.aco.config import ACOConfig
from polytrain.aco.tsp import Instance
from polytrain.metrics.summary import ACOSummary


class IterationLog:
    """Rank 0's ``iterations.jsonl``, flushed every line (the launcher's progress bar tails it)."""

    def __init__(self, path: Path | None) -> None:
        self.rows: list[dict[str, Any]] = []
        self._f: IO[str] | None = path.open("a") if path is not None else None

    def __call__(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self._f is not None:
            self._f.write(json.dumps(row) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def time_to_gap(rows: list[dict[str, Any]], gap: float) -> float | None:
    for r in rows:
        if r.get("gap") is not None and r["gap"] <= gap + 1e-12:
            return float(r["t"])
    return None


def build_summary(cfg: ACOConfig, inst: Instance, rows: list[dict[str, Any]],
                  ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """``ranks``: each rank's outcome (best tour, comm summary); rank 0 first."""
    lead = ranks[0]
    optimum = cfg.optimum if cfg.optimum is not None else inst.optimum
    wall = max(r["wall_s"] for r in ranks)
    tours = sum(r["tours"] for r in ranks)
    exchanges = lead["exchanges"] if cfg.exchange > 1 else lead["iterations"] if cfg.procs > 1 else 0
    sent = sum(r.get("bytes_sent", 0) for r in ranks)
    return {
        "instance": inst.name, "source": inst.source, "n": inst.n,
        "variant": cfg.variant, "local_search": cfg.local_search, "ants": cfg.ants,
        "procs": cfg.procs, "exchange": cfg.exchange, "seed": cfg.seed,
        "best_length": lead["best_length"], "best_tour": lead["best_tour"],
        "optimum": optimum,
        "gap": None if optimum is None else lead["best_length"] / optimum - 1.0,
        "iterations": lead["iterations"], "wall_s": wall, "tours": tours,
        "tours_per_s": tours / wall if wall > 0 else None,
        "time_per_iteration_s": wall / max(1, lead["iterations"]),
        "time_to_1pct_s": time_to_gap(rows, 0.01), "time_to_2pct_s": time_to_gap(rows, 0.02),
        "restarts": lead["restarts"], "exchanges": exchanges,
        "bytes_sent": sent, "bytes_per_exchange": sent / exchanges if exchanges else 0.0,
        "per_rank": ranks, "config": cfg.to_dict(),
    }


def write_run(run_dir: Path, summary: dict[str, Any], inst: Instance, rows: list[dict[str, Any]],
              plots: bool = True) -> list[Path]:
    ACOSummary.of(summary).write(run_dir)
    if not plots:
        return []
    return [draw_tour(run_dir / "tour.png", inst, summary),
            draw_curves(run_dir / "length_vs_iterations.png", rows, "iteration", summary),
            draw_curves(run_dir / "length_vs_time.png", rows, "t", summary)]


def draw_tour(path: Path, inst: Instance, s: dict[str, Any]) -> Path:
    fig = Figure(figsize=(6, 6))
    ax = fig.add_subplot()
    title = f"{inst.name}: best {s['best_length']:,.0f}"
    if s["gap"] is not None:
        title += f" (optimum {s['optimum']:,.0f}, gap {100 * s['gap']:.2f} %)"
    if inst.coords is None:
        ax.text(0.5, 0.5, "explicit distances: no coordinates to draw", ha="center", va="center")
    else:
        xy = inst.coords[s["best_tour"] + s["best_tour"][:1]].numpy()
        ax.plot(xy[:, 0], xy[:, 1], "-", color="#4C72B0", lw=1.2)
        ax.plot(inst.coords[:, 0].numpy(), inst.coords[:, 1].numpy(), "o", color="#C44E52", ms=3)
        ax.set_aspect("equal", adjustable="datalim")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def draw_curves(path: Path, rows: list[dict[str, Any]], x: str, s: dict[str, Any]) -> Path:
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    xs = [r[x] for r in rows]
    ax.plot(xs, [r["mean"] for r in rows], color="#8C8C8C", lw=0.8, label="iteration mean")
    ax.plot(xs, [r["iter_best"] for r in rows], color="#DD8452", lw=0.8, label="iteration best")
    ax.plot(xs, [r["best"] for r in rows], color="#4C72B0", lw=1.6, label="best so far")
    if s["optimum"] is not None:
        ax.axhline(s["optimum"], color="k", ls="--", lw=0.8, label="optimum")
    ax.set_xlabel("iteration" if x == "iteration" else "wall-clock time (s)")
    ax.set_ylabel("tour length")
    ax.set_title(f"{s['instance']} — {s['variant']}, {s['ants']} ants, {s['procs']} process(es)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
