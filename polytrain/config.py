"""The job description: one typed, validated definition behind the CLI, TOML files and Python.

Precedence, lowest first: the defaults here, a TOML file (``--config``), then explicit CLI flags
or keyword arguments, then ``--set KEY=VALUE`` pairs. ``--set`` keys without a dot are strategy
options (validated by the strategy's own ``Options`` type); ``model.KEY`` and ``data.KEY`` go
to the model and the dataset.

A TOML file looks like::

    strategy = "allreduce"
    procs = 2
    model = "cnn"
    dataset = "digits"
    steps = 300
    batch_size = 64

    [options]          # strategy options, same as --set KEY=VALUE
    [model_options]    # same as --set model.KEY=VALUE
    [data_options]     # same as --set data.KEY=VALUE
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from polytrain.errors import ConfigError, validation_parts

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
# Straggler emulation works with every strategy: --set slow_rank=R --set slow_factor=F makes
# rank R take F times as long for each unit of its work (it sleeps (F-1) x its compute time).
STRAGGLER_KEYS = ("slow_rank", "slow_factor")
# Options of the model whatever the strategy: --set split=PATHS|auto cuts a user's module into
# traced stages (polytrain/models/trace.py), so it goes to model_options.
MODEL_KEYS = ("split",)
MAX_STEPS = 10**12  # far past any real run; above it a number is a typo (--steps 1e20)


class JobConfig(BaseModel):
    """What to train, how, and where the results go. Every field is a CLI flag too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    strategy: str = "allreduce"
    procs: int = 2
    model: str = "cnn"
    dataset: str = "digits"
    steps: int = 300
    epochs: float | None = None
    batch_size: int = 64
    lr: float = 1e-3
    optimizer: Literal["sgd", "momentum", "adam", "adamw"] = "adam"
    momentum: float = 0.9
    weight_decay: float = 0.0  # L2 in the gradient (sgd, momentum, adam); decoupled for adamw
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    clip_grad_norm: float | None = None  # clip the whole model's gradient to this global norm
    grad_accum: int = 1  # micro-steps per optimizer step (the global batch stays batch_size)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # autocast dtype; weights stay fp32
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: a GPU per rank when there is one
    log: list[Literal["csv", "tensorboard", "wandb"]] = []  # live logging while the run goes
    activation_checkpointing: bool = False  # recompute each block's forward during backward
    seed: int = 0
    loss: str | None = None  # pkg.mod:fn, fn(output, targets) -> scalar; default: task loss
    options: dict[str, Any] = {}
    model_options: dict[str, Any] = {}
    data_options: dict[str, Any] = {}
    eval_every: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    slow_rank: int | None = None
    slow_factor: float = 1.0
    timeout_s: float = 60.0
    on_nonfinite: Literal["stop", "skip"] = "stop"
    on_divergence: Literal["stop", "skip", "warn"] = "stop"  # finite divergence (runtime/divergence.py)
    divergence_factor: float = 1e3
    divergence_window: int = 10
    max_param: float = 1e6
    out: str | None = None
    debug: bool = False

    @field_validator("procs")
    @classmethod
    def _procs(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"--procs is the number of processes and must be at least 1 (got {v})")
        return v

    @field_validator("steps", "batch_size", "grad_accum")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1 (got {v})")
        return v

    @field_validator("steps")
    @classmethod
    def _steps_bound(cls, v: int) -> int:
        if v > MAX_STEPS:
            raise ValueError(f"at most {MAX_STEPS:.0e} steps (got {v}); use --epochs for long runs")
        return v

    @field_validator("out")
    @classmethod
    def _out(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("--out is empty; name a run directory, or leave --out out for "
                             "runs/<time>-<strategy>")
        return v

    @field_validator("lr", "timeout_s")
    @classmethod
    def _positive_float(cls, v: float) -> float:
        if not v > 0 or not math.isfinite(v):
            raise ValueError(f"must be a positive number (got {v})")
        return v

    @field_validator("eval_every", "checkpoint_every", "weight_decay", "warmup_steps", "min_lr")
    @classmethod
    def _non_negative(cls, v: float) -> float:
        if not v >= 0 or not math.isfinite(v):
            raise ValueError(f"must be 0 (off) or a finite positive number (got {v})")
        return v

    @field_validator("log", mode="before")
    @classmethod
    def _log(cls, v: Any) -> Any:
        """``--log csv,tensorboard``: a comma-separated string from the command line."""
        return [s.strip() for s in v.split(",") if s.strip()] if isinstance(v, str) else v

    @field_validator("clip_grad_norm")
    @classmethod
    def _clip(cls, v: float | None) -> float | None:
        if v is not None and (not v > 0 or not math.isfinite(v)):
            raise ValueError(f"a gradient-norm limit is a finite positive number (got {v}); "
                             "1.0 is usual, leave it out for no clipping")
        return v

    @field_validator("momentum")
    @classmethod
    def _momentum(cls, v: float) -> float:
        if not 0.0 <= v < 1.0:
            raise ValueError(f"momentum must be in [0, 1) (got {v}); 0.9 is the usual value")
        return v

    @field_validator("epochs")
    @classmethod
    def _epochs(cls, v: float | None) -> float | None:
        if v is not None and (not v > 0 or not math.isfinite(v)):
            raise ValueError(f"must be a finite positive number of epochs (got {v})")
        return v

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int) -> int:
        if not 0 <= v < 2**63:
            raise ValueError(f"a seed is an integer in [0, 2**63) (got {v})")
        return v

    @field_validator("options", "model_options", "data_options")
    @classmethod
    def _finite_options(cls, v: dict[str, Any]) -> dict[str, Any]:
        bad = [k for k, x in v.items() if isinstance(x, float) and not math.isfinite(x)]
        if bad:
            raise ValueError(f"option(s) {', '.join(bad)} must be finite numbers "
                             f"(got {', '.join(repr(v[k]) for k in bad)})")
        return v

    @field_validator("slow_factor")
    @classmethod
    def _slow(cls, v: float) -> float:
        if not v >= 1.0 or not math.isfinite(v):
            raise ValueError(f"a straggler's slow-down factor must be a finite number >= 1 (got {v})")
        return v

    @field_validator("divergence_factor")
    @classmethod
    def _factor(cls, v: float) -> float:
        if not (v == 0 or (v > 1 and math.isfinite(v))):
            raise ValueError(f"the loss bound is a factor over its running minimum: a finite "
                             f"number > 1, or 0 to turn the loss check off (got {v}); default 1000")
        return v

    @field_validator("divergence_window")
    @classmethod
    def _window(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"the divergence window is a number of steps >= 1 (got {v}); default 10")
        return v

    @field_validator("max_param")
    @classmethod
    def _max_param(cls, v: float) -> float:
        if not (v == 0 or (v > 0 and math.isfinite(v))):
            raise ValueError(f"the parameter bound is a finite positive magnitude, or 0 to turn it "
                             f"off (got {v}); default 1e6")
        return v

    @field_validator("keep_checkpoints")
    @classmethod
    def _keep(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must keep at least 1 checkpoint (got {v})")
        return v


    @model_validator(mode="after")
    def _schedule(self) -> JobConfig:
        if self.batch_size % self.grad_accum:
            raise ValueError(f"--grad-accum {self.grad_accum} must divide --batch-size "
                             f"{self.batch_size} (the global batch is cut into {self.grad_accum} "
                             "equal micro-batches). Use a --batch-size that is a multiple of it")
        if self.min_lr > self.lr:
            raise ValueError(f"--min-lr {self.min_lr} is above --lr {self.lr}: a schedule decays "
                             "from --lr down to --min-lr. Pass a --min-lr below --lr (default 0)")
        if self.warmup_steps and self.warmup_steps >= self.steps and self.epochs is None:
            raise ValueError(f"--warmup-steps {self.warmup_steps} is not below --steps "
                             f"{self.steps}: the run would never reach --lr. Use fewer warm-up "
                             "steps (a few percent of the run is usual)")
        return self


FIELDS = tuple(JobConfig.model_fields)


def _friendly(err: ValidationError, source: str) -> ConfigError:
    """Turn pydantic's report into one paragraph naming each field, its value and the rule."""
    return ConfigError(f"Invalid job in {source}: " + "; ".join(validation_parts(err, FIELDS, "key")) + ".")


def make_config(data: dict[str, Any], source: str = "the job") -> JobConfig:
    """Validate a plain mapping into a JobConfig, with errors users can act on."""
    try:
        return JobConfig(**data)
    except ValidationError as err:
        raise _friendly(err, source) from None


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML job file; unreadable or malformed files are ConfigErrors."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(
            f"Cannot read config file '{p}': {e.strerror or e}. "
            "Pass the path of a readable TOML file to --config."
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"Config file '{p}' is not text (not UTF-8): a TOML job file is plain "
                          "text. Pass the path of a TOML file to --config.") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(
            f"Config file '{p}' is not valid TOML: {e}. Fix the line it names "
            "(strings need quotes: model = \"cnn\")."
        ) from None


def parse_value(text: str) -> Any:
    """A --set value: TOML scalar when it parses as one (1, 0.5, true, "x"), else the string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_sets(data: dict[str, Any], pairs: list[str]) -> dict[str, Any]:
    """Fold ``--set KEY=VALUE`` pairs into a config mapping (strategy/model/data options)."""
    out = dict(data)
    buckets = {"model": "model_options", "data": "data_options"}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"--set expects KEY=VALUE, got '{pair}'. Example: --set servers=2, "
                "--set model.width=16, --set data.size=32."
            )
        prefix, dot, rest = key.partition(".")
        field = buckets.get(prefix, "options") if dot else "options"
        if key in STRAGGLER_KEYS:  # usable with every strategy, so a job field
            out[key] = parse_value(raw.strip())
            continue
        if key in MODEL_KEYS:
            out["model_options"] = {**out.get("model_options", {}), key: raw.strip()}
            continue
        name = rest if dot and prefix in buckets else key
        if dot and prefix not in buckets:
            raise ConfigError(
                f"--set key '{key}': a dotted key must start with 'model.' or 'data.'; "
                "strategy options have no prefix (e.g. --set servers=2)."
            )
        out[field] = {**out.get(field, {}), name: parse_value(raw.strip())}
    return out


def load_config(
    config_file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    sets: list[str] | None = None,
) -> JobConfig:
    """The one path from file + flags + --set pairs to a validated JobConfig."""
    data: dict[str, Any] = read_toml(config_file) if config_file else {}
    source = f"config file '{config_file}'" if config_file else "the job"
    for key, value in (overrides or {}).items():
        if value is not None:
            data[key] = value
    data = apply_sets(data, sets or [])
    return make_config(data, source)


def to_toml(cfg: JobConfig) -> str:
    """The resolved job as TOML (None values are left out: TOML has no null)."""
    import tomli_w

    data = {k: v for k, v in cfg.model_dump().items() if v is not None}
    return tomli_w.dumps(data)


def total_steps(cfg: JobConfig, train_size: int) -> int:
    """Steps to run: --epochs (over the global batch) wins over --steps when given."""
    if cfg.epochs is None:
        return cfg.steps
    if cfg.epochs <= 0:
        raise ConfigError(f"--epochs must be positive (got {cfg.epochs}).")
    return max(1, math.ceil(cfg.epochs * train_size / cfg.batch_size))
