"""The recommender: every strategy and layout that applies to a model on a cluster, priced and ranked.

`candidates` asks every registered strategy what it offers on the cluster's world size W
(`Strategy.offers`: PS servers × sharding × consistency, pipeline schedules × micro-batches with
the planner's cut pinned, mesh dp×pp and dp×tp layouts, gradient codecs, ...) and has each price
itself (`Strategy.price`, on the shared cost model of `cost.estimate` / `cost.pipeline`).
`rank` orders them by predicted samples/s, those that fit the memory limit first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polytrain.cost.scene import Estimate, Scene
from polytrain.errors import ConfigError
from polytrain.report.units import human_bytes


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
    #: equals single-process training (the strategy's `is_exact` with these options)
    exact: bool = False
    family: str = ""
    #: where polytrain measured how an inexact candidate learns (results pages; `Strategy.evidence`)
    evidence: tuple[str, ...] = ()

    @property
    def accuracy(self) -> str:
        """What is known of how it learns: equal to single, the results pages, or unmeasured."""
        if self.exact:
            return "= single"
        return ", ".join(f"docs/results/{p}.md" for p in self.evidence) or "unmeasured"

    @property
    def samples_per_s(self) -> float:
        return self.batch / self.estimate.step_s if self.estimate.step_s > 0 else 0.0

    @property
    def label(self) -> str:
        opts = " ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.strategy} {opts}".strip()


def candidates(scene: Scene, memory_limit: int | None = None,
               unpriced: list[str] | None = None) -> list[Candidate]:
    """Every applicable (strategy, options) on the cluster's world size, priced by the strategy.
    On a meta-device profile, an offer whose price needs this machine to hold the model (a codec
    encodes every gradient) is left out and named in ``unpriced``."""
    from polytrain.cost.scene import counted
    from polytrain.strategies import make_strategy, registry

    out = []
    at_scale = counted(scene.profile)
    for name, cls in registry().items():
        for procs, opts in cls.offers(scene):
            strategy = make_strategy(name, opts)
            try:
                e = strategy.price(scene, procs)
            except ValueError as err:
                if not at_scale:
                    raise
                if unpriced is not None:
                    label = " ".join([name, *(f"{k}={v}" for k, v in opts.items())])
                    unpriced.append(f"{label}: {err}")
                continue
            if isinstance(e, str):
                raise ValueError(f"'{name}' offered {opts} but cannot price it: {e}")
            fits = memory_limit is None or e.peak_memory_bytes <= memory_limit
            out.append(Candidate(name, procs, dict(opts), e, scene.batch, fits,
                                 exact=strategy.is_exact(), family=cls.family,
                                 evidence=strategy.evidence()))
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
        "accuracy_evidence": c.accuracy,
        "detail": {k: v for k, v in e.detail.items() if k != "shard_bytes"},
    }
