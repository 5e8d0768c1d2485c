"""Error feedback (residual memory): what a codec did not send is added to the next gradient.

Per parameter: x = g + r; send encode(x); r ← x − decode(encode(x)). Seide et al. 2014 introduced
it for 1-bit SGD; Karimireddy et al., "Error Feedback Fixes SignSGD", ICML 2019, prove why it is
needed.

**Exactness.** The residual is kept in float64 (x = g + r is formed in float64, the codec sees
x rounded to float32, and r ← x − decoded is taken in float64 against the unrounded x), so
decode(encode(x)) + r_new == g + r_old holds exactly — as real numbers, not just to a tolerance —
whenever every one of those float64 operations is exact, i.e. whenever all the values it has
summed so far (gradients, decoded values) span less than 2^29 in magnitude (float64's 53 bits
less float32's 24): the residual's lowest bit is then never below the smallest input's last bit,
nor its highest bit 53 bits above it. That covers real gradients (tests/test_codecs.py checks it
bit for bit in exact rational arithmetic for every codec over several steps). It cannot hold for
every float32 input with any fixed-width residual: a quantiser's decoded value (onebit's row
mean, qsgd's norm·l/s, ±τ) has no relation to x's exponent, so x − d can need up to ~280 bits
(1e6 − 1e-45), and forming g + r itself rounds when a tiny residual meets a large gradient.
Beyond the 2^29 span the identity holds to within 2^-52·(|g + r_old| + |d|) (two float64
roundings), ~2^28 times tighter than the float32 residual this replaced, whose identity held
only in float32 arithmetic (one rounding of 2^-24 for the quantisers).
Cost: 8 bytes of memory per parameter entry instead of 4.
"""

from __future__ import annotations

import torch


class ErrorFeedback:
    """One residual (flat float64) per parameter name; saved and restored with checkpoints."""

    def __init__(self) -> None:
        self.residuals: dict[str, torch.Tensor] = {}

    def add(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """g + r in float64 (a new tensor; ``g`` is left alone)."""
        r = self.residuals.get(name)
        return g.double() if r is None else g.double() + r

    def keep(self, name: str, x: torch.Tensor, decoded: torch.Tensor) -> None:
        """r ← x − decoded, ``x`` as :meth:`add` returned it (float64)."""
        self.residuals[name] = x.double() - decoded.double()

    def add_group(self, names: list[str], gs: list[torch.Tensor]) -> torch.Tensor:
        """The flat float64 g + r of several parameters back to back (the same values as
        :meth:`add` on each: one float64 addition per entry)."""
        rs = [self.residuals.get(n) for n in names]
        x = torch.cat(gs).double()
        if all(r is None for r in rs):
            return x
        return x.add_(torch.cat([g.new_zeros(g.numel(), dtype=torch.float64) if r is None else r
                                 for g, r in zip(gs, rs, strict=True)]))

    def keep_group(self, names: list[str], x: torch.Tensor, decoded: torch.Tensor,
                   sizes: list[int]) -> None:
        """:meth:`keep` for :meth:`add_group`'s flat ``x``: each parameter keeps its own range."""
        r = x.double() - decoded.double()
        self.residuals.update(zip(names, r.split(sizes), strict=True))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: r.clone() for n, r in self.residuals.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.residuals = {n: r.double().clone() for n, r in state.items()}
