"""Every replacement of a torch internal that polytrain makes, in one place.

Each patch is a function that applies it, says why it is needed, and states the torch versions it
is for (``TORCH_RANGE``: the project's floor in pyproject.toml up to the next minor version not
yet checked; verified on the torch in the development environment, 2.13). Outside that range a
patch that only saves time is skipped with a warning; one that polytrain's behaviour relies on
(stopping ranks promptly, stores bound to one address, counted PowerSGD traffic) raises
:class:`TorchCompatError` naming the versions, instead of silently doing something else.
``tests/test_torch_compat.py`` checks each original against the signature and source hash the
patch was written for, so a torch upgrade that changes one fails there first.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

TORCH_RANGE = ((2, 4), (2, 14))  # [min, max): torch versions every patch below is for


class TorchCompatError(RuntimeError):
    """A patch polytrain relies on does not support the installed torch."""


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def supported(version: tuple[int, int] | None = None) -> bool:
    low, high = TORCH_RANGE
    return low <= (version or torch_version()) < high


def _outside(what: str, required: bool) -> bool:
    """True when the installed torch is outside the range: then warn (optional patch, skipped)
    or raise (a patch polytrain relies on)."""
    if supported():
        return False
    (a, b), (c, d) = TORCH_RANGE
    text = (f"polytrain's patch of {what} is for torch >={a}.{b},<{c}.{d}; this is torch "
            f"{torch.__version__}")
    if required:
        raise TorchCompatError(f"{text}. Install a torch in that range (pip install "
                               f"'torch>={a}.{b},<{c}.{d}'), or a polytrain release for this torch.")
    warnings.warn(f"{text}: skipped (only a speed-up).", RuntimeWarning, stacklevel=3)
    return True


# -- 1. torch.distributed.elastic.rendezvous.dynamic_rendezvous.get_method_name -------------------

def _method_name(depth: int = 2) -> str:
    """The name ``inspect.stack()[depth].function`` gives, from the frame alone."""
    frame = sys._getframe(depth)
    return frame.f_code.co_name


def cheap_rendezvous_events() -> bool:
    """torch's dynamic rendezvous names each event it records by calling ``inspect.stack()``
    twice, which reads the source of every frame on the stack: ~1 s of a local launch on the
    2-core machine (18 calls). The same name comes from the frame alone. Optional: skipped with
    a warning outside ``TORCH_RANGE``. Returns whether the patch is in place."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    if _outside("dynamic_rendezvous.get_method_name", required=False):
        return False
    if hasattr(dynamic_rendezvous, "get_method_name"):
        dynamic_rendezvous.get_method_name = _method_name
        return True
    return False


# -- 2. torch.distributed.elastic.multiprocessing.api.PContext.close -----------------------------

Close = Callable[..., None]  # PContext.close(self, death_sig=None, timeout=30)


@contextlib.contextmanager
def pcontext_close(replacement: Callable[[Close, Any, Any, int], None]) -> Iterator[None]:
    """Within: the elastic agent's ``PContext.close(self, death_sig, timeout)`` calls
    ``replacement(original, self, death_sig, timeout)``. Needed because torch's close sends
    SIGTERM and waits its default 30 s whatever the launcher's shutdown timeout, which a hung
    or stopped rank cannot act on (:func:`polytrain.launch.agent.prompt_stop`). Required."""
    from torch.distributed.elastic.multiprocessing.api import PContext

    _outside("PContext.close", required=True)
    original = PContext.close

    def close(self: Any, death_sig: Any = None, timeout: int = 30) -> None:
        replacement(original, self, death_sig, timeout)

    PContext.close = close  # type: ignore[method-assign]
    try:
        yield
    finally:
        PContext.close = original  # type: ignore[method-assign]


# -- 3. torch.distributed.TCPStore, as torch elastic's rendezvous backend creates it --------------

@contextlib.contextmanager
def tcp_store_factory(make: Callable[..., Any]) -> Iterator[Any]:
    """Within: ``torch.distributed.TCPStore(...)`` and the c10d rendezvous backend's
    ``TCPStore(...)`` call ``make(real, *args, **kw)``; yields the real class. Needed because
    torch elastic creates its stores itself and offers no way to choose the address their server
    listens on (it binds every interface; :func:`polytrain.launch.stores.stores_bound_to`).
    Required: a store bound elsewhere than asked would be open to other hosts."""
    import torch.distributed as dist
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d_backend

    _outside("torch.distributed.TCPStore", required=True)
    real = dist.TCPStore

    def store(*args: Any, **kw: Any) -> Any:
        return make(real, *args, **kw)

    patched = [(dist, "TCPStore"), (c10d_backend, "TCPStore")]
    for module, name in patched:
        setattr(module, name, store)
    try:
        yield real
    finally:
        for module, name in patched:
            setattr(module, name, real)


# -- 4. the ``dist`` module PyTorch's PowerSGD and default DDP hooks call --------------------------

def hooks_dist(wrapped: Any) -> None:
    """PyTorch's PowerSGD hook (and the default hooks it falls back to) call
    ``dist.all_reduce`` through their modules' ``dist`` global; polytrain counts the bytes each
    sends by giving those modules ``wrapped`` (``torch.distributed`` with a counting
    ``all_reduce``: :func:`polytrain.comm.ddp_hooks.powersgd`). Required: without it the run's
    traffic would be reported as zero."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    _outside("the DDP comm hooks' dist", required=True)
    for mod in (powerSGD_hook, default_hooks):
        mod.dist = wrapped  # type: ignore[attr-defined]
