"""`strads` schedules compared: priority (with the dependency check) vs random vs round-robin —
sweeps (coordinate updates / p) and seconds to come within 1e-3 of scikit-learn's Lasso
objective, on 2 workers, on the default problem (n=400, p=1000, 10 true non-zeros, correlated
groups of 5).

    python benchmarks/model_strads_schedules.py [--steps 1500] [--procs 2] [--repeats 5]

The three schedules alternate, the order reversed every repeat; median (min–max) over the repeats
(the random schedule draws with the job's seed, which is the same every repeat).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]


def optimum(lam: float) -> float:
    import torch
    from sklearn.linear_model import Lasso

    from polytrain.strategies.model.lasso import make_problem, objective

    pr = make_problem(400, 1000, 10, 5, 0.3, 0.5, 0)
    fit = Lasso(alpha=lam, fit_intercept=False, tol=1e-12, max_iter=100_000).fit(pr.x.numpy(), pr.y.numpy())
    beta = torch.tensor(fit.coef_)
    return objective(pr, beta, pr.y - pr.x @ beta, lam)


def main() -> None:
    from harness import alternating, fmt_spread, write_results

    import polytrain

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    best = optimum(0.2)
    schedules = ["priority", "random", "roundrobin"]
    runs: dict[str, list[dict[str, float | None]]] = {k: [] for k in schedules}
    for _, schedule in alternating(schedules, a.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            s = polytrain.train(strategy="strads", procs=a.procs, steps=a.steps, out=f"{tmp}/run",
                                sets=[f"schedule={schedule}"], report=False)
            events = [json.loads(x) for x in Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()]
        steps = [e for e in events if e["event"] == "step" and e["rank"] == 0]
        hit = next((e for e in steps if e["loss"] <= best * (1 + 1e-3)), None)
        m = s["strategy_metrics"]
        runs[schedule].append({"sweeps": hit["samples"] / 1000 if hit else None,
                               "seconds": hit["t"] if hit else None, "objective": m["objective"],
                               "nonzeros": m["nonzeros"], "updates/s": s["throughput_samples_per_s"]})
        print(schedule, runs[schedule][-1], flush=True)

    def med(rs: list[dict[str, float | None]], key: str, digits: int) -> str:
        vals = [r[key] for r in rs if r[key] is not None]
        return f"{fmt_spread(vals, digits)}, {len(vals)}/{len(rs)}" if vals else f"not reached, 0/{len(rs)}"

    rows = [{"schedule": k, "sweeps to 1e-3 (reached)": med(rs, "sweeps", 2),
             "seconds to 1e-3 (reached)": med(rs, "seconds", 2), "final objective": med(rs, "objective", 4),
             "optimum (sklearn)": best, "nonzeros": med(rs, "nonzeros", 0),
             "updates/s": med(rs, "updates/s", 0)} for k, rs in runs.items()]
    write_results("model_strads_schedules", rows, list(rows[0]), extra={"repeats": runs},
                  notes=f"{a.procs} workers x 4 coordinates per round, {a.steps} rounds, lambda 0.2; "
                        f"{a.repeats} repeats, the schedules alternating; median (min–max), and how many "
                        "repeats came within 1e-3 of the optimum.")

if __name__ == "__main__":
    main()
