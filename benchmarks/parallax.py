"""``hybrid-ps-ar`` (Parallax) against ``ps`` and ``allreduce`` on a sparse and a dense model.

    sudo .venv/bin/python benchmarks/parallax.py [--workers 4] [--nic 100mbit] [--steps 10] [--repeats 5]
    .venv/bin/python benchmarks/parallax.py --local       # no testbed: ranks on loopback

Testbed (needs root): every rank on its own emulated host, links shaped to ``--nic``. All three
run W workers on the same global batch (16 samples per worker) with plain SGD; ``allreduce`` and
``hybrid-ps-ar`` (``servers=0``: a server on every worker, as Parallax places them) use W hosts,
``ps`` (BSP, one server, its sparse pushes on) one more host for its server.

* sparse: ``sparse-bow`` on ``bow-ids`` — a 100,000 × 32 EmbeddingBag (12.8 MB, > 99 % of the
  parameters) + a small MLP; a step touches < 1 % of the embedding's rows;
* dense: ``cnn`` on ``synthetic-images`` (3×32×32; 530 k parameters, 2.1 MB of gradient);
* gpt (``--jobs gpt``): ``gpt-mini`` (d_model 32, 2 blocks) on ``chars`` (T = 32) with a
  100,000-row token embedding (``vocab=100000``) of which a step touches at most 256 rows.

Per run: seconds per step from worker 0's step clock (steps 1 to N−1, as ``ps_sharding.py``
measures, so start-up and the last step are left out), samples/s, bytes per step (polytrain's
counted bytes of all ranks, and the testbed's interface counters), and the final test accuracy.
Repeats are interleaved (A, B, C, C, B, A, …); the summary rows give median (min–max). All three
strategies are synchronous and, with SGD, train the same model as ``single`` step for step (their
oracle tests), so their accuracy after N steps is the same and time to any accuracy is in the
ratio of their step times: the accuracy column checks that, rather than a separate run to a target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from harness import alternating, fmt_spread, write_results  # noqa: E402

JOBS = {
    "sparse": ["--model", "sparse-bow", "--dataset", "bow-ids", "--lr", "0.5"],
    "dense": ["--model", "cnn", "--dataset", "synthetic-images", "--lr", "0.05"],
    "gpt": ["--model", "gpt-mini", "--dataset", "chars", "--set", "model.vocab=100000",
            "--set", "model.d_model=32", "--set", "data.seq_len=32", "--lr", "0.5"],
}
STRATEGIES = ("hybrid-ps-ar", "allreduce", "ps")


def _step_seconds(run: Path, rank: int) -> float:
    ts = [e["t"] for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
          if e["event"] == "step" and e["rank"] == rank]
    return (ts[-2] - ts[0]) / (len(ts) - 2)


def run(job: str, strategy: str, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    servers = 1 if strategy == "ps" else a.hybrid_servers if strategy == "hybrid-ps-ar" else 0
    procs = a.workers + servers
    train = ["train", "--strategy", strategy, "--procs", str(procs), *JOBS[job],
             "--steps", str(a.steps), "--batch-size", str(16 * a.workers), "--optimizer", "sgd",
             "--out", str(out), "--no-report", *(["--set", f"servers={servers}"] if servers else [])]
    testbed = [] if a.local else ["testbed", "--hosts", str(procs), "--nic", a.nic, "--"]
    cmd = [sys.executable, "-m", "polytrain", *testbed, *train]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    step_s = _step_seconds(out, int(strategy == "ps"))  # ps: servers first, worker 0 is rank 1
    wire = sum((s.get("testbed") or {}).get("wire_bytes_tx", {}).values())
    m = s["strategy_metrics"]
    return {"job": job, "strategy": strategy, "hosts": procs if not a.local else "-",
            "step ms": 1000 * step_s, "samples/s": 16 * a.workers / step_s,
            "MB/step counted": s["bytes_sent"] / a.steps / 1e6,
            "MB/step wire": wire / a.steps / 1e6 if wire else "-",
            "accuracy": s["eval"]["accuracy"],
            "paths": f"{m['ps_params']} ps / {m['allreduce_params']} allreduce" if "ps_params" in m else "-"}


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for job in JOBS:
        mine = [r for r in rows if r["job"] == job]
        ran = [s for s in STRATEGIES if any(r["strategy"] == s for r in mine)]
        if not mine:
            continue
        best = max(statistics.median(r["samples/s"] for r in mine if r["strategy"] == s)
                   for s in ran)
        for s in ran:
            rs = [r for r in mine if r["strategy"] == s]
            rate = [r["samples/s"] for r in rs]
            out.append({"job": job, "strategy": s, "hosts": rs[0]["hosts"], "repeat": "median (min–max)",
                        "step ms": fmt_spread([r["step ms"] for r in rs], 0),
                        "samples/s": fmt_spread(rate, 0),
                        "vs best": f"{statistics.median(rate) / best:.2f}",
                        "MB/step counted": fmt_spread([r["MB/step counted"] for r in rs], 2),
                        "accuracy": fmt_spread([r["accuracy"] for r in rs], 3)})
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--nic", default="100mbit")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--jobs", default="sparse,dense")
    p.add_argument("--local", action="store_true", help="ranks on loopback, no testbed")
    p.add_argument("--hybrid-servers", type=int, default=0,
                   help="hybrid-ps-ar's dedicated servers (0: one on every worker)")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    a = p.parse_args()
    chosen = a.strategies.split(",")
    tmp = Path(tempfile.mkdtemp())
    rows = []
    for job in a.jobs.split(","):
        for rep, strategy in alternating(chosen, a.repeats):
            row = {"repeat": rep, **run(job, strategy, a, tmp / f"{job}-{strategy}-{rep}")}
            rows.append(row)
            print(row, flush=True)
    where = "ranks on loopback (no link shaping)" if a.local else \
        f"one rank per emulated host at {a.nic} (polytrain testbed)"
    name = f"parallax_{a.jobs.replace(',', '_')}_{'local' if a.local else a.nic}" + \
        (f"_hybrid{a.hybrid_servers}servers" if a.hybrid_servers else "")
    write_results(name, summarise(rows), ["job", "strategy", "hosts", "step ms", "samples/s", "vs best",
                                          "MB/step counted", "accuracy"],
                  notes=f"{a.workers} workers, 16 samples each per step, SGD, {a.steps} steps per run "
                        f"(step time over steps 1..{a.steps - 1}), {a.repeats} interleaved repeats; "
                        f"{where}; ps has one more rank (its server), hybrid-ps-ar "
                        f"{a.hybrid_servers or 'no'} dedicated server rank(s); one torch thread per rank. "
                        "Bytes: polytrain's counted bytes of all ranks per step. Per-run rows "
                        "(with the interfaces' wire bytes) are in the JSON.",
                  extra={"runs": rows})


if __name__ == "__main__":
    main()
