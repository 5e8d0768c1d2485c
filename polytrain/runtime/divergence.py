"""Divergence stops a run: a non-finite loss or parameter after a step is an error.

Checked by the shared loop after every step's update and before that step's checkpoint, so the
newest checkpoint is always the last good state. The parameter check is one ``isfinite``
reduction per tensor of this rank's parameters and one host sync. In synchronous data
parallelism a NaN on one rank reaches every rank's averaged gradient, so every rank stops at
the same step; in any strategy the first rank that fails stops the job (the launcher stops
the others and names the rank and the step).
A NaN loss alone is not checked: ranks without a loss of their own (pipeline stages before the
last, servers) report NaN as "no loss here"; their parameters are checked instead.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from polytrain.errors import DivergedError


def check_finite(step: int, loss: float, model: nn.Module) -> None:
    """Raise DivergedError naming ``step`` when ``loss`` is infinite or a parameter is not finite."""
    flags = [torch.isfinite(p.detach()).all() for p in model.parameters()]
    finite = bool(torch.stack(flags).all()) if flags else True
    if math.isinf(loss) or not finite:
        what = "the loss is infinite" if math.isinf(loss) else "a parameter is NaN or infinite"
        raise DivergedError(
            f"training diverged at step {step}: {what} (loss {loss}). The "
            "newest checkpoint is the last good state; lower --lr (or check the data and "
            "--momentum/--weight-decay) and run again, or --resume from it with a lower --lr")
