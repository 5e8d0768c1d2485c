"""``1f1b``: 1F1B with flush (PipeDream-Flush, Narayanan et al. 2021; DAPPLE, Fan et al. 2021).

Stage s runs P−1−s warm-up forwards, then alternates one forward and one backward, then drains;
one optimizer step per mini-batch, as ``gpipe``, so it also equals ``single``. A stage holds at
most P−s micro-batches' activations instead of M: lower peak activation memory, same bubble.

    polytrain train --strategy 1f1b --procs 4 --set microbatches=8
"""

from __future__ import annotations

from polytrain.runtime.supports import Supports
from polytrain.strategies.pipeline.gpipe import FlushStrategy


class OneFOneB(FlushStrategy):
    name = "1f1b"
    supports = Supports(lr_schedule=True, clip=True, grad_accum=True, recompute=True)
    summary = "1F1B with flush (PipeDream-Flush/DAPPLE): bounded activations, one synchronous update"
