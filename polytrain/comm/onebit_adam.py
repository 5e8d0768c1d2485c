"""``onebit-adam``: Adam whose momentum travels in 1 bit after a warm-up (Tang et al. 2021).

Tang et al., "1-bit Adam: Communication Efficient Large-Scale Training with Adam's Convergence
Speed", ICML 2021. Adam's variance v changes slowly once training has settled, so the paper
(i) runs plain, full-precision data-parallel Adam for a warm-up of T steps, (ii) then freezes v
and (iii) from then on exchanges the *momentum* instead of the gradient, compressed to 1 bit with
error feedback on the workers and on the server (:mod:`polytrain.comm.twostage`). Momentum SGD
with a fixed per-coordinate preconditioner is linear in the momentum, which is why error feedback
then keeps Adam's convergence (the paper's analysis); Adam's own v is not, which is why plain
1-bit gradients lose accuracy under Adam (issue 51: topk/dgc 1-2.5 points).

How it meets the optimizer (``allreduce``, and the data-parallel axis of ``mesh``):
:class:`OneBitAdam` *is* the job's Adam (``torch.optim.Adam``, the same lr, betas, eps and weight
decay) and the gradient exchange — ``allreduce``'s DDP hook
(:func:`polytrain.comm.ddp_hooks.onebit_hook`), ``mesh``'s dp all-reduce at the flush — asks it
which stage it is in (in ``mesh`` each rank's optimizer holds its stage's or its tensor shard's
parameters and exchanges with the ranks of its dp group only):

* steps 1..T (``onebit_warmup=T``): the hook all-reduces the gradients in full precision and
  ``step()`` is ``torch.optim.Adam.step`` itself, so with T ≥ steps the run *is* uncompressed
  Adam, bit for bit;
* steps T+1..: the hook passes each rank's local gradient through untouched (no bytes), and
  ``step()`` does the rest — on every rank, in model order as one flat vector (N,), with
  d = √v / √(1−β2^T) + eps the preconditioner frozen at step T:
  u_local = (β1·m + (1−β1)·(g_local + wd·θ)) / d, clipped at :func:`adam_bound`;
  u = two-stage 1-bit mean of u_local
  (identical on every rank); m ← u·d; θ ← θ − lr/(1−β1^t) · u.
  Adam's update is never applied on top: the compressed momentum replaces Adam's.

**Compressed in the preconditioner's units** (polytrain's choice, not the paper's): the paper
compresses m itself and divides by √v afterwards. Since d is frozen and the same on every rank,
the mean of u is the mean of m divided by d, so the exchange is the same linear average; only the
compression error is measured differently. Compressing m directly diverged here (a 2-rank MLP on
digits, warm-up 2: loss 5e20 at step 5, NaN at step 6): coordinates whose gradient was (nearly)
zero during the warm-up — digits' blank border pixels give exactly v = 0 — receive ±(their
piece's mean |m|) from the sign code and divide it by √v + eps ≈ 1e-8. In u's units every
coordinate is an Adam step (|u| ≲ 1), so a coordinate the sign code gets wrong moves by at most
about lr, and error feedback takes it back on the next steps.

Bias correction continues Adam's (β1's with the running step t, β2's frozen with v at T), so the
update is continuous at the switch; the paper drops both (β1^t < 3e-5 once t > 100; β2's is a
constant factor on the learning rate).

State: m, v and the step are Adam's own (``optimizer.state_dict()``, checkpointed as usual); the
worker and server residuals are the exchange's (:meth:`TwoStage.state_dict`, each rank its own).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from polytrain.comm.accounted import Comm
from polytrain.comm.twostage import OP, TwoStage
from polytrain.metrics.recorder import Recorder


def adam_bound(beta1: float, beta2: float) -> float:
    """The most Adam itself can move one coordinate in one step, in units of lr:
    |m_t|/√v_t ≤ (1−β1)/√(1−β2) · Σ_k (β1/√β2)^k = (1−β1) / (√(1−β2)·(1−β1/√β2)) (31.8 at 0.9,
    0.999), since |g_(t−k)| ≤ √(v_t / ((1−β2)·β2^k)) for every k."""
    return (1 - beta1) / (math.sqrt(1 - beta2) * (1 - beta1 / math.sqrt(beta2)))


class OneBitAdam(torch.optim.Adam):
    """``torch.optim.Adam`` over one parameter group, compressed after ``warmup`` steps."""

    def __init__(self, named: list[tuple[str, nn.Parameter]], *, lr: float, weight_decay: float,
                 warmup: int, comm: Comm, rec: Recorder, entropy: str = "none", seed: int = 0) -> None:
        super().__init__([p for _, p in named], lr=lr, weight_decay=weight_decay)
        self.warmup, self.comm, self.rec = warmup, comm, rec
        self.exchange = TwoStage([(n, p.numel()) for n, p in named], comm.world, comm.rank,
                                 entropy=entropy, seed=seed)
        self.compressed_steps = 0

    @property
    def params(self) -> list[nn.Parameter]:
        return list(self.param_groups[0]["params"])

    @property
    def steps_done(self) -> int:
        st = self.state.get(self.params[0], {})
        return int(st["step"]) if "step" in st else 0

    @property
    def compressing(self) -> bool:
        """Whether the next step is a compressed one (its gradients stay local)."""
        return self.steps_done >= self.warmup

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        if not self.compressing:
            return super().step(closure)
        loss = None if closure is None else closure()
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        params = self.params
        v_scale = math.sqrt(1 - beta2**self.warmup)  # v's bias correction, frozen with v
        bound = adam_bound(beta1, beta2)
        denoms, local = [], []
        for p in params:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            if group["weight_decay"]:
                g = g.add(p, alpha=group["weight_decay"])  # Adam's L2, as torch.optim.Adam adds it
            st = self.state[p]
            denoms.append((st["exp_avg_sq"].sqrt() / v_scale).add_(group["eps"]))
            # the momentum in the frozen preconditioner's units (see the module's note)
            u_p = torch.lerp(st["exp_avg"], g, 1 - beta1) / denoms[-1]
            local.append(u_p.clamp_(-bound, bound).reshape(-1))
        u = self.exchange.mean(self.comm, torch.cat(local).float().cpu(), self.rec).to(params[0].device)
        for p, u_p, d in zip(params, u.split([p.numel() for p in params]), denoms, strict=True):
            st = self.state[p]
            st["step"] += 1
            u_p = u_p.view_as(p)
            st["exp_avg"].copy_(u_p * d)
            p.add_(u_p, alpha=-group["lr"] / (1 - beta1 ** float(st["step"])))
        self.compressed_steps += 1
        return loss

    def report(self, steps: int, counted: Comm | None = None,
               ops: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The codec's figures for summary.json (bytes counted at each send, op ``onebit``, by
        ``counted``: default the exchange's comm; a sub-group's are booked on the rank's).
        ``ops``: the ops of the data-parallel exchange (warm-up included; default: every op)."""
        by_op = (counted or self.comm).by_op()
        if ops is not None:
            by_op = {op: n for op, n in by_op.items() if op in ops}
        wire = by_op.get(OP, 0) + by_op.get(f"{OP}_sizes", 0)
        return {"codec": f"onebit-adam(warmup={self.warmup})", "error_feedback": True,
                **self.exchange.report(), "warmup_steps": self.warmup,
                "compressed_steps": self.compressed_steps,
                "wire_bytes_per_compressed_step": (round(wire / self.compressed_steps, 1)
                                                   if self.compressed_steps else None),
                "wire_bytes_per_step": round(sum(by_op.values()) / max(steps, 1), 1)}
