"""Return curves of an RL run: vs wall-clock time and vs environment steps (PNG, no pyplot).

Each actor's training episodes are faint dots with a solid moving average (its ε in the legend:
in `apex` the greedy actors climb first); full greedy evaluations are black diamonds, the cheap
10-episode checks that came close hollow ones (checks that fell short early are not drawn); the
target is a dashed line and the moment it was reached a dotted one.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from polytrain.metrics.summary import RLSummary, read_summary

PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3",
           "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD")


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]


def _smooth(ys: list[float], k: int) -> np.ndarray:
    y = np.asarray(ys, dtype=float)
    if k <= 1 or len(y) < k:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    head = c[1:k] / np.arange(1, k)  # a growing window at the start instead of dropping points
    return np.concatenate([head, (c[k:] - c[:-k]) / k])


def _episode_series(events: list[dict[str, Any]]) -> dict[int, dict[str, list[float]]]:
    """Per actor: t, return, and the run's total env steps when the episode ended."""
    series: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    total = 0
    for e in events:
        if e["event"] != "episode":
            continue
        total += int(e["length"])  # all actors' steps so far, to within their unfinished episodes
        s = series[int(e["actor"])]
        s["t"].append(e["t"])
        s["steps"].append(total)
        s["ret"].append(e["ret"])
        s["eps"] = [e["epsilon"]]
    return series


def _when(ev: dict[str, Any], x: str) -> float:
    """Where an evaluation goes: when its network was taken (its start), or the env steps then."""
    return float(ev["t"] - ev.get("eval_s", 0.0)) if x == "t" else float(ev["env_steps"])


def _draw(ax: Axes, events: list[dict[str, Any]], summary: dict[str, Any], x: str) -> None:
    series = _episode_series(events)
    for i, (actor, s) in enumerate(sorted(series.items())):
        xs = s["t"] if x == "t" else s["steps"]
        col = PALETTE[i % len(PALETTE)]
        ax.scatter(xs, s["ret"], s=10, color=col, alpha=0.35, linewidths=0)
        label = f"actor {actor} (ε={s['eps'][0]:.3g})" if summary["algo"] != "dqn" else "training episodes"
        window = max(3, min(20, len(s["ret"]) // 10))  # long episodes are few: keep the mean recent
        ax.plot(xs, _smooth(s["ret"], window), color=col, linewidth=1.8,
                label=f"{label}: episodes, mean of {window}")
    screens = [e for e in events
               if e["event"] == "eval" and e["kind"] == "screen" and e["mean_return"] is not None]
    if screens:
        ax.scatter([_when(e, x) for e in screens],
                   [e["mean_return"] for e in screens], marker="D", s=30, facecolors="none",
                   edgecolors="black", zorder=5, label=f"greedy check ({screens[0]['episodes']} ep.)")
    evals = [e for e in events
             if e["event"] == "eval" and e["kind"] != "screen" and e["mean_return"] is not None]
    if evals:
        ax.scatter([_when(e, x) for e in evals],
                   [e["mean_return"] for e in evals], marker="D", s=45, color="black", zorder=5,
                   label=f"greedy eval ({evals[0]['episodes']} ep.)")
    target = summary.get("target_return")
    if target is not None:
        ax.axhline(target, color="#555555", linestyle="--", linewidth=1, label=f"target {target:g}")
    reached = summary.get("time_to_target_s") if x == "t" else summary.get("env_steps_to_target")
    if reached is not None:
        when = f"{reached:,.1f} s" if x == "t" else f"{reached:,} steps"
        ax.axvline(reached, color="#2a9d2a", linestyle=":", linewidth=1.5, label=f"target reached ({when})")


def write_plots(run_dir: Path) -> list[Path]:
    events = _events(run_dir)
    summary = read_summary(run_dir, RLSummary).to_dict()
    out = []
    axes = (("t", "return_vs_time.png", "wall-clock time since all processes started (s)"),
            ("steps", "return_vs_steps.png", "environment steps (all actors)"))
    for x, name, xlabel in axes:
        fig = Figure(figsize=(8.0, 4.8), layout="constrained")
        ax = fig.add_subplot()
        _draw(ax, events, summary, x)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("episode return")
        actors = summary["world_size"] if summary["algo"] == "dqn" else summary["config"]["actors"]
        what = "1 process" if summary["algo"] == "dqn" else \
            f"{actors} actors, {summary['world_size']} processes"
        ax.set_title(f"{summary['algo']} on {summary['env']} ({what}): return vs "
                     + ("time" if x == "t" else "environment steps"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        path = run_dir / name
        fig.savefig(path, dpi=110)
        out.append(path)
    return out
