"""What to train (the Job), where one rank runs (RankContext), and what it reports (RankResult)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from polytrain.comm import Comm
from polytrain.config import JobConfig, total_steps
from polytrain.data import Dataset, DataSpec, load_dataset, task_correct, task_loss
from polytrain.metrics.recorder import Recorder
from polytrain.models import resolve_model
from polytrain.models.call import ModelCall, call_of
from polytrain.models.export import Form
from polytrain.models.outputs import LossFn, loss_of, output_of
from polytrain.models.user import UserModule
from polytrain.runtime import schedule
from polytrain.runtime.batches import GlobalBatches
from polytrain.runtime.checkpoint import CheckpointStore
from polytrain.runtime.progress import RankProgress

# Fields that change what is computed: a checkpoint only resumes a job that agrees on all of them.
FINGERPRINT_FIELDS = ("strategy", "model", "dataset", "batch_size", "lr", "optimizer", "momentum",
                      "weight_decay", "seed", "loss", "options", "model_options", "data_options", "procs",
                      "lr_schedule", "warmup_steps", "min_lr", "clip_grad_norm",
                      "grad_accum", "precision")  # activation_checkpointing: same steps


def fingerprint(cfg: JobConfig, view: dict[str, Any] | None = None) -> str:
    """The job's identity for checkpoints. ``view``: the strategy's say on its options and world
    size (``Strategy.resume_view``, e.g. ``ps``: the worker count, not the server count, which a
    resume may change); default: both as given."""
    data = {k: getattr(cfg, k) for k in FINGERPRINT_FIELDS}
    if view is not None:
        data = {k: v for k, v in data.items() if k not in ("options", "procs")} | view
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Job:
    """The model factory, data, loss, optimizer factory and step count of one training job."""

    config: JobConfig
    dataset: Dataset
    # Set by build_model: how the model is called and scored (polytrain.models.call).
    call: ModelCall = field(default_factory=ModelCall, init=False)
    # What summary.json records as model_call (the user's module's call, also when traced).
    model_call: str = field(default="", init=False)
    # How the model's state dict names the user's tensors (polytrain.models.export), for model.pt.
    form: Form = field(default="layers", init=False)
    user_keys: tuple[str, ...] | None = field(default=None, init=False)
    # Set by build_model for a model cut by split=: which tracer made the stages (and why not
    # torch.export, when it fell back); the worker adds it to the run's strategy metrics.
    split_tracer: dict[str, str] = field(default_factory=dict, init=False)
    _loss_fn: LossFn | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_config(cls, cfg: JobConfig) -> Job:
        return cls(cfg, load_dataset(cfg.dataset, cfg.data_options, seed=cfg.seed))

    @property
    def spec(self) -> DataSpec:
        return self.dataset.spec

    @property
    def steps(self) -> int:
        return total_steps(self.config, self.spec.train_size)

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    def build_model(self) -> nn.Sequential:
        """The model as an ordered list of layers, identically initialised on every rank."""
        torch.manual_seed(self.config.seed)
        model = resolve_model(self.config.model, self.spec, self.config.model_options)
        tracer, fallback = getattr(model, "tracer", None), getattr(model, "tracer_fallback", None)
        if tracer:
            self.split_tracer = {"split_tracer": str(tracer)}
            if fallback:
                self.split_tracer["split_tracer_fallback"] = str(fallback)
        self.call = call_of(model)
        self.form = "traced" if tracer else ("whole" if isinstance(model, UserModule) else "layers")
        self.user_keys = model.__dict__.get("user_keys")
        traced = model.__dict__.get("model_call")
        self.model_call = (f"{traced.describe()}; traced into {len(model)} segments that return "
                           "every position's logits, scored on the last stage" if traced is not None
                           else self.call.describe())
        return model

    def make_optimizer(self, params: Any, horizon: int | None = None) -> torch.optim.Optimizer:
        """The job's optimizer over ``params``, following ``--lr-schedule`` (which ends at update
        ``horizon``, default the job's steps: one update per step)."""
        c = self.config
        opt: torch.optim.Optimizer
        if c.optimizer == "adam":
            opt = torch.optim.Adam(params, lr=c.lr, weight_decay=c.weight_decay)
        elif c.optimizer == "adamw":
            opt = torch.optim.AdamW(params, lr=c.lr, weight_decay=c.weight_decay)
        else:
            momentum = c.momentum if c.optimizer == "momentum" else 0.0
            opt = torch.optim.SGD(params, lr=c.lr, momentum=momentum, weight_decay=c.weight_decay)
        return schedule.attach(opt, schedule.from_config(c, horizon or self.steps))

    def loss(self, out: Any, y: torch.Tensor) -> torch.Tensor:
        """The loss the model returned, else ``--loss`` on its output, else the task's loss."""
        own = loss_of(out)
        if own is not None:
            return own
        if self.config.loss is not None and self._loss_fn is None:
            from polytrain.targets import load_callable

            self._loss_fn = load_callable(self.config.loss, "loss function")
        if self._loss_fn is not None:
            return self._loss_fn(output_of(out), y)
        return task_loss(self.spec, output_of(out), y)

    @property
    def takes_targets(self) -> bool:
        return self.call.kind == "targets"

    def forward(self, forward: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
        """The model's output for one batch through ``forward`` (the model, DDP, a replica...):
        ``forward(x, y)`` for a model called with its targets, ``forward(x)`` otherwise (a user
        module held whole applies the rest of its contract itself, :mod:`polytrain.models.call`)."""
        return forward(x, y) if self.takes_targets else forward(x)

    def forward_loss(self, forward: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss of one batch through ``forward`` (the model, DDP, ...)."""
        return self.loss(self.forward(forward, x, y), y)

    def batches(self) -> GlobalBatches:
        return GlobalBatches(self.dataset.x_train, self.dataset.y_train, self.batch_size,
                             self.config.seed)

    @torch.no_grad()
    def evaluate(self, forward: Any, batch: int = 512) -> dict[str, float]:
        """Test-set accuracy and loss of ``forward`` (a model or any callable x -> logits)."""
        was_training = getattr(forward, "training", False)
        if hasattr(forward, "eval"):
            forward.eval()
        x, y = self.dataset.x_test, self.dataset.y_test
        correct = counted = 0
        loss_sum = 0.0
        for i in range(0, x.shape[0], batch):
            xb, yb = x[i : i + batch], y[i : i + batch]
            out = self.forward(forward, xb, yb) if hasattr(forward, "eval") else forward(xb)
            c, n = task_correct(self.spec, output_of(out), yb)
            correct, counted = correct + c, counted + n
            loss_sum += float(self.loss(out, yb)) * xb.shape[0]
        if was_training:
            forward.train()
        return {"accuracy": correct / max(counted, 1), "loss": loss_sum / max(x.shape[0], 1)}


@dataclass
class RankContext:
    """Where one rank runs: its place in the world, its communicator, recorder and storage."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str
    comm: Comm
    recorder: Recorder
    run_dir: Path
    checkpoints: CheckpointStore
    resume: bool = False
    progress: RankProgress | None = None
    slow_rank: int | None = None
    slow_factor: float = 1.0

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def straggle(self, work_s: float) -> None:
        """On the straggler rank (--set slow_rank=R), stretch ``work_s`` of work by slow_factor."""
        if self.slow_rank == self.rank and self.slow_factor > 1.0 and work_s > 0:
            time.sleep((self.slow_factor - 1.0) * work_s)


@dataclass
class RankResult:
    """What one rank reports; the leader's figures describe the job, the rest go in per_rank."""

    role: str = "worker"
    steps: int = 0
    samples: int = 0
    wall_s: float = 0.0
    final_loss: float | None = None
    eval: dict[str, float] | None = None
    strategy_metrics: dict[str, Any] = field(default_factory=dict)
    model_state: dict[str, torch.Tensor] | None = None
