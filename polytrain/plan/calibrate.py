"""``polytrain testbed calibrate --model M --out cal.json``: measure what a model's steps cost on
the testbed beyond its profile, and write the calibration file ``polytrain plan --calibration`` and
``polytrain testbed --calibration`` read (`plan.calibration`); and what ``polytrain testbed
--calibration F`` does with one before any host starts (`checked_calibration`, `resolve_auto`).

The probes are real testbed jobs of the model (`run_testbed`, ``polytrain train`` under one torchrun
agent per emulated host), each run ``--repeats`` times, read by `testbed.probes`:

- ``single`` on one emulated host: one rank computes the whole batch alone; its own trace's
  forward and backward per step over the profile's give the forward and compute scales
  (`probe_scales`; any model, buffers included, runs it);
- ``gpipe microbatches=4`` (fewer where 4 does not divide the batch): two pipeline stages; the
  step's time outside compute and blocking receives, per action, is the executor's own time
  (`probe_action_overheads`);
- ``local-sgd period=0``: two data-parallel ranks that never exchange; the step less its compute,
  per pass, is the runtime's own time (`probe_pass_overheads`).

The emulation part is the testbed's construction (its hosts share this machine's cores, its shaper's
bucket and frame overhead: `plan.predict.testbed_calibration`) plus, with ``--hops FILE``, the time
per message of a collective a ``benchmarks/plan_hops.py`` record measured. Nothing is fitted to
training runs: a file made this way prices scenarios it never saw.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polytrain.errors import ConfigError
from polytrain.flags import add_model_flags, model_overrides

if TYPE_CHECKING:
    from rich.console import Console

    from polytrain.config import JobConfig
    from polytrain.plan.calibration import Calibration
    from polytrain.testbed.job import Bed

Probe = tuple[str, dict[str, Any], int]  # strategy, options, emulated hosts (one process each)


def probes_for(batch: int) -> tuple[Probe, ...]:
    """The probes of a model trained at global ``batch``: one rank computing alone, two pipeline
    stages (4 micro-batches, or the most of 3, 2, 1 that divide the batch), two replicas that
    never exchange."""
    micro = next(m for m in (4, 3, 2, 1) if batch % m == 0)
    return (("single", {}, 1), ("gpipe", {"microbatches": micro}, 2), ("local-sgd", {"period": 0}, 2))
SKIP = 2  # warm-up steps each probe's statistics leave out (`probes.step_times`, `span_stats`)


@dataclass(frozen=True)
class CalibrateJob:
    """A calibration the command line has parsed and validated."""

    cfg: JobConfig
    nic: str
    steps: int
    repeats: int
    out: Path
    hops: dict[str, Any] | None
    command: str
    probes: tuple[Probe, ...]


def build_calibrate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="polytrain testbed calibrate",
        description="Run a model's probes on the testbed (root) and write a calibration file for "
                    "`polytrain plan --calibration` and `polytrain testbed --calibration`.")
    add_model_flags(p)
    p.add_argument("--nic", default="1gbit", help="the probes' link rate per host; default 1gbit")
    p.add_argument("--steps", type=int, default=20, help="steps per probe job; default 20")
    p.add_argument("--repeats", type=int, default=3,
                   help="jobs per probe (each term is the median over them); default 3")
    p.add_argument("--hops", metavar="FILE",
                   help="a benchmarks/plan_hops.py results JSON: the testbed's time per collective "
                        "step and direct message (default: not measured, priced as nothing)")
    p.add_argument("--out", required=True, help="the calibration file to write, e.g. cal.json")
    return p


def parse_calibrate(argv: list[str]) -> CalibrateJob:
    """Parse and validate every input (one error line naming the rule, the value and the fix)
    before any testbed or process starts."""
    import json

    from polytrain.config import load_config
    from polytrain.launch.prepare import prepare
    from polytrain.testbed import netns

    a = build_calibrate_parser().parse_args(argv)
    if a.steps < SKIP + 3:
        raise ConfigError(f"--steps {a.steps}: a probe leaves out its first {SKIP} steps and needs 3 "
                          f"after them. Fix: --steps {SKIP + 3} or more (default 20).")
    if a.repeats < 1:
        raise ConfigError(f"--repeats {a.repeats}: each probe runs at least once. Fix: --repeats 1 or more.")
    netns.parse_rate(a.nic)  # its own one-line refusal
    out = Path(a.out)
    if not a.out.strip() or out.is_dir():
        raise ConfigError(f"--out '{a.out}' is not a file name. Fix: e.g. --out cal.json.")
    if not out.resolve().parent.is_dir():
        raise ConfigError(f"--out {a.out}: the folder {out.resolve().parent} does not exist. Fix: create "
                          "it, or write the file elsewhere.")
    hops = None
    if a.hops:
        try:
            hops = json.loads(Path(a.hops).read_text())
            _hop_terms(hops)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"--hops {a.hops} is not a plan_hops results file ({type(e).__name__}: "
                              f"{e}). Fix: give benchmarks/results/plan_hops.json or one like it.") from None
    over = model_overrides(a)
    cfg = load_config(None, {**over, "strategy": "single", "procs": 1}, a.sets)
    probes = probes_for(cfg.batch_size)
    for name, options, hosts in probes:  # each probe as the hosts will run it: refused here, not in them
        sets = [*a.sets, *(f"{k}={v}" for k, v in options.items())]
        prepare(load_config(None, {**over, "strategy": name, "procs": hosts}, sets), hosts=hosts,
                testbed=True)
    if (why := netns.missing_privileges()) is not None:
        raise ConfigError(why)
    command = shlex.join(["polytrain", "testbed", "calibrate", *argv])
    return CalibrateJob(cfg, a.nic, a.steps, a.repeats, out, hops, command, probes)


def _hop_terms(record: dict[str, Any]) -> dict[str, float | None]:
    """The emulation's per-message terms a plan_hops record measured (`probes.testbed_hops`)."""
    from polytrain.testbed.probes import testbed_hops

    shift = [h for _, size, h in record["hops"].get("shift", []) if size <= 32768]
    hop, direct, *wake = testbed_hops(record, wake=bool(shift))
    return {"hop_s": max(0.0, hop or 0.0), "direct_hop_s": None if direct is None else max(0.0, direct),
            "wake_s": max(0.0, wake[0] or 0.0) if wake else 0.0}


def host_args(cfg: JobConfig, steps: int, options: dict[str, Any]) -> list[str]:
    """The probe's ``polytrain train`` flags (the strategy, world and run directory are the testbed's)."""
    args = ["--model", cfg.model, "--dataset", cfg.dataset, "--batch-size", str(cfg.batch_size),
            "--optimizer", cfg.optimizer, "--steps", str(steps), "--no-report", "--eval-every", "0"]
    sets = [f"model.{k}={v}" for k, v in cfg.model_options.items()]
    sets += [f"data.{k}={v}" for k, v in cfg.data_options.items()]
    sets += [f"{k}={v}" for k, v in options.items()]
    return args + [x for s in sets for x in ("--set", s)]


def run_probe(cfg: JobConfig, model: str, nic: str, steps: int, probe: Probe,
              console: Console) -> dict[str, Any]:
    """One probe job on a fresh testbed, read into the record `testbed.probes` reads."""
    from polytrain.testbed.job import Bed, TestbedJob, run_testbed
    from polytrain.testbed.probes import span_stats, step_times

    strategy, options, hosts = probe
    root = Path(tempfile.mkdtemp(prefix="polytrain-calibrate-"))
    try:
        job = TestbedJob("train", root / "run", 1, tuple(host_args(cfg, steps, options)), (strategy,),
                         report=False)
        load = os.getloadavg()[0]
        code = run_testbed(Bed(hosts, nic), job, console)
        if code:
            raise ConfigError(f"the {strategy} probe of {model} failed on the testbed (exit {code}); its "
                              "output is above. Fix: run the same job with `polytrain testbed` to see why.")
        times = step_times(job.root, SKIP)
        return {"model": model, "hosts": hosts, "nic": nic, "strategy": strategy, "options": options,
                "scenario": "probe", "step_times": times, "measured_step_s": statistics.median(times),
                "spans": span_stats(job.root, SKIP), "load_start": load}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def terms_of(probe_runs: list[dict[str, Any]], profile: Any) -> dict[str, float]:
    """The model's `ModelTerms` fields from its probe records (each the median over repeats)."""
    from polytrain.testbed.probes import probe_action_overheads, probe_pass_overheads, probe_scales

    raw = {"probes": probe_runs}
    m = profile.model
    terms: dict[str, float] = {}
    scales = probe_scales(raw, {m: profile}, split=True)
    if m in scales:
        terms["forward_scale"], terms["compute_scale"] = scales[m]
    if m in (actions := probe_action_overheads(raw)):
        terms["action_overhead_s"] = max(0.0, actions[m])
    if m in (passes := probe_pass_overheads(raw)):
        terms["pass_overhead_s"] = passes[m]
    return terms


def _commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def calibration_of(job: CalibrateJob, profile: Any, probe_runs: list[dict[str, Any]]) -> Calibration:
    """The calibration file's content: the testbed's construction, the measured hops, the model's terms."""
    from polytrain.plan.calibration import ModelTerms
    from polytrain.plan.predict import testbed_calibration

    hops = _hop_terms(job.hops) if job.hops else {}
    cal = testbed_calibration(**hops)
    source = {
        "command": job.command, "commit": _commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.node()}, {os.cpu_count()} cores", "nic": job.nic, "steps": job.steps,
        "repeats": job.repeats, "load": [round(x, 2) for x in os.getloadavg()],
        "profile_forward_backward_s": profile.forward_backward_s,
        "probes": [{"strategy": r["strategy"], "options": r["options"],
                    "step_ms": round(r["measured_step_s"] * 1e3, 3)} for r in probe_runs],
        "emulation": "the testbed's construction" + (", hops from --hops" if job.hops else
                                                     "; collective hops not measured (--hops)"),
    }
    models = {profile.model: ModelTerms(**terms_of(probe_runs, profile))}
    return cal.model_copy(update={"source": source, "models": models})


def run_calibrate(job: CalibrateJob, console: Console) -> int:
    from polytrain.plan.calibration import Calibration
    from polytrain.plan.predict import cached_profile

    profile = cached_profile(job.cfg)  # the profile runs and `polytrain plan` price from
    runs = []
    for r in range(job.repeats):
        for probe in job.probes:
            console.print(f"calibrate: {probe[0]} probe, round {r + 1}/{job.repeats}", highlight=False)
            runs.append(run_probe(job.cfg, profile.model, job.nic, job.steps, probe, console))
    cal = calibration_of(job, profile, runs)
    cal.save(job.out)
    Calibration.load(job.out)  # what was written reads back and validates
    terms = cal.terms(profile.model)
    console.print(f"calibration: {job.out} ({profile.model}: compute scale {terms.compute_scale:.3g}, "
                  f"forward {terms.forward_scale or terms.compute_scale:.3g}, "
                  f"{terms.action_overhead_s * 1e3:.3g} ms per pipeline action, "
                  f"{terms.pass_overhead_s * 1e3:.3g} ms per pass)", highlight=False)
    return 0


def cmd_calibrate(argv: list[str], console: Console) -> int:
    return run_calibrate(parse_calibrate(argv), console)


def checked_calibration(path: str | None) -> Path | None:
    """``--calibration``'s file, validated before any host starts (its own one-line refusal), as an
    absolute path: the hosts read it from their own working folders."""
    if path is None:
        return None
    from polytrain.plan.calibration import Calibration

    Calibration.load(Path(path))
    return Path(path).resolve()


def resolve_auto(ns: Any, bed: Bed, nper: int, calibration: Path | None) -> str:
    """``train --strategy auto`` on the testbed: the planner's first choice for its ``hosts`` x
    ``nper`` ranks, priced on its links with ``calibration`` (default: the testbed's construction,
    `plan.predict.run_scene`); ``ns`` (the parsed job) gets the chosen strategy and options. Returns
    the line that says what was chosen."""
    from polytrain.config import load_config
    from polytrain.flags import overrides
    from polytrain.plan.calibration import Calibration
    from polytrain.plan.commands import auto_strategy
    from polytrain.testbed.netns import parse_latency, parse_rate

    if ns.cluster is not None:
        raise ConfigError(f"--cluster {ns.cluster} with --strategy auto under polytrain testbed: the "
                          "testbed is the cluster it plans for. Fix: drop --cluster.")
    if any("." not in s.split("=", 1)[0] for s in ns.sets):
        raise ConfigError("--strategy auto chooses the strategy options itself. Fix: drop the strategy "
                          "--set options (model.* and data.* are fine), or name a strategy.")
    world = bed.hosts * nper
    cfg = load_config(ns.config, {**overrides(ns), "strategy": "single", "procs": world}, ns.sets)
    record = {"hosts": bed.hosts, "rate_bits_per_s": parse_rate(bed.nic),
              "latency": parse_latency(bed.latency) if bed.latency else 0}
    cal = Calibration.load(calibration) if calibration else None
    best = auto_strategy(cfg, None, record, ns.allow_inexact, cal)
    ns.strategy, ns.allow_inexact = best.strategy, False
    ns.sets = [*ns.sets, *(f"{k}={v}" for k, v in best.options.items())]
    return (f"auto: {best.label} on {world} process(es), predicted {best.estimate.step_s * 1e3:.1f} ms/step"
            f" ({best.samples_per_s:,.0f} samples/s) with "
            + (f"the calibration {calibration}" if calibration else "the testbed's construction"))
