"""A model too large for this machine, profiled on torch's meta device (`polytrain profile --meta`).

The model is built under ``torch.device("meta")``: every tensor has a shape and a dtype and no
storage, so a 1T-parameter GPT costs no memory. One forward and one backward per layer run on
meta tensors under `torch.utils.flop_counter.FlopCounterMode` (the FLOPs of matrix work: mm,
bmm, addmm, convolution, attention) and a dispatch mode that adds up the bytes every other
operator reads and writes (layer norms, activations, softmax, adds: memory-bound work). The
record keeps both, per layer, at the profile's batch; the cost model prices them on the
cluster's device as ``FLOPs / (peak × efficiency) + bytes / memory bandwidth`` (`cost.estimate.Scene`),
and the profile's own times are that price on ``device`` (default a100-80gb) at fp32.

A language model profiled this way runs on ``model.seq_len`` positions and scores ``model.vocab``
tokens when those options are given (the shape of the user's real data), whatever the dataset's.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from polytrain.cost.devices import Device, get_device
from polytrain.cost.profile import OPTIMIZER_STATE, LayerRecord, Profile, fc_start, layers_or_whole
from polytrain.models.partition import layers_of

#: the share of a device's peak FLOP/s dense matrix work reaches; a calibration replaces it
DEFAULT_EFFICIENCY = 0.5


class _Traffic(TorchDispatchMode):
    """Bytes read and written by every operator that FlopCounterMode does not count (views and
    metadata-only operators move nothing)."""

    FREE = ("view", "_unsafe_view", "t", "transpose", "expand", "permute", "reshape", "detach", "alias",
            "unsqueeze", "squeeze", "split", "slice", "select", "as_strided", "empty", "empty_like",
            "zeros_like", "ones_like", "new_empty", "arange", "lift_fresh", "_to_copy", "clone")

    def __init__(self, matrix: set[Any]) -> None:
        super().__init__()
        self.matrix = matrix
        self.bytes = 0.0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        packet = func._overloadpacket
        if packet not in self.matrix and packet.__name__ not in self.FREE:
            tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
            outs = out if isinstance(out, (tuple, list)) else (out,)
            tensors += [o for o in outs if isinstance(o, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


def _counted(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, matrix FLOPs, other bytes) of ``fn`` run on meta tensors."""
    flops = FlopCounterMode(display=False)
    traffic = _Traffic(set(flops.flop_registry))
    with flops, traffic:
        out = fn()
    return out, float(flops.get_total_flops()), traffic.bytes


def layer_seconds(device: Device, precision: str, flops: float, nbytes: float, efficiency: float) -> float:
    """Matrix FLOPs at ``efficiency`` of the device's peak plus the other bytes at its memory
    bandwidth (``nbytes`` counted in fp32 elements: 16-bit precisions move half)."""
    elem = 2 if precision in ("bf16", "fp16") else 4
    return flops / (device.peak(precision) * efficiency) + nbytes * elem / 4 / device.memory_bytes_per_s


def meta_spec(spec: Any, options: dict[str, Any]) -> Any:
    """The data shape a meta profile runs: ``seq_len`` positions and ``vocab`` classes of a
    language model where its options give them."""
    if spec.task != "lm":
        return spec
    seq = int(options.get("seq_len") or spec.input_shape[0])
    vocab = max(int(options.get("vocab") or spec.num_classes), spec.num_classes)
    return dataclasses.replace(spec, input_shape=(seq,), num_classes=vocab)


def meta_profile(cfg: Any, device: str = "a100-80gb", efficiency: float = DEFAULT_EFFICIENCY) -> Profile:
    """Profile ``cfg``'s model (a JobConfig) at ``cfg.batch_size`` on the meta device."""
    from polytrain.data import dataset_spec
    from polytrain.models.registry import resolve_model

    dev = get_device(device)
    spec = meta_spec(dataset_spec(cfg.dataset, cfg.data_options), dict(cfg.model_options))
    with torch.device("meta"):
        model = layers_or_whole(resolve_model(cfg.model, spec, cfg.model_options))
        shape = (cfg.batch_size, *spec.input_shape)
        x = (torch.empty(shape, dtype=torch.long) if spec.input_dtype == "long" else torch.empty(shape))
    state = OPTIMIZER_STATE.get(cfg.optimizer, 2)
    records = []
    seen: dict[tuple[Any, ...], tuple[torch.Tensor, float, float, float, float]] = {}
    for name, layer in layers_of(model):
        # layers of one class with the same parameter shapes on the same input count the same
        # (a transformer's blocks): counted once
        key = (type(layer), tuple((n, tuple(p.shape)) for n, p in layer.named_parameters()),
               tuple(x.shape), x.dtype)
        if key not in seen:
            inp = x.detach().requires_grad_(x.is_floating_point())
            out, f_flops, f_bytes = _counted(functools.partial(layer, inp))
            if out.requires_grad:
                _, b_flops, b_bytes = _counted(functools.partial(out.backward, torch.empty_like(out)))
            else:
                b_flops = b_bytes = 0.0
            seen[key] = (out.detach(), f_flops, b_flops, f_bytes, b_bytes)
        out, f_flops, b_flops, f_bytes, b_bytes = seen[key]
        params = sum(p.numel() * 4 for p in layer.parameters())  # fp32, as a measured profile's
        records.append(LayerRecord(
            name, type(layer).__name__,
            layer_seconds(dev, "fp32", f_flops, f_bytes, efficiency),
            layer_seconds(dev, "fp32", b_flops, b_bytes, efficiency),
            0.0, 0.0, out.numel() * 4, params, state * params,
            f_flops, b_flops, f_bytes, b_bytes,
        ))
        x = out
    total = sum(r.param_bytes for r in records)
    # one optimizer step: memory-bound, every state tensor read and written once (fp32)
    optimizer_s = 2 * total * (2 + state) / dev.memory_bytes_per_s
    return Profile(
        cfg.model, cfg.dataset, cfg.batch_size, cfg.optimizer, tuple(records),
        tuple((n, tuple(p.shape)) for n, p in model.named_parameters()),
        int(torch.Size(shape).numel() * (8 if spec.input_dtype == "long" else 4)),
        optimizer_s, 0, fc_start(model), dict(cfg.model_options), dict(cfg.data_options),
        device="meta", threads=0, task=spec.task,
    )
