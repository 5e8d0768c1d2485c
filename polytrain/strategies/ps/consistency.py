"""Consistency models of a parameter server: what a server does with each push, and when it may
answer a pull. Pure logic over tensors — no processes — so each rule is testable alone.

Every server keeps its own policy object (servers never talk to each other), fed the pushes of
W workers. Two counters matter:

* ``step`` — what pulls wait on. BSP and k-of-n: global steps aggregated so far. Async and SSP:
  the slowest worker's clock (every worker's updates of steps ≤ ``step`` are in the shard).
* a worker's *clock* — steps it has pushed. A push carries the worker's clock after that push.

After pushing clock c a worker asks for parameters with ``need(c)``; the server answers once
``step ≥ need(c)``:

    ======== =============================== ======================================
    model    apply                            need(c)  (worker may start step c+1 when)
    ======== =============================== ======================================
    bsp      mean of all W gradients of step  c        (all W pushed step c)
    k-of-n   mean of the first k of step t;   c        (k pushed step c; late ones dropped)
             later ones of step ≤ t dropped
    async    each push at once, scaled 1/W    -1       (never waits: Downpour)
    ssp      each push at once, scaled 1/W    c − s    (slowest clock ≥ c − s; s=0 is BSP)
    ======== =============================== ======================================

Async and SSP scale each push by 1/W so that W pushes move the parameters as far as one BSP
step on the same B samples: the job's --lr means the same thing in every consistency model.

Staleness (``staleness_hist``/``staleness_max``, in steps): a gradient for step c was computed
on parameters that held every worker's updates up to step m (the server's ``step`` when it
answered that worker's last pull); it should have held those up to c − 1, so its staleness is
(c − 1) − m. BSP: always 0. SSP: ≤ s by construction, and measured. Async with a straggler:
how far the fast workers run ahead of the slowest one. ``update_lag`` is Downpour's writer-side
view: optimizer applications to the shard between that pull and this push's application.
"""

from __future__ import annotations

from typing import ClassVar

import torch

CONSISTENCIES = ("bsp", "async", "ssp", "k-of-n")


class ProtocolError(RuntimeError):
    """A push that the consistency model cannot have produced (a bug, never a user error)."""


class Consistency:
    """Base policy: subclasses decide ``on_push`` and ``need``."""

    name: ClassVar[str] = ""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.clocks = [0] * workers
        self.dropped = 0
        self.accepted = [0] * workers

    @property
    def step(self) -> int:
        return min(self.clocks)

    def need(self, clock: int) -> int:
        """The server step a worker that just pushed ``clock`` waits for before step clock+1."""
        return -1

    def on_push(self, worker: int, clock: int, grad: torch.Tensor) -> torch.Tensor | None:
        """Take one worker's gradient; return the gradient to apply now, or None."""
        raise NotImplementedError

    def state(self) -> dict[str, torch.Tensor]:
        """The counters a checkpoint keeps (taken at a cut where no step is half aggregated)."""
        return {"clocks": torch.tensor(self.clocks), "accepted": torch.tensor(self.accepted),
                "dropped": torch.tensor(self.dropped)}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        self.clocks = [int(c) for c in state["clocks"].tolist()]
        self.accepted = [int(c) for c in state["accepted"].tolist()]
        self.dropped = int(state["dropped"])


class Bsp(Consistency):
    """Bulk synchronous: one update per step, the mean of all W gradients."""

    name = "bsp"

    def __init__(self, workers: int, k: int | None = None) -> None:
        super().__init__(workers)
        self.k = k or workers
        self._step = 0
        self._sum: torch.Tensor | None = None
        self._count = 0

    @property
    def step(self) -> int:
        return self._step

    def need(self, clock: int) -> int:
        return clock

    def on_push(self, worker: int, clock: int, grad: torch.Tensor) -> torch.Tensor | None:
        if clock != self._step + 1:
            raise ProtocolError(f"{self.name}: worker {worker} pushed step {clock} while the "
                                f"server aggregates step {self._step + 1}")
        self.clocks[worker] = clock
        self.accepted[worker] += 1
        self._sum = grad.clone() if self._sum is None else self._sum.add_(grad)
        self._count += 1
        if self._count < self.k:
            return None
        out, self._sum, self._count = self._sum.div_(self.k), None, 0
        self._step += 1
        return out

    def state(self) -> dict[str, torch.Tensor]:
        if self._count:
            raise ProtocolError(f"{self.name}: checkpoint while step {self._step + 1} is half "
                                f"aggregated ({self._count} of {self.k} gradients)")
        return {**super().state(), "step": torch.tensor(self._step)}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state(state)
        self._step = int(state["step"])


class KOfN(Bsp):
    """Synchronous with backup workers: the first k gradients of each step; later ones dropped."""

    name = "k-of-n"

    def on_push(self, worker: int, clock: int, grad: torch.Tensor) -> torch.Tensor | None:
        if clock <= self._step:  # step already aggregated: this gradient came too late
            self.clocks[worker] = clock
            self.dropped += 1
            return None
        return super().on_push(worker, clock, grad)


class Async(Consistency):
    """Downpour: every push is applied as it arrives; pulls never wait."""

    name = "async"

    def on_push(self, worker: int, clock: int, grad: torch.Tensor) -> torch.Tensor | None:
        if clock <= self.clocks[worker]:
            raise ProtocolError(f"{self.name}: worker {worker}'s clock went from "
                                f"{self.clocks[worker]} to {clock}")
        self.clocks[worker] = clock
        self.accepted[worker] += 1
        return grad.div(self.workers)


class Ssp(Async):
    """Stale synchronous parallel: async updates, but no worker runs ``s`` clocks ahead."""

    name = "ssp"

    def __init__(self, workers: int, staleness: int) -> None:
        super().__init__(workers)
        self.staleness = staleness

    def need(self, clock: int) -> int:
        return clock - self.staleness


def make_consistency(name: str, workers: int, *, staleness: int = 0, k: int | None = None) -> Consistency:
    if name == "bsp":
        return Bsp(workers)
    if name == "k-of-n":
        return KOfN(workers, k)
    if name == "async":
        return Async(workers)
    if name == "ssp":
        return Ssp(workers, staleness)
    raise ValueError(f"unknown consistency '{name}'; valid: {', '.join(CONSISTENCIES)}")


def histogram(values: list[int]) -> dict[str, int]:
    """{value: count} with string keys (JSON), in value order."""
    out: dict[int, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return {str(k): out[k] for k in sorted(out)}
