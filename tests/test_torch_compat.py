"""Tier 1: each patch of a torch internal (polytrain/_torch_compat.py) still fits the torch installed.

Per patch: the source of the torch function it replaces or relies on is the one it was written
for (a hash of that function's own source text, read from torch's file, so a torch upgrade that
changes it fails here first: then re-read the function, adjust the patch, update the hash), and
the patch is in place while it should be and undone after. Then the version guard.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import signal
from typing import Any

import pytest
import torch
import torch.distributed as dist

from polytrain import _torch_compat as compat

# (module, function or Class.method) -> sha256 prefix of its source, as of torch 2.13
ORIGINALS = {
    ("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "get_method_name"): "c43c4445bfe81ae9",
    ("torch.distributed.elastic.multiprocessing.api", "PContext.close"): "8c1cd2ad94a05bab",
    ("torch.distributed.elastic.rendezvous.c10d_rendezvous_backend", "_create_tcp_store"):
        "8c2b5508b4f7715a",
    ("torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook", "powerSGD_hook"): "cc1f1d8c7b004bcd",
    ("torch.distributed.algorithms.ddp_comm_hooks.default_hooks", "_allreduce_fut"): "173e5a4951e55f25",
}


def source_hash(module: str, qualname: str) -> str:
    """The hash of ``qualname``'s source as written in ``module``'s file (patched or not)."""
    text = inspect.getsource(importlib.import_module(module))
    body: list[ast.stmt] = ast.parse(text).body
    node: Any = None
    for part in qualname.split("."):
        node = next(n for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part)
        body = node.body
    return hashlib.sha256((ast.get_source_segment(text, node) or "").encode()).hexdigest()[:16]


@pytest.mark.parametrize(("module", "qualname"), list(ORIGINALS))
def test_the_patched_torch_function_is_the_one_the_patch_was_written_for(module: str, qualname: str) -> None:
    assert compat.supported(), f"torch {torch.__version__} is outside {compat.TORCH_RANGE}"
    assert source_hash(module, qualname) == ORIGINALS[(module, qualname)], (
        f"torch {torch.__version__} changed {module}.{qualname}: re-read it, check the patch in "
        "polytrain/_torch_compat.py, then update ORIGINALS")


def test_cheap_rendezvous_events_names_the_caller_as_inspect_does(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", dynamic_rendezvous.get_method_name)
    assert list(inspect.signature(dynamic_rendezvous.get_method_name).parameters) == ["depth"]
    assert compat.cheap_rendezvous_events()
    assert dynamic_rendezvous.get_method_name is compat._method_name

    def recorded_by() -> tuple[str, str]:  # as torch's _record(...) calls it, depth 2
        return dynamic_rendezvous.get_method_name(), inspect.stack()[1].function

    def a_rendezvous_step() -> tuple[str, str]:
        return recorded_by()

    cheap, slow = a_rendezvous_step()
    assert cheap == slow == "a_rendezvous_step"


def test_pcontext_close_is_replaced_inside_only() -> None:
    from torch.distributed.elastic.multiprocessing.api import PContext

    original = PContext.close
    assert list(inspect.signature(original).parameters) == ["self", "death_sig", "timeout"]
    calls: list[tuple[Any, ...]] = []
    with compat.pcontext_close(lambda orig, self, sig, timeout: calls.append((orig, self, sig, timeout))):
        assert PContext.close is not original
        PContext.close("ctx", signal.SIGTERM, 7)  # type: ignore[arg-type]
    assert calls == [(original, "ctx", signal.SIGTERM, 7)]
    assert PContext.close is original


def test_tcp_store_factory_reaches_the_rendezvous_backend() -> None:
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d_backend

    real = dist.TCPStore
    assert c10d_backend.TCPStore is real  # the backend calls it by its own module's name
    assert "master_listen_fd" in (real.__init__.__doc__ or "")  # how the patch binds a store
    made: list[tuple[Any, ...]] = []
    with compat.tcp_store_factory(lambda cls, *a, **kw: made.append((cls, a, kw))) as yielded:
        assert yielded is real
        dist.TCPStore("127.0.0.1", 1, is_master=True)
        c10d_backend.TCPStore("127.0.0.1", 2)
    assert made == [(real, ("127.0.0.1", 1), {"is_master": True}), (real, ("127.0.0.1", 2), {})]
    assert dist.TCPStore is real and c10d_backend.TCPStore is real


def test_hooks_dist_is_what_the_powersgd_hooks_call(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    for mod in (powerSGD_hook, default_hooks):
        source = inspect.getsource(mod)  # the calls go through the module global ``dist``
        assert "import torch.distributed as dist" in source and "dist.all_reduce(" in source
        monkeypatch.setattr(mod, "dist", mod.dist)  # restored after the test
    wrapped = object()
    compat.hooks_dist(wrapped)
    assert powerSGD_hook.dist is wrapped and default_hooks.dist is wrapped


def test_outside_the_range_a_speed_up_is_skipped_and_a_needed_patch_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", dynamic_rendezvous.get_method_name)
    before = dynamic_rendezvous.get_method_name
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    assert not compat.supported()
    with pytest.warns(RuntimeWarning, match=r"for torch >=2\.4,<2\.14; this is torch 2\.99\.0: skipped"):
        assert not compat.cheap_rendezvous_events()
    assert dynamic_rendezvous.get_method_name is before
    with pytest.raises(compat.TorchCompatError, match=r"Install a torch in that range"), \
            compat.pcontext_close(lambda *a: None):
        pass
    with pytest.raises(compat.TorchCompatError), compat.tcp_store_factory(lambda *a, **k: None):
        pass
