"""`polytrain profile` and `polytrain plan` (and the planner behind `--strategy auto`).

polytrain profile --model vgg16 --set model.width=8 --dataset synthetic-images --batch-size 64 --out vgg.json
polytrain plan --profile vgg.json --cluster "hosts=64,procs_per_host=8,nic=100gbit,intra=300gbyte,latency=5us"
polytrain plan --model cnn --cluster hosts=8,nic=1gbit --sweep hosts=2..1024
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from polytrain.config import JobConfig
from polytrain.cost.cluster import MAX_WORLD, Cluster, parse_bytes
from polytrain.cost.profile import Profile, measure_profile, median_of
from polytrain.cost.scene import Scene
from polytrain.errors import ConfigError
from polytrain.plan import show
from polytrain.plan.calibration import PHYSICAL, Calibration, emulate
from polytrain.plan.predict import local_collectives
from polytrain.plan.recommend import Candidate, candidates, check_memory, command, rank, to_json


def job_of(profile: Profile) -> dict[str, Any]:
    return {
        "model": profile.model,
        "dataset": profile.dataset,
        "optimizer": profile.optimizer,
        "model_options": profile.model_options,
        "data_options": profile.data_options,
    }


def local_cluster(procs: int, profile: Profile | None = None) -> Cluster:
    """This machine: one host, ``procs`` processes sharing its cores; intra link from the profile's
    measured point-to-point α–β when it has one."""
    p2p = (profile.comm.get("p2p") if profile else None) or {}
    hardware = Cluster(
        1,
        procs,
        intra_bps=float(p2p.get("bytes_per_s", 2e9)),
        latency_s=float(p2p.get("alpha_s", 1e-4)),
        intra_latency_s=float(p2p.get("alpha_s", 1e-4)),
        collectives=local_collectives(),
    )
    return emulate(hardware, cores=os.cpu_count() or 1)  # its processes share this machine's cores


def get_profile(
    cfg: JobConfig, path: str | None, console: Console | None = None, model_given: bool = True
) -> Profile:
    if path:
        prof = Profile.load(Path(path))
        if model_given and prof.model != cfg.model:
            raise ConfigError(
                f"--profile {path} is of model '{prof.model}' but --model is "
                f"'{cfg.model}'. Fix: drop --model, or profile that model."
            )
        return prof
    if console:
        console.print(f"profiling {cfg.model} at batch {cfg.batch_size} on this machine ...", highlight=False)
    return measure_profile(cfg)


def run_profile(
    cfg: JobConfig, out: str | None, comm: bool, console: Console, rounds: int = 1, gap_s: float = 0.0
) -> int:
    prof = profile_rounds(cfg, rounds, gap_s, console)
    if comm:
        from polytrain.plan.commbench import measure_comm

        prof = Profile.from_json({**prof.to_json(), "comm": measure_comm()})
    console.print(format_records(prof), highlight=False, markup=False)
    console.print(
        f"optimizer step {prof.optimizer_s * 1e3:.3f} ms; "
        f"process base {prof.base_memory_bytes / 2**20:.0f} MiB, "
        f"runtime and data {prof.runtime_memory_bytes / 2**20:.0f} MiB",
        highlight=False,
    )
    for kind, ab in prof.comm.items():
        if "alpha_s" in ab:
            console.print(
                f"{kind}: alpha {ab['alpha_s'] * 1e6:.0f} us, beta {ab['bytes_per_s'] / 1e9:.2f} GB/s",
                highlight=False,
            )
    if out:
        prof.save(Path(out))
        console.print(f"profile: {out}", highlight=False)
    return 0


def run_meta_profile(cfg: JobConfig, out: str | None, device: str, console: Console) -> int:
    """`polytrain profile --meta`: FLOPs and bytes per layer counted on the meta device."""
    from polytrain.cost.meta_profile import meta_profile

    t0 = time.perf_counter()
    prof = meta_profile(cfg, device)
    params = prof.param_bytes / 4
    flops = sum(r.forward_flops + r.backward_flops for r in prof.layers)
    console.print(format_records(prof), highlight=False, markup=False)
    console.print(f"{params / 1e9:.2f} B parameters; {flops / 1e12:.1f} TFLOP per step of {prof.batch_size} "
                  f"sample(s) (forward + backward); times priced on {device} at fp32; counted in "
                  f"{time.perf_counter() - t0:.1f} s on the meta device", highlight=False)
    if out:
        prof.save(Path(out))
        console.print(f"profile: {out}", highlight=False)
    return 0


def profile_rounds(cfg: JobConfig, rounds: int, gap_s: float, console: Console | None = None) -> Profile:
    """``rounds`` profiles ``gap_s`` seconds apart, combined by their median (`profile.median_of`);
    one round is a plain `measure_profile`."""
    if rounds < 1 or gap_s < 0:
        raise ConfigError(
            f"--rounds must be >= 1 and --gap >= 0 seconds, got --rounds {rounds} --gap {gap_s}. "
            "Fix: e.g. --rounds 5 --gap 60 (five profiles a minute apart, their median kept)."
        )
    if rounds == 1:
        return measure_profile(cfg)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    taken: list[Profile] = []
    bar = Progress(TextColumn("[bold]profile rounds"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console or Console(stderr=True), transient=True)
    with bar:
        task = bar.add_task("rounds", total=rounds)
        for i in range(rounds):
            if i and gap_s:
                time.sleep(gap_s)
            taken.append(measure_profile(cfg))
            bar.advance(task)
    totals = sorted(p.forward_backward_s * 1e3 for p in taken)
    if console:
        console.print(
            f"{rounds} rounds: forward + backward {totals[0]:.2f}-{totals[-1]:.2f} ms "
            f"(max/min {totals[-1] / totals[0]:.2f}); each time the median of the rounds",
            highlight=False,
        )
    return median_of(taken)


def format_records(prof: Profile) -> str:
    """The profile as a table: per layer ms (fixed part in brackets) and KiB."""
    lines = [
        f"{prof.model} at batch {prof.batch_size} on {prof.device} ({prof.threads} thread(s))",
        f"{'layer':<16} {'kind':<11} {'fwd ms':>14} {'bwd ms':>14} {'act KiB':>9} {'param KiB':>10}",
    ]
    for i, r in enumerate(prof.layers):
        lines.append(
            f"{i:>2} {r.name:<13} {r.kind:<11} {r.forward_s * 1e3:>7.3f} ({r.forward_fixed_s * 1e3:.2f})"
            f" {r.backward_s * 1e3:>7.3f} ({r.backward_fixed_s * 1e3:.2f}) {r.activation_bytes / 1024:>9.1f}"
            f" {r.param_bytes / 1024:>10.1f}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class PlanArgs:
    cluster: str | None
    procs: int
    memory_limit: str | None
    profile: str | None
    compute_scale: float
    top: int
    as_json: bool
    sweep: str | None
    out: str | None
    batch: int | None = None
    model_given: bool = True
    allow_inexact: bool = False
    precision: str = "fp32"
    recompute: bool = False
    grad_accum: int = 1
    efficiency: float | None = None
    strategy: str | None = None  # price this one configuration (with ``options``)
    options: list[str] | None = None
    calibration: str | None = None  # a calibration file (`plan.calibration`)

    def scene(self, prof: Profile, cluster: Cluster, batch: int, cal: Calibration = PHYSICAL) -> Scene:
        """The scene the job's training flags describe."""
        if self.grad_accum < 1 or batch % self.grad_accum:
            raise ConfigError(f"--grad-accum {self.grad_accum} must be >= 1 and divide --batch-size {batch}. "
                              "Fix: e.g. --grad-accum 1.")
        if self.efficiency is not None and not 0 < self.efficiency <= 1:
            raise ConfigError(f"--efficiency {self.efficiency}: the share of peak FLOP/s matrix work reaches "
                              "lies in (0, 1]. Fix: e.g. --efficiency 0.5.")
        extra = {"efficiency": self.efficiency} if self.efficiency is not None else {}
        return cal.scene(prof, cluster, batch, self.compute_scale, precision=self.precision,
                         recompute=self.recompute, grad_accum=self.grad_accum, **extra)


def plan_candidates(
    prof: Profile, cluster: Cluster, batch: int, scale: float, limit: int | None,
    scene: Scene | None = None, unpriced: list[str] | None = None, cal: Calibration = PHYSICAL,
) -> list[Candidate]:
    scene = scene or cal.scene(prof, cluster, batch, scale)
    cands = candidates(scene, limit, unpriced)
    check_memory(cands, limit)
    return rank(cands)


def price_one(scene: Scene, name: str, sets: list[str], limit: int | None) -> Candidate:
    """The candidate ``--strategy NAME --set K=V ...`` describes, priced by its strategy on the
    cluster's world size."""
    from polytrain.config import apply_sets
    from polytrain.strategies import get_strategy_class, make_strategy

    options = apply_sets({}, sets).get("options", {})
    strategy = make_strategy(name, options)
    e = strategy.price(scene, scene.cluster.world)
    if isinstance(e, str):
        raise ConfigError(f"The planner cannot price '{name}' with {options}: {e}. Fix: leave out "
                          "--strategy to rank every strategy that applies.")
    fits = limit is None or e.peak_memory_bytes <= limit
    return Candidate(name, scene.cluster.world, options, e, scene.batch, fits,
                     exact=strategy.is_exact(), family=get_strategy_class(name).family)


def applies(c: Candidate, cfg: JobConfig) -> str | None:
    """None if the strategy's own pre-launch check accepts the candidate, else its message."""
    from polytrain.strategies import make_strategy

    run_cfg = cfg.model_copy(update={"strategy": c.strategy, "procs": c.procs, "options": c.options})
    try:
        make_strategy(c.strategy, c.options).check(run_cfg, c.procs)
    except ConfigError as e:
        return str(e)
    return None


def first_choice(ranked: list[Candidate], cfg: JobConfig, procs: int | None = None,
                 inexact: bool = False) -> Candidate:
    """The fastest candidate that fits and passes its strategy's checks. Unless ``inexact``, only
    strategies that learn exactly as single-process training (`Strategy.is_exact`): the planner
    predicts a step's time, not the extra steps or the accuracy an averaging period, staleness or
    a gradient codec costs."""
    for c in ranked:
        if not inexact and not c.exact:
            continue
        if c.fits and (procs is None or c.procs == procs) and applies(c, cfg) is None:
            return c
    raise ConfigError(
        "The planner found no strategy that fits and passes its checks"
        + ("" if inexact else " among those that learn exactly as single-process training")
        + ". Fix: raise --memory-limit or change --procs / --batch-size"
        + ("." if inexact else ", or add --allow-inexact.")
    )


def run_plan(cfg: JobConfig, a: PlanArgs, console: Console) -> int:
    t0 = time.perf_counter()
    limit = parse_bytes(a.memory_limit) if a.memory_limit else None
    prof = get_profile(cfg, a.profile, None if a.as_json else console, a.model_given)
    batch = a.batch or prof.batch_size
    cluster = Cluster.parse(a.cluster) if a.cluster is not None else local_cluster(a.procs, prof)
    cal = Calibration.load(Path(a.calibration)) if a.calibration else PHYSICAL
    if a.sweep:
        return run_sweep(prof, cluster, batch, a, console, cal)
    scene = a.scene(prof, cluster, batch, cal)
    if limit is None and cluster.accelerator is not None:
        limit = int(cluster.accelerator.memory_bytes)  # a described device's memory is the limit
    unpriced: list[str] = []
    if a.strategy:
        ranked = [price_one(scene, a.strategy, a.options or [], limit)]
    else:
        ranked = plan_candidates(prof, cluster, batch, a.compute_scale, limit, scene, unpriced)
    job = job_of(prof)
    if a.as_json:
        console.print_json(json.dumps([to_json(c, job) for c in ranked]))
        return 0
    elapsed = time.perf_counter() - t0
    title = (
        f"{prof.model}, batch {batch}, on {cal.cluster(cluster).describe()}: {len(ranked)} candidates "
        f"planned in {elapsed:.2f} s"
    )
    console.print(show.ranking_table(ranked, a.top, title))
    for line in show.not_fitting(ranked):
        console.print(line, highlight=False)
    for line in unpriced:
        console.print(f"not priced: {line}", highlight=False)
    best = first_choice(ranked, cfg, inexact=a.allow_inexact)
    console.print(f"recommended: {command(best, job)}", highlight=False, soft_wrap=True)
    fastest = first_choice(ranked, cfg, inexact=True)
    if fastest is not best:
        console.print(f"faster per step, but learns differently from single-process training (it may "
                      f"need more steps to the same accuracy; --allow-inexact to recommend it): "
                      f"{command(fastest, job)}", highlight=False, soft_wrap=True)
    out = Path(a.out or f"runs/plan-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps([to_json(c, job) for c in ranked], indent=1))
    for i, c in enumerate([c for c in ranked if c.fits][: min(a.top, 3)], 1):
        show.draw_predicted(c, out / f"timeline_{i}_{c.strategy}.png")
    console.print(f"plan: {out}/plan.json, predicted timelines {out}/timeline_*.png", highlight=False)
    return 0


def parse_sweep(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*hosts\s*=\s*(\d+)\s*\.\.\s*(\d+)\s*", text)
    if m is None or not 1 <= int(m[1]) <= int(m[2]) <= MAX_WORLD:
        raise ConfigError(
            f"--sweep '{text}'. Rule: hosts=LO..HI with 1 <= LO <= HI <= {MAX_WORLD:,}. Fix: "
            "--sweep hosts=2..1024."
        )
    return int(m[1]), int(m[2])


def sweep(prof: Profile, cluster: Cluster, batch: int, scale: float, lo: int, hi: int,
          cal: Calibration = PHYSICAL) -> dict[str, Any]:
    """Best predicted samples/s per strategy for host counts LO, 2·LO, ... HI; the crossover: the
    first rank count at which a hybrid strategy beats the best exact data-parallel one
    (uncompressed strategies only)."""
    rows, hosts = [], lo
    each: dict[str, int] = {}  # hybrid -> first rank count at which it beats data parallelism
    families: dict[str, str] = {}
    while hosts <= hi:
        cl = cluster.with_hosts(hosts)
        best: dict[str, Candidate] = {}
        for c in candidates(cal.scene(prof, cl, batch, scale)):
            if c.options.get("compression", "none") != "none":
                continue  # the crossover is DP against MP: codecs are priced in `plan`, not swept
            if c.procs == cl.world and (
                c.strategy not in best or c.samples_per_s > best[c.strategy].samples_per_s
            ):
                best[c.strategy] = c
            families[c.strategy] = c.family
        rate = {s: c.samples_per_s for s, c in best.items()}
        top = max(best.values(), key=lambda c: c.samples_per_s) if best else None
        rows.append(
            {
                "hosts": hosts,
                "ranks": cl.world,
                "samples_per_s": rate,
                "options": {s: c.options for s, c in best.items()},
                "best": top.label if top else "-",
            }
        )
        data = max((c.samples_per_s for c in best.values() if c.family == "data" and c.exact), default=None)
        for s, c in best.items():
            if c.family == "hybrid" and s not in each and data is not None and c.samples_per_s > data:
                each[s] = cl.world
        hosts *= 2
    crossover = min(each.values(), default=None)
    return {"rows": rows, "crossover_ranks": crossover, "crossover_by_hybrid": each, "families": families}


def run_sweep(prof: Profile, cluster: Cluster, batch: int, a: PlanArgs, console: Console,
              cal: Calibration = PHYSICAL) -> int:
    lo, hi = parse_sweep(a.sweep or "")
    result = sweep(prof, cluster, batch, a.compute_scale, lo, hi, cal)
    families = result["families"]  # every strategy but the single-process reference, by family
    shown = sorted((s for s, f in families.items() if f != "reference"), key=lambda s: (families[s], s))
    if a.as_json:
        console.print_json(json.dumps(result))
        return 0
    console.print(show.sweep_table(result["rows"], shown))
    x = result["crossover_ranks"]
    by = ", ".join(f"{h} at {n} ranks" for h, n in sorted(result["crossover_by_hybrid"].items()))
    console.print(
        f"MP-DP crossover: a hybrid overtakes data parallelism at {x} ranks ({by})"
        if x
        else "MP-DP crossover: no hybrid overtakes data parallelism in this range",
        highlight=False,
    )
    out = Path(a.out or f"runs/plan-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(result, indent=1))
    show.draw_sweep(result["rows"], shown, x, out / "sweep.png")
    console.print(f"sweep: {out}/sweep.json, {out}/sweep.png", highlight=False)
    return 0


def auto_strategy(cfg: JobConfig, cluster_text: str | None, testbed: dict[str, Any] | None,
                  inexact: bool = False, cal: Calibration | None = None) -> Candidate:
    """The planner's first choice for ``cfg`` (``--strategy auto``): on ``--cluster`` when given (its
    world size), else on the testbed this runs on or this machine with ``cfg.procs`` processes;
    ``cal``: the calibration it is priced with (`plan.predict.run_scene`)."""
    from polytrain.plan.predict import cached_profile, run_scene

    cluster = Cluster.parse(cluster_text) if cluster_text is not None else None
    prof = cached_profile(cfg)  # after the cheap checks: it measures the model
    scene = ((cal or PHYSICAL).scene(prof, cluster, cfg.batch_size) if cluster is not None
             else run_scene(prof, cfg.batch_size, cfg.procs, testbed, cal))
    ranked = plan_candidates(prof, scene.cluster, cfg.batch_size, 1.0, None, scene)
    return first_choice(ranked, cfg, procs=cluster.world if cluster else cfg.procs, inexact=inexact)
