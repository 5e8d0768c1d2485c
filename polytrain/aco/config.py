"""``polytrain aco`` job description: every rule checked here, before any process starts.

Each failure is one :class:`ConfigError` line naming the rule, the value and the fix.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from polytrain.aco.colony import DEFAULT_RHO, VARIANTS, Params
from polytrain.appconfig import AppConfig
from polytrain.errors import ConfigError, did_you_mean

LOCAL_SEARCH = ("none", "2opt")
DEVICES = ("cpu", "cuda", "auto")
AUTO_CANDIDATES_ABOVE = 200  # instances larger than this get 20-city candidate lists by default


class ACOConfig(AppConfig):
    JOB: ClassVar[str] = "aco job"

    tsp: str = "random:50"
    ants: int | None = None  # None: 25 with 2-opt, else N (Stützle & Hoos 2000)
    iterations: int | None = None  # None: 200 unless --time-limit
    time_limit: float | None = None
    procs: int = 1
    exchange: int = 1
    variant: str = "mmas"
    local_search: str = "2opt"
    alpha: float = 1.0
    beta: float = 2.0
    rho: float | None = None  # None: as 0.5, acs 0.1, mmas 0.02 (0.2 with 2-opt)
    q0: float = 0.9
    xi: float = 0.1
    candidates: int | None = None  # None: 0 (all cities) up to N=200, else 20
    p_best: float = 0.05
    restart_after: int = 100
    seed: int = 0
    device: str = "cpu"
    threads: int = 1  # torch threads per process (A x N steps are too small to gain from more)
    optimum: float | None = None
    target_gap: float | None = None  # stop when within this gap of the optimum (e.g. 0.02)
    out: str | None = None
    timeout_s: float = 120.0

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ACOConfig:
        return validate(ACOConfig.parse(data))

    @property
    def max_iterations(self) -> int:
        if self.iterations is not None:
            return self.iterations
        return 10**9 if self.time_limit is not None else 200

    def resolved(self, n: int) -> ACOConfig:
        """Fill the size-dependent defaults for an instance of ``n`` cities."""
        ants = self.ants if self.ants is not None else (25 if self.local_search == "2opt" else n)
        rho = self.rho if self.rho is not None else (
            0.2 if self.variant == "mmas" and self.local_search == "2opt" else DEFAULT_RHO[self.variant])
        cands = self.candidates if self.candidates is not None else (20 if n > AUTO_CANDIDATES_ABOVE else 0)
        out = self.replace(ants=ants, rho=rho, candidates=min(cands, n - 1))
        if out.ants is not None and out.ants < out.procs:
            raise ConfigError(f"--ants {out.ants} < --procs {out.procs}: every process needs at least "
                              f"one ant. Fix: --ants {out.procs} or more.")
        return out

    def params(self) -> Params:
        assert self.ants is not None and self.rho is not None and self.candidates is not None
        return Params(variant=self.variant, ants=self.ants, alpha=self.alpha, beta=self.beta,
                      rho=self.rho, q0=self.q0, xi=self.xi, candidates=self.candidates,
                      p_best=self.p_best, restart_after=self.restart_after)


def _range(name: str, value: float | None, lo: float, hi: float, fix: str, *, lo_open: bool = False,
           hi_open: bool = False) -> None:
    if value is None:
        return
    below = value <= lo if lo_open else value < lo
    above = value >= hi if hi_open else value > hi
    if math.isnan(value) or below or above:
        left, right = ("(" if lo_open else "["), (")" if hi_open else "]")
        raise ConfigError(f"--{name} {value:g} is out of range {left}{lo:g}, {hi:g}{right}. Fix: {fix}.")


def validate(cfg: ACOConfig) -> ACOConfig:
    if cfg.variant not in VARIANTS:
        raise ConfigError(f"--variant '{cfg.variant}' is unknown. {did_you_mean(cfg.variant, VARIANTS)}")
    if cfg.local_search not in LOCAL_SEARCH:
        raise ConfigError(f"--local-search '{cfg.local_search}' is unknown. "
                          f"{did_you_mean(cfg.local_search, LOCAL_SEARCH)}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"--device '{cfg.device}' is unknown. {did_you_mean(cfg.device, DEVICES)}")
    for name, value, lo in (("ants", cfg.ants, 1), ("iterations", cfg.iterations, 1), ("procs", cfg.procs, 1),
                            ("exchange", cfg.exchange, 1), ("candidates", cfg.candidates, 0),
                            ("restart-after", cfg.restart_after, 0), ("threads", cfg.threads, 1)):
        if value is not None and value < lo:
            raise ConfigError(f"--{name} {value} must be >= {lo}. Fix: --{name} {max(lo, 1)}.")
    _range("alpha", cfg.alpha, 0, 10, "--alpha 1 (the usual value)")
    _range("beta", cfg.beta, 0, 20, "--beta 2 to 5")
    _range("rho", cfg.rho, 0, 1, "--rho 0.02 (mmas), 0.1 (acs) or 0.5 (as)", lo_open=True, hi_open=True)
    _range("q0", cfg.q0, 0, 1, "--q0 0.9", hi_open=True)
    _range("xi", cfg.xi, 0, 1, "--xi 0.1", lo_open=True, hi_open=True)
    _range("p-best", cfg.p_best, 0, 1, "--p-best 0.05", lo_open=True, hi_open=True)
    _range("time-limit", cfg.time_limit, 0, math.inf, "--time-limit 60", lo_open=True)
    _range("target-gap", cfg.target_gap, 0, math.inf, "--target-gap 0.02")
    _range("optimum", cfg.optimum, 0, math.inf, "the optimal tour length", lo_open=True)
    _range("timeout", cfg.timeout_s, 0, math.inf, "--timeout 120", lo_open=True)
    if cfg.variant == "acs" and cfg.alpha != 1.0:
        raise ConfigError(f"--alpha {cfg.alpha:g} with --variant acs: ACS's rule uses tau^1 (alpha is "
                          "fixed at 1). Fix: drop --alpha, or use --variant as|mmas.")
    if cfg.exchange > 1 and cfg.procs == 1:
        raise ConfigError(f"--exchange {cfg.exchange} needs --procs 2 or more (it is the period of the "
                          "colonies' exchange). Fix: drop --exchange, or add --procs.")
    return cfg
