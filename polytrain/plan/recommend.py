"""The recommender: every strategy and layout that applies to a model on a cluster, priced and ranked.

`candidates` enumerates, for the cluster's world size W, each strategy with the options that shape
its cost (PS servers × sharding × consistency, pipeline schedules × micro-batches with PipeDream's
partition, mesh dp×pp and dp×tp layouts, ...) and prices each with `plan.estimate` /
`plan.estimate_pipe`. `rank` orders them by predicted samples/s, those that fit the memory limit
first. Gradient codecs are not priced yet (no codec has landed in polytrain.comm).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from polytrain.errors import ConfigError
from polytrain.plan import estimate as est
from polytrain.plan.codecs import DEFAULT_CODECS, cached_price
from polytrain.plan.estimate import Estimate, Scene
from polytrain.plan.estimate_pipe import pipeline
from polytrain.report.units import human_bytes

PS_CONSISTENCY = ("bsp", "async", "ssp", "k-of-n")
# strategies whose parameters equal single-process training's (the others change the algorithm)
EXACT = ("single", "allreduce", "gpipe", "1f1b", "zb-h1", "layerwise", "tensor", "owt", "mesh")
HYBRIDS = ("owt", "mesh")


@dataclass(frozen=True)
class Candidate:
    strategy: str
    procs: int
    options: dict[str, Any]
    estimate: Estimate
    batch: int
    fits: bool = True
    why: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.batch / self.estimate.step_s if self.estimate.step_s > 0 else 0.0

    @property
    def exact(self) -> bool:
        """Equals single-process training (synchronous, no staleness, no averaging period)."""
        if self.options.get("compression", "none") != "none":
            return False  # a codec changes what is averaged
        return self.strategy in EXACT or (self.strategy == "ps" and self.options.get("consistency") == "bsp")

    @property
    def label(self) -> str:
        opts = " ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.strategy} {opts}".strip()


def _divides(batch: int, parts: int) -> bool:
    return parts >= 1 and batch % parts == 0


def _ps(scene: Scene, w: int) -> Iterator[tuple[str, dict[str, Any], Callable[[], Estimate]]]:
    params = {name.split(".", 1)[0] for name, _ in scene.profile.params}
    for servers in sorted({1, 2, w // 4, w // 2} - {0}):
        if servers >= w or not _divides(scene.batch, w - servers):
            continue
        for sharding in ("layer", "size"):
            if sharding == "layer" and servers > len(params):
                continue
            for c in PS_CONSISTENCY:
                yield (
                    "ps",
                    {"servers": servers, "sharding": sharding, "consistency": c},
                    partial(est.ps, scene, w, servers, sharding, c),
                )


def _pipelines(scene: Scene, w: int) -> Iterator[tuple[str, dict[str, Any], Callable[[], Estimate]]]:
    n, b = scene.layers, scene.batch
    if not 2 <= w <= n:
        return
    for m in sorted({w, 2 * w, 4 * w}):
        if m <= b and _divides(b, m):
            for sched in ("gpipe", "1f1b", "zb-h1"):  # zb-h1: W split from B (half each, `StageTimes`)
                yield sched, {"microbatches": m}, partial(_piped, scene, sched, w, m)
    yield "pipedream", {}, lambda: _piped(scene, "pipedream", w, 1)
    if scene.profile.optimizer in ("sgd", "momentum"):
        yield "spectrain", {}, lambda: _piped(scene, "spectrain", w, 1)
    yield "layerwise", {}, lambda: _piped(scene, "gpipe", w, 1)


def _piped(scene: Scene, schedule: str, stages: int, m: int, dp: int = 1) -> Estimate:
    e, part = pipeline(scene, "pipedream" if schedule == "spectrain" else schedule, stages, m, dp)
    return Estimate(
        e.step_s,
        e.peak_memory_bytes,
        e.bytes_per_step,
        e.nic_bytes_per_step,
        e.spans,
        {**e.detail, "partition": str(part)},
    )


def _mesh(scene: Scene, w: int) -> Iterator[tuple[str, dict[str, Any], Callable[[], Estimate]]]:
    n, b = scene.layers, scene.batch
    pp = 2
    while pp <= min(n, w // 2):
        dp = w // pp
        if w % pp == 0 and _divides(b, dp):
            for m in sorted({pp, 2 * pp}):
                if m <= b // dp and _divides(b // dp, m):
                    yield (
                        "mesh",
                        {"dp": dp, "pp": pp, "microbatches": m},
                        partial(_piped, scene, "1f1b", pp, m, dp),
                    )
        pp *= 2
    heads = int(scene.profile.model_options.get("n_head", 4))
    if est.tp_layers(scene.profile):
        for tp in (2, 4):
            if tp < w and w % tp == 0 and heads % tp == 0 and _divides(b, w // tp):
                yield "mesh", {"dp": w // tp, "tp": tp}, partial(est.tensor, scene, tp, w // tp)


def _all(scene: Scene, w: int) -> Iterator[tuple[str, int, dict[str, Any], Callable[[], Estimate]]]:
    b, prof = scene.batch, scene.profile
    yield "single", 1, {}, lambda: est.single(scene)
    if w < 2:
        return
    if _divides(b, w):
        yield "allreduce", w, {}, lambda: est.allreduce(scene, w)
        for codec, copts in DEFAULT_CODECS:
            opts = {"compression": codec, **copts}
            yield "allreduce", w, opts, partial(_compressed, scene, w, codec, copts)
        for period in (4, 16):
            yield "local-sgd", w, {"period": period}, partial(est.local_sgd, scene, w, period)
    for name, opts, fn in _ps(scene, w):
        yield name, w, opts, fn
    for name, opts, fn in _pipelines(scene, w):
        yield name, w, opts, fn
    heads = int(prof.model_options.get("n_head", 4))
    if w in (2, 4) and est.tp_layers(prof) and heads % w == 0:
        yield "tensor", w, {}, lambda: est.tensor(scene, w)
    if prof.fc_start is not None and prof.task == "classify":
        yield "owt", w, {}, lambda: est.owt(scene, w)
    for name, opts, fn in _mesh(scene, w):
        yield name, w, opts, fn


def _compressed(scene: Scene, w: int, codec: str, opts: dict[str, Any]) -> Estimate:
    price = cached_price(codec, tuple(sorted(opts.items())), scene.profile.params)
    return est.allreduce(scene, w, codec=price)


def candidates(scene: Scene, memory_limit: int | None = None) -> list[Candidate]:
    """Every applicable (strategy, options) on the cluster's world size, priced."""
    out = []
    for name, procs, opts, fn in _all(scene, scene.cluster.world):
        e = fn()
        opts = dict(opts)
        if "partition" in e.detail and name not in ("tensor",):
            opts["partition"] = e.detail["partition"]
        fits = memory_limit is None or e.peak_memory_bytes <= memory_limit
        out.append(Candidate(name, procs, opts, e, scene.batch, fits))
    return out


def rank(cands: list[Candidate]) -> list[Candidate]:
    """Fitting candidates first, each group by predicted samples/s (fastest first)."""
    return sorted(cands, key=lambda c: (not c.fits, -c.samples_per_s, c.strategy))


def check_memory(cands: list[Candidate], limit: int | None) -> None:
    """Refuse a limit no candidate fits, naming the smallest memory any strategy needs."""
    if limit is None or any(c.fits for c in cands):
        return
    best = min(cands, key=lambda c: c.estimate.peak_memory_bytes)
    raise ConfigError(
        f"--memory-limit {human_bytes(limit)}: no strategy fits. The smallest memory any strategy "
        f"needs is {human_bytes(best.estimate.peak_memory_bytes)} per rank ({best.label}). Fix: "
        f"--memory-limit {human_bytes(best.estimate.peak_memory_bytes)} or more, a smaller "
        "--batch-size, or more ranks."
    )


def command(c: Candidate, job: dict[str, Any]) -> str:
    """The `polytrain train` line that runs candidate ``c`` (``job``: model, dataset, batch, ...)."""
    parts = [
        "polytrain train",
        f"--strategy {c.strategy}",
        f"--procs {c.procs}",
        f"--model {job['model']}",
        f"--dataset {job['dataset']}",
        f"--batch-size {c.batch}",
        f"--optimizer {job['optimizer']}",
    ]
    parts += [f"--set model.{k}={v}" for k, v in job.get("model_options", {}).items()]
    parts += [f"--set data.{k}={v}" for k, v in job.get("data_options", {}).items()]
    parts += [f"--set {k}={v}" for k, v in c.options.items()]
    return " ".join(parts)


def to_json(c: Candidate, job: dict[str, Any]) -> dict[str, Any]:
    e = c.estimate
    return {
        "strategy": c.strategy,
        "procs": c.procs,
        "options": c.options,
        "command": command(c, job),
        "predicted_step_s": e.step_s,
        "predicted_samples_per_s": c.samples_per_s,
        "peak_memory_bytes": e.peak_memory_bytes,
        "bytes_per_step": e.bytes_per_step,
        "nic_bytes_per_step": e.nic_bytes_per_step,
        "fits": c.fits,
        "exact": c.exact,
        "detail": {k: v for k, v in e.detail.items() if k != "shard_bytes"},
    }
