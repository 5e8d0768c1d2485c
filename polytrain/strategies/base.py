"""The strategy protocol and its registry.

A strategy is one module that defines a subclass of :class:`Strategy`; defining it registers it
(no central switch). The package ``polytrain.strategies`` imports every module below it on first
use, so a new file is all a new strategy needs.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from polytrain.config import JobConfig
from polytrain.errors import ConfigError, unknown, validation_parts
from polytrain.runtime.job import Job, RankContext, RankResult, fingerprint
from polytrain.runtime.supports import Supports

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene

#: What a strategy offers the planner on a cluster: (processes, options) to price.
Offer = tuple[int, dict[str, Any]]


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Strategy:
    """Base of every strategy. Subclasses set the class attributes and implement ``run``."""

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[type[BaseModel]] = NoOptions
    #: False for strategies whose ranks must share one host (e.g. shared-memory Hogwild).
    multi_host: ClassVar[bool] = True
    #: The world size it always runs on (``single``: 1), given it when --procs is left out.
    fixed_procs: ClassVar[int | None] = None
    #: What it honours of checkpoint, resume, eval, compression, torchrun, testbed
    #: (:mod:`polytrain.runtime.supports`); checked by ``prepare()`` before any process starts.
    supports: ClassVar[Supports] = Supports()
    #: It learns exactly as single-process training (same parameters, to float tolerance) with
    #: options that keep it so (`is_exact`); the planner recommends only these by default.
    exact: ClassVar[bool] = False
    #: Results pages (``docs/results/NAME.md``) that measured how it learns where it is not exact —
    #: time to an accuracy, final accuracy beside an exact anchor (`evidence`); none: unmeasured.
    learning_evidence: ClassVar[tuple[str, ...]] = ()

    _registry: ClassVar[dict[str, type[Strategy]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            if cls.name in Strategy._registry and Strategy._registry[cls.name] is not cls:
                raise RuntimeError(f"two strategies are named '{cls.name}'")
            Strategy._registry[cls.name] = cls

    def __init__(self, options: BaseModel) -> None:
        self.options = options

    @classmethod
    def declared(cls) -> Supports:
        """What this strategy honours whatever its options (the README's support matrix)."""
        if cls.multi_host:
            return cls.supports
        return cls.supports.without("its ranks share one host's memory", "torchrun", "testbed")

    @classmethod
    def resume_view(cls, cfg: JobConfig) -> dict[str, Any]:
        """What of the options and world size a resumed run must keep (the checkpoint's job
        fingerprint uses it); override to let a resume change a layout it can re-shard."""
        return {"options": cfg.options, "procs": cfg.procs}

    def supports_for(self, cfg: JobConfig) -> Supports:
        """What it honours with these options; override where an option takes a feature away."""
        return self.declared()

    def check(self, cfg: JobConfig, world: int) -> None:
        """Refuse a job this strategy cannot run (raise ConfigError), before any process starts."""

    def roles(self, world: int) -> list[str]:
        """The role of each rank, e.g. servers then workers."""
        return ["worker"] * world

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        raise NotImplementedError

    # -- pricing: what the planner asks of a strategy ------------------------------------------

    def is_exact(self) -> bool:
        """Whether these options keep it equal to single-process training (a gradient codec
        changes what is averaged)."""
        return self.exact and getattr(self.options, "compression", "none") == "none"

    def evidence(self) -> tuple[str, ...]:
        """Where polytrain measured how these options learn, if they learn differently from
        single-process training: results pages (() when exact, or when nothing measured it)."""
        if self.is_exact():
            return ()
        if getattr(self.options, "compression", "none") != "none":
            return CODEC_EVIDENCE
        return self.learning_evidence

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        """The (processes, options) the planner prices on ``scene``'s cluster (its world size,
        the profiled model and batch); a strategy with none is not planned."""
        return iter(())

    @classmethod
    def priced(cls) -> bool:
        """Whether the cost model prices it (it overrides `price`)."""
        return cls.price is not Strategy.price

    def price(self, scene: Scene, world: int) -> Estimate | str:
        """The cost model's estimate of a step with these options on ``world`` ranks, or why it
        has none (:mod:`polytrain.cost.estimate` holds the shared building blocks)."""
        return f"the planner does not model '{self.name}' yet"


# what every gradient codec's accuracy was measured by: time to accuracy on the testbed, and each
# codec under each optimizer
CODEC_EVIDENCE = ("codecs_testbed_cnn", "codecs_testbed_gpt", "codecs_optimizers")

_loaded = False


def _discover() -> None:
    """Import every module under polytrain.strategies so their classes register."""
    global _loaded
    if _loaded:
        return
    here = str(Path(__file__).resolve().parent)  # this package's directory
    for mod in pkgutil.walk_packages([here], prefix=__name__.rpartition(".")[0] + "."):
        importlib.import_module(mod.name)
    _loaded = True


def registry() -> dict[str, type[Strategy]]:
    _discover()
    return dict(sorted(Strategy._registry.items()))


def get_strategy_class(name: str) -> type[Strategy]:
    reg = registry()
    if name not in reg:
        raise unknown("strategy", name, reg, "List them with: polytrain strategies.")
    return reg[name]


def job_fingerprint(cfg: JobConfig) -> str:
    """The checkpoint fingerprint of ``cfg``, as its strategy sees it."""
    return fingerprint(cfg, get_strategy_class(cfg.strategy).resume_view(cfg))


def make_strategy(name: str, options: dict[str, Any]) -> Strategy:
    """The strategy ``name`` with validated options (errors list the valid keys)."""
    cls = get_strategy_class(name)
    try:
        opts = cls.Options(**options)
    except ValidationError as err:
        parts = validation_parts(err, cls.Options.model_fields, "option")
        raise ConfigError(
            f"Strategy '{name}': " + "; ".join(parts) + ". Set options with --set KEY=VALUE."
        ) from None
    return cls(opts)
