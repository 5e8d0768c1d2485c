"""Which weights a stage's forward and backward use, and when the stage updates them.

- `FlushWeights` (gpipe, 1f1b): forwards use the live parameters; gradients of the M
  micro-batches accumulate; one optimizer step after the flush (`end_segment`). A replicated
  stage sums its replicas' gradients first (`sync_gradients`), so all replicas stay identical.
- `StashedWeights` (pipedream): an update after every backward. Each forward runs on a *version*:
  a frozen copy of the parameters taken when the version was current (weight stashing), so the
  backward of that mini-batch differentiates exactly the weights its forward used, however many
  updates happened in between. The live parameters are only ever updated, never run. With
  ``vertical_sync`` stage s runs mini-batch m on the version the input stage used for m (the
  tag on the activation), so a mini-batch sees one consistent model across stages.
- `PredictedWeights` (spectrain): no stash of the past; the forward runs on a prediction of the
  weights the mini-batch will meet at its update, Ŵ = W − s·η·v (v: the SGD momentum buffer, or
  the last gradient without momentum; s: the updates this stage makes between the forward and the
  backward), and the backward uses that same Ŵ.

A version's tensors are leaves that require grad; ``functional_call`` runs the stage on them,
so autograd saves them (not the live parameters, which the optimizer changes in place).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from polytrain.comm import Comm, GroupComm
from polytrain.runtime.clip import GradSplit, clip_grad_norm
from polytrain.runtime.precision import Precision
from polytrain.schedules.actions import Action
from polytrain.strategies.pipeline.ties import TiedGrads

Params = dict[str, torch.Tensor]
# Why the pipelines that update after every backward (pipedream, spectrain) refuse these.
ASYNC_WHY = {
    "clip": ("it updates each stage after every backward, so the whole model's gradient of one "
             "mini-batch never exists at one moment; clipping each stage's gradient by its own "
             "norm would not be the global norm, so it is refused"),
    "grad_accum": ("each backward is followed by its stage's update (weight versions are per "
                   "mini-batch); K micro-batches per update would need a version per K backwards, "
                   "which is not built"),
    "precision": ("fp16's overflow skip must be agreed by every stage at one update, and without "
                  "a flush each stage updates after its own backwards, so there is none; bf16 is "
                  "not wired into its weight versions either"),
}


def sync_gradients(replicas: GroupComm, module: nn.Module) -> None:
    """Sum the accumulated gradients over a stage's replicas (one flat all-reduce).

    Each replica ran a disjoint share of the M micro-batches, each scaled by 1/M, so the sum is
    the whole mini-batch's gradient: every replica then takes the same optimizer step.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    replicas.all_reduce(flat, op="replica_allreduce")
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


def predict(weight: torch.Tensor, velocity: torch.Tensor | None, lr: float, distance: int) -> torch.Tensor:
    """SpecTrain's prediction Ŵ = W − s·η·v: ``distance`` more SGD steps along ``velocity``."""
    if velocity is None or distance == 0:
        return weight.detach().clone()
    return weight.detach() - distance * lr * velocity


def _nbytes(params: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in params)


def backward_distances(order: Iterable[Action]) -> dict[int, int]:
    """Micro-batch -> number of backwards (hence updates) between its forward and its backward."""
    out: dict[int, int] = {}
    open_f: dict[int, int] = {}
    done = 0
    for a in order:
        if a.op == "F":
            open_f[a.microbatch] = done
        elif a.op == "B":
            out[a.microbatch] = done - open_f.pop(a.microbatch)
            done += 1
    return out


class FlushWeights:
    """Live parameters, accumulated gradients, one update per segment (a flush)."""

    updates_per_backward = False

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        # optimizer None: the caller updates elsewhere (distbelief's parameter servers)
        self.module, self.optimizer = module, optimizer
        self.version = 0
        self.replicas: GroupComm | None = None  # set by the shell when this stage is replicated
        self.tied: TiedGrads | None = None  # set when this stage shares a parameter with another
        self.clip: tuple[float, GradSplit] | None = None  # --clip-grad-norm: set by the shell
        self.amp = Precision("fp32", torch.device("cpu"))  # --precision: set by `mixed`
        self.amp_comm: Comm | None = None

    def mixed(self, amp: Precision, comm: Comm) -> None:
        """``--precision``: the executor's autocast and loss scale; at the flush every rank of
        ``comm`` (all of the job's stages) agrees on an fp16 overflow, so all skip that step."""
        self.amp, self.amp_comm = amp, comm

    def clip_by(self, max_norm: float | None, comm: Comm, replicas: int = 1) -> None:
        """``--clip-grad-norm``: at each flush, clip by the norm over every rank of ``comm``
        (all of the job's stages); this stage's gradient is held by its ``replicas`` (after their
        all-reduce), a tied one also by the other stages that use it. Collective: set ``tied``
        first, and every rank of ``comm`` clips at the same flushes."""
        if max_norm is None:
            return
        copies = {id(p): replicas for p in self.module.parameters()}
        for p, group in self.tied.ties if self.tied else ():
            copies[id(p)] = replicas * group.world
        self.clip = (max_norm, GradSplit(comm, copies))

    def begin_segment(self, order: list[Action]) -> None:
        self.module.zero_grad(set_to_none=True)

    def forward_params(self, mb: int, tag: float) -> Params | None:
        return None

    def out_tag(self, mb: int, tag_in: float) -> float:
        return float(self.version)

    def version_of(self, mb: int) -> int:
        """The weight version micro-batch ``mb`` runs on."""
        return self.version

    def params_of(self, mb: int) -> Params | None:
        """The tensors ``mb``'s forward and backward use; None = the live parameters."""
        return None

    def after_backward(self, mb: int) -> None:
        """Gradients stay in ``.grad`` and accumulate until the flush."""

    def end_segment(self) -> bool:
        """The flush's update; False when fp16's scaler skipped it (an overflow on any stage)."""
        if self.replicas is not None:
            sync_gradients(self.replicas, self.module)
        if self.tied:
            self.tied.sum_gradients()
        assert self.optimizer is not None, "a flush without an optimizer updates elsewhere"
        self.amp.unscale(self.optimizer, self.amp_comm)  # fp16: before the norm reads them
        if self.clip is not None:  # the whole model's norm: one all-reduce over every stage
            clip_grad_norm(self.module.parameters(), *self.clip)
        updated = self.amp.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        return updated

    def held_ptrs(self) -> set[int]:
        return {p.untyped_storage().data_ptr() for p in self.module.parameters()}

    def stash_bytes(self) -> int:
        return 0

    def state(self) -> dict[str, Any]:
        return {"version": self.version}

    def load_state(self, state: dict[str, Any]) -> None:
        self.version = int(state["version"])

    def metrics(self) -> dict[str, Any]:
        return {}


class StashedWeights(FlushWeights):
    """PipeDream's weight stashing (and vertical sync): see the module docstring."""

    updates_per_backward = True

    def __init__(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, stage: int, vertical_sync: bool = False
    ) -> None:
        super().__init__(module, optimizer)
        self.optimizer: torch.optim.Optimizer = optimizer
        self.stage, self.vertical_sync = stage, vertical_sync
        self.versions: dict[int, Params] = {}
        self.used: dict[int, int] = {}  # in-flight micro-batch -> version its forward used
        self.floor = 0  # vertical sync: versions below this can no longer be asked for
        self.staleness: Counter[int] = Counter()
        self.peak_versions = 0
        self.peak_stash_bytes = 0

    def _snapshot(self) -> Params:
        return {
            n: p.detach().clone().requires_grad_(p.requires_grad) for n, p in self.module.named_parameters()
        }

    def begin_segment(self, order: list[Action]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.versions.setdefault(self.version, self._snapshot())

    def _version_for(self, tag: float) -> int:
        if self.vertical_sync and self.stage > 0:
            v = int(tag)
            self.floor = v
            if v not in self.versions:
                raise RuntimeError(
                    f"stage {self.stage}: vertical sync asks for weight version {v}, which is no "
                    f"longer stashed (kept: {sorted(self.versions)}, current {self.version})."
                )
            return v
        return self.version

    def forward_params(self, mb: int, tag: float) -> Params | None:
        v = self._version_for(tag)
        self.used[mb] = v
        self._note_peak()
        return self.versions[v]

    def out_tag(self, mb: int, tag_in: float) -> float:
        # the input stage's version travels with the mini-batch down the pipeline
        return float(self.used[mb]) if self.stage == 0 else tag_in

    def version_of(self, mb: int) -> int:
        return self.used[mb]

    def params_of(self, mb: int) -> Params | None:
        return self.versions[self.used[mb]]

    def after_backward(self, mb: int) -> None:
        v = self.used.pop(mb)
        self.staleness[self.version - v] += 1
        stash = self.versions[v]
        for name, p in self.module.named_parameters():
            p.grad, stash[name].grad = stash[name].grad, None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        self.versions[self.version] = self._snapshot()
        self._prune()

    def _prune(self) -> None:
        keep = set(self.used.values()) | {self.version}
        if self.vertical_sync and self.stage > 0:
            keep |= {v for v in self.versions if v >= self.floor}
        self.versions = {v: t for v, t in self.versions.items() if v in keep}
        self._note_peak()

    def _held_versions(self) -> int:
        return len(self.versions)

    def _note_peak(self) -> None:
        self.peak_versions = max(self.peak_versions, self._held_versions())
        self.peak_stash_bytes = max(self.peak_stash_bytes, self.stash_bytes())

    def end_segment(self) -> bool:
        """No flush: updates already happened after each backward."""
        return True

    def held_ptrs(self) -> set[int]:
        ptrs = super().held_ptrs()
        return ptrs | {t.untyped_storage().data_ptr() for ver in self.versions.values() for t in ver.values()}

    def stash_bytes(self) -> int:
        """Bytes of weight versions kept besides the live parameters."""
        return sum(_nbytes(ver.values()) for ver in self.versions.values())

    def metrics(self) -> dict[str, Any]:
        return {
            "staleness": {str(k): n for k, n in sorted(self.staleness.items())},
            "max_staleness": max(self.staleness, default=0),
            "stashed_versions_peak": self.peak_versions,
            "stash_bytes_peak": self.peak_stash_bytes,
        }


class PredictedWeights(StashedWeights):
    """SpecTrain: each forward (and its backward) uses Ŵ = W − s·η·v instead of a stash."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, stage: int) -> None:
        super().__init__(module, optimizer, stage)
        self.predicted: dict[int, Params] = {}
        self.distance: dict[int, int] = {}
        self.last_grad: dict[str, torch.Tensor] = {}
        self.predicted_staleness: Counter[int] = Counter()

    def begin_segment(self, order: list[Action]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.distance = backward_distances(order)

    def _velocity(self, name: str, p: torch.Tensor) -> torch.Tensor | None:
        buf = self.optimizer.state.get(p, {}).get("momentum_buffer")
        return buf if buf is not None else self.last_grad.get(name)

    def forward_params(self, mb: int, tag: float) -> Params | None:
        s = self.distance.get(mb, 0)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.predicted[mb] = {
            n: predict(p, self._velocity(n, p), lr, s).requires_grad_(p.requires_grad)
            for n, p in self.module.named_parameters()
        }
        self.used[mb] = self.version
        self.predicted_staleness[s] += 1
        self._note_peak()
        return self.predicted[mb]

    def after_backward(self, mb: int) -> None:
        stash = self.predicted.pop(mb)
        self.staleness[self.version - self.used.pop(mb)] += 1
        keep_grad = float(self.optimizer.param_groups[0].get("momentum", 0.0)) == 0.0
        for name, p in self.module.named_parameters():
            p.grad, stash[name].grad = stash[name].grad, None
            if keep_grad and p.grad is not None:  # without momentum, v is the last gradient
                self.last_grad[name] = p.grad.detach().clone()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1

    def _held_versions(self) -> int:
        return len(self.predicted)

    def params_of(self, mb: int) -> Params | None:
        return self.predicted[mb]

    def held_ptrs(self) -> set[int]:
        ptrs = FlushWeights.held_ptrs(self)
        return ptrs | {
            t.untyped_storage().data_ptr() for ver in self.predicted.values() for t in ver.values()
        }

    def stash_bytes(self) -> int:
        return sum(_nbytes(ver.values()) for ver in self.predicted.values())

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        out["predicted_distance"] = {str(k): n for k, n in sorted(self.predicted_staleness.items())}
        out["predicted_versions_peak"] = out.pop("stashed_versions_peak")
        out["prediction_bytes_peak"] = out.pop("stash_bytes_peak")
        return out
