"""``dgc``: Deep Gradient Compression — Lin, Han, Mao, Wang & Dally, ICLR 2018.

Top-k sparsification (``ratio=``) plus the paper's three corrections:

* **momentum correction**: the codec keeps the velocity u ← m·u + g (``momentum=``, default 0.9)
  and sparsifies the accumulated velocity (u plus the error-feedback residual v) instead of the
  raw gradient; **momentum factor masking**: entries that were sent are zeroed in u as well, so
  stale momentum does not push them again. Use ``--optimizer sgd`` without momentum with it:
  the momentum lives here. A consequence of the masking: an entry sent every step never keeps
  momentum, so at ``ratio=1`` DGC is plain SGD, and larger ratios move it towards it (on the
  testbed's VGG-16-BN job, 5 % and 10 % learned slower than 1 %; without masking 5 % reached
  the target fastest: README). ``masking=False``
  (``--set dgc_masking=false``) keeps the velocity of sent entries: every gradient then reaches
  the parameters with the total weight 1/(1−m) it has under momentum SGD, only later for the
  entries held back, and at ``ratio=1`` DGC is exactly momentum SGD (a polytrain option, not the
  paper's).
* **local gradient clipping** (``clip=C``): each parameter's local gradient is clipped to norm
  C·W^(−1/2) before it is accumulated (the paper clips the whole local gradient by the same
  rule; per-parameter is what a DDP bucket hook sees).
* **sparsity warm-up** (``warmup=T`` encodings): the kept fraction falls geometrically from 25% to
  ``ratio`` over the first T encodings of each parameter (the paper: 75%, 93.75%, … sparsity
  over the first epochs).

Simplified: no sampling-based threshold estimation (exact ``torch.topk``), no warm-up of the
learning rate.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from polytrain.comm.codecs.base import Key, count
from polytrain.comm.codecs.payload import Payload
from polytrain.comm.codecs.sparse import TopK


class Dgc(TopK):
    name = "dgc"

    def __init__(self, ratio: float, momentum: float = 0.9, clip: float | None = None,
                 warmup: int = 0, world: int = 1, gen: torch.Generator | None = None,
                 per_tensor: bool = False, masking: bool = True) -> None:
        super().__init__(ratio, gen, per_tensor)
        self.momentum, self.clip, self.warmup, self.world = momentum, clip, warmup, world
        self.masking = masking
        self.velocity: dict[int, torch.Tensor] = {}

    @property
    def label(self) -> str:
        mask = "" if self.masking else ", masking=off"
        return f"dgc(ratio={self.ratio:g}, momentum={self.momentum:g}{mask})"

    def ratio_at(self, call: int) -> float:
        """The kept fraction at the ``call``-th encoding (sparsity warm-up)."""
        if call >= self.warmup or self.ratio >= 0.25:
            return self.ratio
        return 0.25 ** (1 + call / self.warmup * (math.log(self.ratio, 0.25) - 1))

    def keep(self, x: torch.Tensor, key: Key) -> int:
        return count(x.numel(), self.ratio_at(key.call))

    def pre(self, g: torch.Tensor, key: Key) -> torch.Tensor:
        """Clip the local gradient, then fold it into the velocity; the velocity is what is sent."""
        if self.clip is not None:
            limit = self.clip / math.sqrt(self.world)
            norm = float(g.norm())
            if norm > limit:
                g = g * (limit / norm)
        u = self.velocity.get(key.index)
        u = g.clone() if u is None else u.mul_(self.momentum).add_(g)
        self.velocity[key.index] = u
        return u

    def post(self, p: Payload, key: Key) -> None:
        """Momentum factor masking: what was sent leaves the velocity."""
        if not self.masking:
            return
        self.velocity[key.index][p["indices"].long()] = 0.0

    def post_group(self, p: Payload, keys: list[Key], sizes: list[int]) -> None:
        """Momentum factor masking for a flat payload of several parameters: each parameter's
        velocity loses the entries of its own range."""
        if not self.masking:
            return
        idx = p["indices"].long()  # sorted: each parameter's entries are one run of them
        ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0)
        upto = torch.searchsorted(idx, ends).tolist()
        lo = at = 0
        for key, n, end in zip(keys, sizes, upto, strict=True):
            if end > at:
                self.velocity[key.index][idx[at:end] - lo] = 0.0
            lo, at = lo + n, end

    def state_dict(self) -> dict[str, Any]:
        return {str(i): u for i, u in self.velocity.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.velocity = {int(i): u.clone() for i, u in state.items()}
