"""Gradient codecs (``--set compression=NAME``): one module per family.

========== ============================== ======== ==========================================
name       module                         EF dflt  payload per tensor of N entries
========== ============================== ======== ==========================================
fp16/bf16  :mod:`.cast`                   off      N 16-bit values (all-reduced as they are)
topk       :mod:`.sparse`                 on       k int32 indices + k float32 values
randomk    :mod:`.sparse`                 on       k float32 values (indices: shared seed)
threshold  :mod:`.sparse`                 on       int32 indices + 1 sign bit each (±τ)
onebit     :mod:`.quant`                  on       N sign bits + 2 float32 scales (per tensor/row)
terngrad   :mod:`.quant`                  off      N 2-bit codes + 1 float32 scale
qsgd       :mod:`.quant`                  off      N level codes + N sign bits + the norm
dgc        :mod:`.dgc`                    on       top-k of the momentum-corrected velocity
a+b        :mod:`.compose`                a or b   a's indices, b's encoding of a's values
powersgd   PyTorch's ``powerSGD_hook``    (own)    rank-r factors P, Q (allreduce only)
onebit-    :mod:`polytrain.comm.onebit_   on (2x)  Adam's momentum: N/W sign bits + 2 float32
adam       adam` (Tang et al. 2021)                scales per parameter piece, twice (allreduce)
========== ============================== ======== ==========================================

:func:`build` turns validated options into a codec; :mod:`.engine` adds error feedback, entropy
coding and the per-parameter bookkeeping every strategy shares.
"""

from __future__ import annotations

from typing import Any

import torch

from polytrain.comm.codecs.base import Codec
from polytrain.comm.codecs.cast import Bf16, Fp16
from polytrain.comm.codecs.compose import Compose
from polytrain.comm.codecs.dgc import Dgc
from polytrain.comm.codecs.quant import OneBit, Qsgd, TernGrad
from polytrain.comm.codecs.sparse import RandomK, Threshold, TopK, _Ratio

SPARSIFIERS = ("topk", "randomk", "dgc")
VALUE_CODECS = ("fp16", "bf16", "onebit", "terngrad", "qsgd")
SINGLE = ("fp16", "bf16", "topk", "randomk", "threshold", "onebit", "terngrad", "qsgd", "dgc")
HOOK_ONLY = ("powersgd",)  # PyTorch's DDP hook, not a codec object
OPTIMIZER_AWARE = ("onebit-adam",)  # replaces Adam's step: :mod:`polytrain.comm.onebit_adam`
NAMES = ("none", *SINGLE, *HOOK_ONLY, *OPTIMIZER_AWARE)


def valid_names() -> str:
    return f"{', '.join(NAMES)}, or a+b with a in {'/'.join(SPARSIFIERS)} and b in {'/'.join(VALUE_CODECS)}"


def check_name(spec: str) -> str:
    """Refuse an unknown codec name or an impossible composition (one line, valid values)."""
    parts = spec.split("+")
    ok = (spec in NAMES if len(parts) == 1
          else len(parts) == 2 and parts[0] in SPARSIFIERS and parts[1] in VALUE_CODECS)
    if not ok:
        raise ValueError(f"unknown codec '{spec}'; valid: {valid_names()}")
    return spec


def _one(name: str, opts: Any, world: int, gen: torch.Generator) -> Codec:
    if name == "fp16":
        return Fp16(gen)
    if name == "bf16":
        return Bf16(gen)
    if name == "topk":
        return TopK(opts.ratio, gen, per_tensor=opts.select == "tensor")
    if name == "randomk":
        return RandomK(opts.ratio, gen)
    if name == "threshold":
        return Threshold(opts.tau, gen)
    if name == "onebit":
        return OneBit(opts.scale, gen)
    if name == "terngrad":
        return TernGrad(gen)
    if name == "qsgd":
        return Qsgd(opts.levels, gen)
    if name == "dgc":
        return Dgc(opts.ratio, opts.dgc_momentum, opts.dgc_clip, opts.dgc_warmup, world, gen,
                   per_tensor=opts.select == "tensor", masking=opts.dgc_masking)
    raise ValueError(f"unknown codec '{name}'; valid: {valid_names()}")


def build(opts: Any, world: int, gen: torch.Generator) -> Codec:
    """The codec ``opts.compression`` names, with its options (``ratio``, ``tau``, ...)."""
    parts = check_name(opts.compression).split("+")
    if len(parts) == 2:
        outer = _one(parts[0], opts, world, gen)
        assert isinstance(outer, _Ratio)  # check_name: the left side is a sparsifier
        return Compose(outer, _one(parts[1], opts, world, gen))
    return _one(parts[0], opts, world, gen)


__all__ = ["NAMES", "Codec", "build", "check_name", "valid_names"]
