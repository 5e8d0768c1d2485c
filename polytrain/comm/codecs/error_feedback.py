"""Error feedback (residual memory): what a codec did not send is added to the next gradient.

Per parameter: x = g + r; send encode(x); r ← x − decode(encode(x)). So decode(encode(x)) + r_new
= g + r_old — exactly (bit for bit) when the subtraction is exact in float32: always for the
sparsifiers (each entry is either sent as it is or kept whole) and for fp16/bf16 (the rounding
error of a cast is representable); for the quantisers (onebit, terngrad, qsgd, threshold's ±τ)
the residual is float32 and carries one rounding. Seide et al. 2014 introduced it for 1-bit SGD;
Karimireddy et al., "Error Feedback Fixes SignSGD", ICML 2019, prove why it is needed.
"""

from __future__ import annotations

import torch


class ErrorFeedback:
    """One residual (flat float32) per parameter name; saved and restored with checkpoints."""

    def __init__(self) -> None:
        self.residuals: dict[str, torch.Tensor] = {}

    def add(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """g + r (a new tensor; ``g`` is left alone)."""
        r = self.residuals.get(name)
        return g.clone() if r is None else g + r

    def keep(self, name: str, x: torch.Tensor, decoded: torch.Tensor) -> None:
        self.residuals[name] = x - decoded

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: r.clone() for n, r in self.residuals.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.residuals = {n: r.clone() for n, r in state.items()}
