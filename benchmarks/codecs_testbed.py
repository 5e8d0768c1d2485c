"""Gradient codecs on the emulated testbed (needs root): 4 hosts at 100 Mbit/s, ``allreduce``, a
VGG-16-shaped CNN and gpt-mini; bytes reduction, accuracy and time to a stated target accuracy
against uncompressed ``allreduce`` and PyTorch's PowerSGD hook, in the same run.

    sudo .venv/bin/python benchmarks/codecs_testbed.py --job vgg [--repeats 5] [--hosts 4] [--nic 100mbit]
    sudo .venv/bin/python benchmarks/codecs_testbed.py --job gpt [--repeats 5]
    sudo .venv/bin/python benchmarks/codecs_testbed.py --job cnn [--repeats 5]
    sudo .venv/bin/python benchmarks/codecs_testbed.py --job gpt-momentum [--repeats 5] [--budget-min 28]
    sudo .venv/bin/python benchmarks/codecs_testbed.py --job gpt-momentum --steps 600 \
        --cases "uncompressed,powersgd rank 2,dgc momentum 1% zstd,dgc momentum 0.5% zstd" \
        --name codecs_testbed_gpt-momentum_600
    sudo .venv/bin/python benchmarks/codecs_testbed.py --job vgg-momentum [--repeats 5]
    sudo .venv/bin/python benchmarks/codecs_testbed.py --job gpt \
        --cases "uncompressed,fp16,topk 10% zstd,dgc 10% zstd" --name codecs_testbed_gpt_moderate

Job ``cnn`` (SGD with momentum 0.9, where top-k with error feedback and DGC's momentum correction
are designed to work): the zoo ``cnn`` at ``model.channels=32``, ``model.hidden=512`` (2 conv + 2
FC, 0.55 M parameters, 2.2 MB of float32 gradient per step, about vgg's size) on ``digits``, lr
0.05, 200 steps, target 0.95 test accuracy, evaluated every 10 steps. Its cases: uncompressed,
PowerSGD rank 2, fp16, ``dgc`` at 1 % + zstd with its momentum correction (momentum 0.9 in the
codec, plain SGD in the optimizer, warm-up over 25 encodings) and ``topk+onebit`` at 1 % + zstd.

Job ``gpt-momentum``: ``gpt-mini`` on ``chars`` with SGD momentum 0.9, lr 0.3 (lr 0.5 and 1.0
diverged, 0.15 learned slower: single-process exploratory runs), 300 steps, target 0.38
next-character accuracy (with SGD gpt-mini reaches ~0.39 in 300 steps, Adam 0.53). Its cases:
uncompressed, PowerSGD rank 2, ``dgc`` 1 % + zstd with its momentum correction (plain SGD in the
optimizer), ``topk+onebit`` and ``topk`` at 1 % + zstd.

Job ``vgg-momentum``: ``vgg16`` at ``model.width=4`` with ``model.batch_norm=true`` (VGG-16-BN,
which trains with SGD + momentum where the plain shape stays at chance) on 2-class
``synthetic-images``, lr 0.02, 300 steps, target 0.65; cases: uncompressed, PowerSGD rank 2,
``dgc`` at 1 % and 0.5 % + zstd with its momentum correction (plain SGD in the optimizer).

Jobs ``vgg`` and ``gpt`` (Adam for all cases: VGG-16's shape without batch norm does not leave
chance level in 600 SGD steps on this data; measured):

* ``vgg``: ``vgg16`` at ``model.width=4`` (13 conv + 3 FC, 0.49 M parameters, 2.0 MB of float32
  gradient per step) on ``synthetic-images`` with ``data.classes=2``, Adam lr 1e-3, 300 steps,
  target 0.65 test accuracy;
* ``gpt``: ``gpt-mini`` (0.14 M parameters) on ``chars``, Adam lr 3e-3, 300 steps, target 0.50
  next-character accuracy.

Global batch 64 (16 per host), one rank and one torch thread per emulated host, evaluation on
rank 0 every 25 steps. Cases (default): uncompressed (gloo all-reduce), PyTorch's ``powerSGD_hook`` (rank
2), ``dgc`` at 1 % + ``entropy=zstd`` and ``topk+onebit`` at 1 % + ``entropy=zstd`` (error feedback
on). ``dgc`` runs with ``dgc_momentum=0`` (Adam keeps the momentum; what is left of DGC is top-k
with error feedback and its sparsity warm-up, 25 % → 1 % over 50 encodings): in one exploratory
300-step run each on vgg, ``topk`` and ``topk+onebit`` at 1 % and 5 % without the warm-up stayed
at chance level (0.494), ``dgc`` reached 0.663.
Repeats interleaved (A, B, C, D, D, C, B, A, …), seed = repeat; median (min–max).
Time to accuracy: the first evaluation at or above the target, in seconds since the start barrier.
A run that diverges (NaN/inf parameters: DivergedError) is a result, not a failure of the
benchmark: it counts in "diverged", with its time to the target if it got there first, and
leaves final accuracy and bytes to the runs that finished.
Bytes: polytrain's count at each send (``bytes_sent``, every rank; for the sparse codecs the size
exchange of the variable-size payloads is included) and the testbed's interface counters
(``wire_bytes_tx``: frames with headers), per rank and step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from harness import alternating, fmt_spread, write_results  # noqa: E402

ADAM = {"optimizer": "adam", "steps": 300, "eval_every": 25}
JOBS: dict[str, dict[str, Any]] = {
    "vgg": {"args": ["--model", "vgg16", "--set", "model.width=4", "--dataset", "synthetic-images",
                     "--set", "data.classes=2", "--lr", "0.001"], "target": 0.65, **ADAM},
    "gpt": {"args": ["--model", "gpt-mini", "--dataset", "chars", "--lr", "0.003"], "target": 0.50, **ADAM},
    # VGG-16-BN: with batch norm the shape trains with SGD + momentum (lr 0.02: 0.734 after 300
    # single-process steps; 0.05: 0.732, 0.1: 0.601 — exploratory, one run each)
    "vgg-momentum": {"args": ["--model", "vgg16", "--set", "model.width=4", "--set", "model.batch_norm=true",
                              "--dataset", "synthetic-images", "--set", "data.classes=2", "--lr", "0.02"],
                     "target": 0.65, "optimizer": "momentum", "steps": 300, "eval_every": 25},
    "gpt-momentum": {"args": ["--model", "gpt-mini", "--dataset", "chars", "--lr", "0.3"], "target": 0.38,
                     "optimizer": "momentum", "steps": 300, "eval_every": 25},
    "cnn": {"args": ["--model", "cnn", "--set", "model.channels=32", "--set", "model.hidden=512",
                     "--dataset", "digits", "--lr", "0.05"], "target": 0.95,
            "optimizer": "momentum", "steps": 200, "eval_every": 10},
}
CASES: dict[str, list[str]] = {
    "uncompressed": [],
    "powersgd rank 2": ["compression=powersgd", "powersgd_rank=2"],
    "dgc 1% zstd": ["compression=dgc", "ratio=0.01", "entropy=zstd", "dgc_momentum=0", "dgc_warmup=50"],
    "topk+onebit 1% zstd": ["compression=topk+onebit", "ratio=0.01", "entropy=zstd"],
    "topk 1% zstd": ["compression=topk", "ratio=0.01", "entropy=zstd"],
    "topk+onebit 5% zstd": ["compression=topk+onebit", "ratio=0.05", "entropy=zstd"],
    "fp16": ["compression=fp16"],
    "topk 10% zstd": ["compression=topk", "ratio=0.1", "entropy=zstd"],
    "dgc 10% zstd": ["compression=dgc", "ratio=0.1", "entropy=zstd", "dgc_momentum=0", "dgc_warmup=50"],
    # DGC as designed: its momentum correction (0.9) replaces the optimizer's momentum (plain SGD)
    "dgc momentum 1% zstd": ["compression=dgc", "ratio=0.01", "entropy=zstd", "dgc_warmup=25"],
    "dgc momentum 0.5% zstd": ["compression=dgc", "ratio=0.005", "entropy=zstd", "dgc_warmup=25"],
    # DGC's per-layer selection: each tensor's largest entries, not the whole bucket's
    "dgc momentum 1% tensor zstd": ["compression=dgc", "ratio=0.01", "entropy=zstd", "dgc_warmup=25",
                                    "select=tensor"],
    "dgc momentum 0.5% tensor zstd": ["compression=dgc", "ratio=0.005", "entropy=zstd", "dgc_warmup=25",
                                      "select=tensor"],
    # no sparsity warm-up (its first encodings at up to 25 % cost bytes), values as fp16 or as
    # qsgd's 8-bit levels + sign (one norm per parameter; error feedback keeps what rounding lost)
    "dgc momentum 1% tensor zstd no-warmup": ["compression=dgc", "ratio=0.01", "entropy=zstd",
                                              "select=tensor"],
    "dgc momentum 5% tensor zstd no-warmup": ["compression=dgc", "ratio=0.05", "entropy=zstd",
                                              "select=tensor"],
    "dgc momentum 10% tensor zstd no-warmup": ["compression=dgc", "ratio=0.1", "entropy=zstd",
                                               "select=tensor"],
    "dgc+fp16 momentum 1% zstd no-warmup": ["compression=dgc+fp16", "ratio=0.01", "entropy=zstd"],
    "dgc+qsgd255 momentum 1% zstd no-warmup": ["compression=dgc+qsgd", "levels=255", "ratio=0.01",
                                               "entropy=zstd"],
    "dgc+qsgd255 momentum 1% tensor zstd no-warmup": ["compression=dgc+qsgd", "levels=255", "ratio=0.01",
                                                      "entropy=zstd", "select=tensor"],
    # without momentum factor masking: sent entries keep their velocity (momentum SGD at ratio 1)
    "dgc momentum 1% tensor zstd no-warmup no-mask": ["compression=dgc", "ratio=0.01", "entropy=zstd",
                                                      "select=tensor", "dgc_masking=false"],
    "dgc momentum 5% tensor zstd no-warmup no-mask": ["compression=dgc", "ratio=0.05", "entropy=zstd",
                                                      "select=tensor", "dgc_masking=false"],
    # the same with 1-bit values (one pair of means per parameter): DGC's selection, onebit's size
    "dgc+onebit momentum 1% zstd": ["compression=dgc+onebit", "ratio=0.01", "entropy=zstd", "dgc_warmup=25"],
}
# cases whose momentum lives in the codec
PLAIN_SGD = {case for case, sets in CASES.items()
             if any(x.startswith("compression=dgc") for x in sets) and "dgc_momentum=0" not in sets}
DEFAULT_CASES = {"vgg": "uncompressed,powersgd rank 2,dgc 1% zstd,topk+onebit 1% zstd",
                 "gpt": "uncompressed,powersgd rank 2,dgc 1% zstd,topk+onebit 1% zstd",
                 "cnn": "uncompressed,powersgd rank 2,fp16,dgc momentum 1% zstd,topk+onebit 1% zstd",
                 "vgg-momentum": "uncompressed,powersgd rank 2,dgc momentum 1% zstd,dgc momentum 0.5% zstd",
                 "gpt-momentum": ("uncompressed,powersgd rank 2,dgc momentum 1% zstd,topk+onebit 1% zstd,"
                                  "topk 1% zstd")}


def run(job: str, case: str, seed: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    sets = [x for s in CASES[case] for x in ("--set", s)]
    j = JOBS[job]
    optimizer = "sgd" if case in PLAIN_SGD else j["optimizer"]
    train = ["train", "--strategy", "allreduce", "--procs", str(a.hosts), *j["args"], *sets,
             "--steps", str(a.steps or j["steps"]), "--batch-size", str(16 * a.hosts),
             "--optimizer", optimizer,
             "--seed", str(seed), "--eval-every", str(j["eval_every"]), "--out", str(out), "--no-report"]
    testbed = ["testbed", "--hosts", str(a.hosts), "--nic", a.nic, "--"]
    cmd = [sys.executable, "-m", "polytrain", *testbed, *train]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True, env=env)
    if done.returncode:
        diverged = _diverged(job, case, seed, out)
        if diverged is not None:  # a result: the case does not train at this setting
            return diverged
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    events = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    evals = [e for e in events if e["event"] == "eval"]
    target = JOBS[job]["target"]
    tta = next((e["t"] for e in evals if e["accuracy"] >= target), None)
    wire = sum((s.get("testbed") or {}).get("wire_bytes_tx", {}).values())
    codec = s["strategy_metrics"].get("codec", {})
    return {"job": job, "case": case, "seed": seed, "tta_s": tta, "accuracy": s["eval"]["accuracy"],
            "wall_s": s.get("wall_s"), "samples_per_s": s["throughput_samples_per_s"],
            "bytes_per_rank_step": s["bytes_sent"] / a.hosts / s["steps"],
            "wire_per_rank_step": wire / a.hosts / s["steps"] if wire else None,
            "ratio_vs_fp32": codec.get("ratio_vs_fp32"),
            "codec_ms": 1e3 * codec.get("codec_s_per_step", 0.0) if codec else None,
            "evals": [(e["step"], round(e["t"], 3), e["accuracy"]) for e in evals]}


def _diverged(job: str, case: str, seed: int, out: Path) -> dict[str, Any] | None:
    """The record of a run that stopped with DivergedError (NaN/inf parameters), else None:
    its evaluations until then, no final accuracy and no bytes (it wrote no summary)."""
    err = out / "ranks" / "rank0.error.json"
    if not err.exists() or "DivergedError" not in json.loads(err.read_text()).get("error", ""):
        return None
    events = map(json.loads, (out / "ranks" / "rank0.jsonl").read_text().splitlines())
    evals = [e for e in events if e.get("event") == "eval"]
    tta = next((e["t"] for e in evals if e["accuracy"] >= JOBS[job]["target"]), None)
    return {"job": job, "case": case, "seed": seed, "tta_s": tta, "accuracy": None,
            "diverged_at": json.loads(err.read_text()).get("step"), "wall_s": None, "samples_per_s": None,
            "bytes_per_rank_step": None, "wire_per_rank_step": None, "ratio_vs_fp32": None,
            "codec_ms": None, "evals": [(e["step"], round(e["t"], 3), e["accuracy"]) for e in evals]}


def paired(runs: list[dict[str, Any]], base: list[dict[str, Any]]) -> str:
    """Final accuracy minus uncompressed's with the same seed, in points: median (min–max)."""
    by_seed = {r["seed"]: r["accuracy"] for r in base}
    diffs = [100 * (r["accuracy"] - by_seed[r["seed"]]) for r in runs if r["seed"] in by_seed]
    return fmt_spread(diffs, 1) if diffs else "-"


def summarise(job: str, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    target = JOBS[job]["target"]
    med = statistics.median
    base = [r for r in runs if r["case"] == "uncompressed" and r["accuracy"] is not None]
    base_bytes, base_acc = med(r["bytes_per_rank_step"] for r in base), med(r["accuracy"] for r in base)
    base_tta = [r["tta_s"] for r in base if r["tta_s"] is not None]
    rows = []
    for case in CASES:
        rs = [r for r in runs if r["case"] == case]
        if not rs:
            continue
        reached = [r["tta_s"] for r in rs if r["tta_s"] is not None]
        ok = [r for r in rs if r["accuracy"] is not None]  # the runs that did not diverge
        wire = [r["wire_per_rank_step"] for r in ok if r["wire_per_rank_step"]]
        b = med(r["bytes_per_rank_step"] for r in ok) if ok else None
        codec = [r["codec_ms"] for r in ok]
        rows.append({
            "job": job, "case": case,
            f"time to {target:.2f} s": fmt_spread(reached, 1) if reached else "never",
            "reached": f"{len(reached)}/{len(rs)}",
            "diverged": f"{len(rs) - len(ok)}/{len(rs)}",
            "vs uncompressed": f"{med(base_tta) / med(reached):.2f}x" if reached and base_tta else "-",
            "final accuracy": fmt_spread([r["accuracy"] for r in ok], 3) if ok else "-",
            "Δ accuracy (points)": f"{100 * (med(r['accuracy'] for r in ok) - base_acc):+.1f}" if ok else "-",
            "Δ paired by seed (points)": paired(ok, base) if case != "uncompressed" else "-",
            "samples/s": fmt_spread([r["samples_per_s"] for r in ok], 0) if ok else "-",
            "codec ms/step (rank 0)": (fmt_spread(codec, 0) if ok and all(c is not None for c in codec)
                                       else "-"),
            "counted bytes/step/rank": f"{b:,.0f}" if b else "-",
            "wire bytes/step/rank": f"{med(wire):,.0f}" if wire else "-",
            "bytes reduction": f"{base_bytes / b:.1f}x" if b else "-",
        })
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", choices=sorted(JOBS), required=True)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--nic", default="100mbit")
    p.add_argument("--steps", type=int, default=0, help="default: the job's (300; cnn 200)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cases", default="", help="comma-separated, of: " + ", ".join(CASES).replace("%", "%%"))
    p.add_argument("--name", default="", help="results file name (default codecs_testbed_JOB)")
    p.add_argument("--budget-min", type=float, default=0.0,
                   help="start no repeat that the last one's duration says would end past this many "
                        "minutes (whole repeats only; 0: no limit)")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="codecs-testbed-"))
    runs: list[dict[str, Any]] = []
    t0 = last_round = time.monotonic()
    round_s, at = 0.0, -1
    for rep, case in alternating((a.cases or DEFAULT_CASES[a.job]).split(","), a.repeats):
        if rep != at:  # a new repeat of every case
            now = time.monotonic()
            round_s, last_round, at = (now - last_round if at >= 0 else 0.0), now, rep
            if a.budget_min and at > 0 and now - t0 + round_s > 60 * a.budget_min:
                print(f"budget: stopping after {rep} repeats ({(now - t0) / 60:.1f} min)", flush=True)
                a.repeats = rep
                break
        r = run(a.job, case, rep, a, tmp / f"{case.replace(' ', '_')}-{rep}")
        runs.append(r)
        print({k: v for k, v in r.items() if k != "evals"}, flush=True)
    if not any(r["case"] == "uncompressed" and r["accuracy"] is not None for r in runs):
        raise SystemExit("no uncompressed run finished: nothing to compare against")
    rows, job = summarise(a.job, runs), JOBS[a.job]
    write_results(a.name or f"codecs_testbed_{a.job}", rows, list(rows[0]), extra={"runs": runs},
                  notes=f"allreduce on {a.hosts} emulated hosts at {a.nic} (polytrain testbed), one rank "
                        f"and one torch thread per host, global batch {16 * a.hosts}, {job['optimizer']} "
                        f"(dgc momentum: plain SGD), {a.steps or job['steps']} "
                        f"steps, seed = repeat, {a.repeats} interleaved repeats; median (min–max). Target "
                        f"{job['target']} test accuracy (evaluated every {job['eval_every']} steps on "
                        "rank 0). "
                        "'vs uncompressed': its median time to the target over the case's. 'Δ accuracy': "
                        "final accuracy, median, minus uncompressed's; 'Δ paired': each run's final "
                        "accuracy minus the uncompressed run's with the same seed. Counted bytes: "
                        "polytrain's count at the sends; wire bytes: the hosts' interface counters "
                        "(frames with headers). The 2 cores are shared by the 4 hosts' ranks and the "
                        "link shaping.")


if __name__ == "__main__":
    main()
