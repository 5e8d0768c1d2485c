"""``--precision fp32|bf16|fp16``: mixed precision with fp32 master weights.

The parameters and the optimizer state stay fp32; ``torch.autocast`` runs the forward and the
loss in the compute dtype (matrix products and convolutions in bf16/fp16, reductions and the
loss in fp32), so the gradients that reach ``.grad`` — and that data parallelism all-reduces —
are fp32. fp16's narrow range needs loss scaling: a ``GradScaler`` multiplies the loss before
backward, unscales the gradients before clipping and the update, and skips the update of a step
whose gradient overflowed (inf/NaN), halving its scale; every skipped step is counted and
written to the metrics. The scaler's state goes into the checkpoint (``Precision.state``) so a
resumed run continues with the same scale.

Where a model is split over ranks (pipeline stages, tensor shards), each rank unscales only its
own gradients, so one rank may find an overflow that another does not; ``unscale(optimizer,
comm)`` then all-reduces the found-inf flags (op ``found_inf``, 4 bytes a rank) so that every
rank skips the same step and halves its scale alike, and the scales stay equal. Between stages a
pipeline sends activations and their gradients in the compute dtype (``wire_dtype``): bf16/fp16
halve those bytes, and the gradient arriving for a bf16 activation is bf16 in any case.

Where each rank holds only a shard of the gradient (``zero``), ranks can disagree on an overflow;
``Precision(..., shards=comm)`` then uses torch's ``ShardedGradScaler``, which all-reduces the
found-inf flag over those ranks in ``unscale`` (4 bytes, counted on ``comm`` as ``found_inf``),
so every rank skips the same steps.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from polytrain.comm import Comm

SKIPPED = "fp16 gradient overflow; loss scale halved"  # the reason of a skipped step's event
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """One rank's autocast context and (fp16) gradient scaler."""

    def __init__(self, name: str, device: torch.device, shards: Comm | None = None) -> None:
        if name not in DTYPES:
            raise ValueError(f"unknown precision '{name}'; valid: {', '.join(DTYPES)}")
        self.name, self.device = name, device
        self.dtype = DTYPES[name]
        self.shards = shards if shards is not None and shards.world > 1 else None
        self.scaler: torch.amp.GradScaler | None = None
        if name == "fp16" and self.shards is not None:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.scaler = ShardedGradScaler(device.type, process_group=self.shards.group)
        elif name == "fp16":
            self.scaler = torch.amp.GradScaler(device.type)
        self.skipped = 0  # fp16 steps whose update the scaler skipped (overflow)

    def autocast(self) -> AbstractContextManager[Any]:
        if self.name == "fp32":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a tensor of ``dtype`` crosses a stage boundary in: floating point ones in
        the compute dtype, others (token ids) as they are."""
        return self.dtype if dtype.is_floating_point and self.name != "fp32" else dtype

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times fp16's loss scale (itself otherwise): what backward starts from."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale(self, optimizer: torch.optim.Optimizer, comm: Comm | None = None) -> None:
        """Gradients back to their true size (before clipping reads them); once per step.

        ``comm``: the ranks that hold the rest of the gradient, which must agree on an overflow
        (collective over ``comm``: every rank calls it at the same step)."""
        if self.scaler is None:
            return
        # a stage that never saw the loss (only gradients from the next stage) has not scaled
        # anything yet: scaling a zero initialises the scale it unscales by (same on every rank)
        self.scaler.scale(torch.zeros((), device=self.device))
        self.scaler.unscale_(optimizer)  # a ShardedGradScaler (``shards``) agrees by itself
        if self.shards is not None:
            self.shards._count_ring_allreduce(torch.zeros(1), "found_inf")
        elif comm is not None and comm.world > 1:
            self._agree(optimizer, comm)

    def _agree(self, optimizer: torch.optim.Optimizer, comm: Comm) -> None:
        """Every rank's found-inf flag becomes the maximum over ``comm``. GradScaler keeps the
        flags of ``unscale_`` per optimizer and device and ``step`` reads them back (torch's
        ``ShardedGradScaler`` agrees them across FSDP ranks by all-reducing the same dict)."""
        assert self.scaler is not None
        found: dict[Any, torch.Tensor] = self.scaler._per_optimizer_states[id(optimizer)][
            "found_inf_per_device"]
        flag = torch.zeros(1, dtype=torch.float32, device=self.device)
        for f in found.values():
            flag += f.detach().float().to(self.device).reshape(1)
        comm.all_reduce(flag, op="found_inf")
        for f in found.values():
            f.fill_(1.0 if float(flag) > 0 else 0.0)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """The update; False when fp16's scaler skipped it (an inf/NaN gradient)."""
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        if self.scaler.get_scale() < before:  # the scaler backs off only after an overflow
            self.skipped += 1
            return False
        return True

    def state(self) -> dict[str, Any]:
        if self.scaler is None:
            return {}
        return {"scaler": self.scaler.state_dict(), "skipped": torch.tensor(self.skipped)}

    def load_state(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
            self.skipped = int(state.get("skipped", 0))

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"precision": self.name}
        if self.scaler is not None:
            out |= {"fp16_skipped_steps": self.skipped, "fp16_loss_scale": self.scaler.get_scale()}
        return out
