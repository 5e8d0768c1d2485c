"""Memory per rank from its parts: the formulas the planner prices memory with, each once.

- **Model state per parameter** (`state_bytes`): fp32 training holds a 4-byte parameter, a 4-byte
  gradient and 4 bytes per optimizer state tensor (Adam: 2); mixed precision (bf16/fp16) holds a
  16-bit parameter and gradient and, in the optimizer, an fp32 master copy plus fp32 moments:
  2 + 2 + 12 bytes for Adam (Rajbhandari et al. 2020, "ZeRO", §3.1: K = 12).
- **Sharded data parallelism over N ranks** (`zero_bytes`, ZeRO §5 and its Table 1): stage 1
  shards the optimizer state, (p + g)Ψ + oΨ/N; stage 2 the gradients too, pΨ + (g + o)Ψ/N;
  stage 3 (and FSDP) everything, (p + g + o)Ψ/N.
- **Transformer activations per layer** (`transformer_activation_bytes`, Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", §4): a layer of sequence s,
  micro-batch b, hidden h and a heads keeps s·b·h·(34 + 5·a·s/h) bytes at 16-bit; split over t
  tensor-parallel ranks, s·b·h·(10 + 24/t + 5·a·s/(h·t)); with full recomputation only its input,
  2·s·b·h (one layer's full set exists again while it is recomputed).
- **Pipeline micro-batches in flight**: each rank holds, at its peak, the (chunk, micro-batch)
  activations the registered schedule's own orders leave in flight (`cost.mesh3d`; GPipe m,
  1F1B min(m, p) on the first stage, the interleaved schedule p·v + p − 1 chunk-sets there:
  Korthikanti §4.2.3's p·(1 + (p−1)/(p·v)) stages' worth).
"""

from __future__ import annotations

from dataclasses import dataclass

HALF = ("bf16", "fp16")


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of a rank's model state."""

    param: float
    grad: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.param + self.grad + self.optimizer


def element_bytes(precision: str) -> int:
    """Bytes of one activation (or 16-bit parameter) element at ``precision``."""
    return 2 if precision in HALF else 4


def state_bytes(precision: str, optimizer_tensors: int) -> StateBytes:
    """Per parameter: ``optimizer_tensors`` fp32 state tensors (Adam 2, momentum 1, SGD 0); mixed
    precision adds the fp32 master copy and keeps 16-bit parameters and gradients."""
    if precision in HALF:
        return StateBytes(2.0, 2.0, 4.0 + 4.0 * optimizer_tensors)
    return StateBytes(4.0, 4.0, 4.0 * optimizer_tensors)


def zero_bytes(params: float, ranks: int, stage: int, sb: StateBytes) -> float:
    """Model-state bytes per rank of ``params`` parameters under ZeRO ``stage`` (0: plain data
    parallelism) over ``ranks`` data-parallel ranks."""
    if stage == 0:
        return sb.total * params
    if stage == 1:
        return (sb.param + sb.grad) * params + sb.optimizer * params / ranks
    if stage == 2:
        return sb.param * params + (sb.grad + sb.optimizer) * params / ranks
    return sb.total * params / ranks


def transformer_activation_bytes(seq: float, micro: float, hidden: float, heads: float, tp: int = 1,
                                 recompute: bool = False, element: int = 2) -> float:
    """Activation bytes one transformer layer keeps for its backward (Korthikanti et al. 2022),
    scaled from 16-bit to ``element`` bytes."""
    sbh = seq * micro * hidden
    if recompute:
        return 2 * sbh * element / 2
    return sbh * (10 + 24 / tp + 5 * heads * seq / (hidden * tp)) * element / 2

