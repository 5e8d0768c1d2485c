"""Head-parallel attention in a user's model: recognising a standard attention block, rewriting
its head count and width to the local values, and proving the result on T local shards.

A module is an attention block when it holds an ``int`` head count (one of :data:`HEAD_ATTRS`,
e.g. ``n_head``, ``num_heads``) and ``nn.Linear`` children named as the common codebases name
them: a fused q|k|v projection (:data:`FUSED`, e.g. nanoGPT's ``c_attn``) or separate q, k, v
(:data:`SEPARATE`), and an output projection (:data:`OUT`). Rank r then keeps heads
[r·h/T, (r+1)·h/T): the q/k/v rows of those heads (column-parallel; a fused projection in three
chunks), the matching columns of the output projection (row-parallel), and the module's head
counts and widths (:data:`HEAD_ATTRS`, :data:`WIDTH_ATTRS` equal to h·head_size) divided by T.

Code that reads the width from its input (nanoGPT's ``B, T, C = x.size()``, then
``C // self.n_head`` and ``view(B, T, C)``) would still see the full width. When the attribute
rewrite alone does not reproduce the module, its ``forward`` is traced with ``torch.fx`` (children
kept whole) and every read of the input's last dimension replaced by the local width.

Either way is accepted only when it is proven: :func:`verify` runs T shards of a copy in T threads
(:class:`LocalComm`, an in-process all-reduce) on a random input and compares the sum with the
unsharded module. A block neither way reproduces is refused with its path and what to give.
"""

from __future__ import annotations

import copy
import operator
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from polytrain.comm import Comm
from polytrain.errors import ConfigError

HEAD_ATTRS = ("n_head", "n_heads", "num_heads", "num_attention_heads", "nhead", "n_kv_head",
              "n_kv_heads", "num_kv_heads", "num_key_value_heads")
WIDTH_ATTRS = ("n_embd", "embed_dim", "hidden_size", "d_model", "all_head_size", "inner_dim",
               "dim", "n_state", "split_size")
FUSED = ("c_attn", "qkv", "in_proj", "Wqkv", "wqkv", "qkv_proj", "query_key_value")
SEPARATE = (("q", "k", "v"), ("q_proj", "k_proj", "v_proj"), ("query", "key", "value"),
            ("wq", "wk", "wv"), ("to_q", "to_k", "to_v"))
OUT = ("c_proj", "proj", "out_proj", "o_proj", "wo", "out", "dense", "to_out", "o")


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def head_attrs(module: nn.Module) -> list[str]:
    return [a for a in HEAD_ATTRS if _is_count(getattr(module, a, None))]


def _projections(module: nn.Module) -> dict[str, nn.Module]:
    from polytrain.strategies.model.tp_layers import is_projection

    return {n: m for n, m in module.named_children() if is_projection(m)}


def _qkv_out(kids: dict[str, nn.Module]) -> tuple[str | None, str | None, tuple[str, ...] | None]:
    out = next((n for n in OUT if n in kids), None)
    fused = next((n for n in FUSED if n in kids), None)
    sep = next((t for t in SEPARATE if all(n in kids for n in t)), None)
    return out, fused, sep


def _split_attention(path: str, module: nn.Module) -> list[tuple[str, str]] | None:
    """BERT's layout: the heads and q/k/v in one child, the output projection in another."""
    at = (path + ".") if path else ""
    inner = next(((n, c) for n, c in module.named_children() if head_attrs(c)), None)
    if inner is None:
        return None
    q_name, q_mod = inner
    own_out, fused, sep = _qkv_out(_projections(q_mod))
    if own_out is not None:
        return None  # a whole attention block below: planned where it is
    # the sibling that holds the output projection and nothing else (BERT's attention.output)
    out_at = next((f"{n}.{o}" for n, c in module.named_children() if c is not q_mod
                   and len(_projections(c)) == 1 for o in OUT if o in _projections(c)), None)
    if out_at is None or (fused is None and sep is None):
        return None
    qkv = [(f"{at}{q_name}.{fused}", "qkv")] if fused else [
        (f"{at}{q_name}.{n}", "colwise") for n in sep or ()]
    return [*qkv, (at + out_at, "rowwise"), (path, f"heads=@{q_name}")]


def attention_plan(path: str, module: nn.Module) -> list[tuple[str, str]] | None:
    """The plan entries for ``module`` if it is a standard attention block, None if it is not
    one, or a ConfigError when it has a head count and Linear layers polytrain cannot name."""
    kids = _projections(module)
    out, fused, sep = _qkv_out(kids)
    at = (path + ".") if path else ""
    if not head_attrs(module):
        if isinstance(getattr(module, "head_dim", None), int) and out and (fused or sep):
            # heads counted from the projections (Llama: view(..., -1, head_dim)): no attribute
            qkv = [(at + fused, "qkv")] if fused else [(at + n, "colwise") for n in sep or ()]
            return [*qkv, (at + out, "rowwise"), (path, "heads=-")]
        return _split_attention(path, module)
    if out is not None and fused is not None:
        return [(at + fused, "qkv"), (at + out, "rowwise"), (path, "heads")]
    if out is not None and sep is not None:
        return [*((at + n, "colwise") for n in sep), (at + out, "rowwise"), (path, "heads")]
    if len(kids) >= 2:
        rest = [n for n in kids if n != fused and n not in (sep or ())]
        given = (f"{at}{fused}:qkv" if fused else ",".join(f"{at}{n}:colwise" for n in sep)
                 if sep else f"{at}{rest.pop(0)}:qkv")
        out_name = rest[0] if rest else "OUTPUT"
        raise ConfigError(
            f"tensor: '{path}' ({type(module).__name__}) has a head count ({head_attrs(module)[0]})"
            f" and projections ({', '.join(kids)}) that polytrain cannot name as q/k/v and an "
            f"output projection (one of {', '.join(OUT)}). Name them in a plan, e.g. --set "
            f"tp_plan=\"{given},{at}{out_name}:rowwise,{path}:heads\" (separate q, k, v each "
            ":colwise).")
    return None


def local_attrs(module: nn.Module, width: int, world: int, extra: list[str], where: str) -> None:
    """Divide the head counts (and widths equal to ``width``, and ``extra``) by ``world``."""
    names = [*head_attrs(module), *extra,
             *(a for a in WIDTH_ATTRS if getattr(module, a, None) == width)]
    if not names:
        raise ConfigError(f"tp_plan: '{where}:heads' but {type(module).__name__} has none of the "
                          f"head-count attributes {', '.join(HEAD_ATTRS)}; name it: "
                          f"'{where}:heads=ATTR'.")
    for name in dict.fromkeys(names):
        value = getattr(module, name, None)
        if not isinstance(value, int) or value <= 0 or value % world:
            raise ConfigError(
                f"tensor: '{where}'.{name} = {value!r} does not split over {world} ranks. Rule: "
                f"head counts must be multiples of the tensor-parallel degree. Fix: --set "
                f"model.n_head={world * max(1, (value or 0) // world)} or fewer ranks.")
        setattr(module, name, int(value) // world)


# --- the input's width, traced ----------------------------------------------------------------


class _Whole(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return True


def _last_dim_reads(graph: fx.Graph, x: fx.Node) -> list[fx.Node]:
    last = (-1, 2)
    out = []
    for n in list(x.users):
        if n.op == "call_method" and n.target == "size":
            if len(n.args) > 1:
                out += [n] if n.args[1] in last else []
            else:
                out += [u for u in n.users if u.target is operator.getitem and u.args[1] in last]
        elif n.op == "call_function" and n.target is getattr and n.args[1] == "shape":
            out += [u for u in n.users if u.target is operator.getitem and u.args[1] in last]
    return out


def width_from_input(module: nn.Module, local: int) -> None:
    """Re-trace ``module.forward`` with reads of its input's last dimension as ``local``."""
    graph = _Whole().trace(module)  # patches nn.Module.__call__: no other thread may run one
    x = next(n for n in graph.nodes if n.op == "placeholder")
    reads = _last_dim_reads(graph, x)
    if not reads:
        raise ConfigError("its forward does not read the width from its input")
    for n in reads:
        for user in list(n.users):
            user.args = fx.node.map_arg(user.args, lambda a, n=n: local if a is n else a)  # type: ignore[misc]
            user.kwargs = fx.node.map_arg(user.kwargs, lambda a, n=n: local if a is n else a)  # type: ignore[misc]
    module.forward = fx.GraphModule(module, graph).forward  # type: ignore[method-assign]


# --- proof on T local shards ------------------------------------------------------------------


class _Group:
    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=300)
        self.slots: list[torch.Tensor | None] = [None] * world


class LocalComm(Comm):
    """T ranks as T threads of one process: ``all_reduce`` sums in rank order (deterministic)."""

    def __init__(self, rank: int, group: _Group) -> None:
        super().__init__(rank, len(group.slots))
        self.g = group

    def all_reduce(self, tensor: torch.Tensor, op: str = "allreduce", async_op: bool = False
                   ) -> Any:
        self.g.slots[self.rank] = tensor.detach().clone()
        self.g.barrier.wait()
        total = self.g.slots[0].clone()  # type: ignore[union-attr]
        for s in self.g.slots[1:]:
            total += s  # type: ignore[operator]
        self.g.barrier.wait()
        tensor.copy_(total)
        return None

    def all_gather(self, out: list[torch.Tensor], tensor: torch.Tensor, op: str = "allgather"
                   ) -> Any:
        self.g.slots[self.rank] = tensor.detach().clone()
        self.g.barrier.wait()
        for o, s in zip(out, self.g.slots, strict=True):
            o.copy_(s)  # type: ignore[arg-type]
        self.g.barrier.wait()
        return None


def local_comms(world: int) -> list[LocalComm]:
    group = _Group(world)
    return [LocalComm(r, group) for r in range(world)]


def run_ranks(comms: list[LocalComm], fn: Callable[[LocalComm], Any]) -> list[Any]:
    """``fn(comm)`` for every rank in its own thread; the first exception is raised. Build (and
    trace) the ranks' modules before: FX tracing patches ``nn.Module.__call__`` process-wide."""
    results: list[Any] = [None] * len(comms)
    errors: list[BaseException] = []

    def body(comm: LocalComm) -> None:
        try:
            results[comm.rank] = fn(comm)
        except BaseException as exc:  # handed to the caller
            errors.append(exc)
            comm.g.barrier.abort()

    threads = [threading.Thread(target=body, args=(c,), daemon=True) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)),
                   errors[0])
    return results


Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def capture_inputs(model: nn.Module, blocks: list[nn.Module],
                   example: Callable[[nn.Module], Any] | None) -> dict[int, Inputs]:
    """The (args, kwargs) each of ``blocks`` receives when ``example(model)`` runs the model on
    an example batch (rotary position embeddings, masks): what their proofs feed them."""
    if example is None or not blocks:
        return {}
    seen: dict[int, Inputs] = {}

    def hook(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen.setdefault(id(m), (args, kwargs))

    handles = [b.register_forward_pre_hook(hook, with_kwargs=True) for b in blocks]
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            example(model)
    except Exception:  # no example inputs: the proofs use random ones
        return {}
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.train(training)
    return seen


def verify(original: nn.Module, shard: Callable[[nn.Module, LocalComm], None], width: int,
           world: int, inputs: Inputs | None = None) -> str | None:
    """None when T shards of ``original`` (made by ``shard(copy, comm)``) sum to its output on
    ``inputs`` (else a random (2, 3, width) input); otherwise the reason."""
    ref = copy.deepcopy(original).eval()
    p = next(ref.parameters())
    if inputs is None:
        x = torch.randn(2, 3, width, generator=torch.Generator().manual_seed(0)).to(p)
        inputs = ((x,), {})
    args, kwargs = inputs

    def one(comm: LocalComm) -> torch.Tensor:
        with torch.no_grad():
            out = mods[comm.rank](*args, **kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out

    try:
        with torch.no_grad():
            want = ref(*args, **kwargs)
        want = want[0] if isinstance(want, (tuple, list)) else want
        comms = local_comms(world)
        mods = [copy.deepcopy(original).eval() for _ in comms]
        for mod, comm in zip(mods, comms, strict=True):
            shard(mod, comm)
        got = run_ranks(comms, one)[0]
    except Exception as exc:  # the reason is the answer
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if got.shape != want.shape:
        return f"output shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    err = (got - want).abs().max().item()
    scale = want.abs().max().item() + 1e-12
    return None if err <= 1e-4 * scale else f"output differs by {err:.3g} (scale {scale:.3g})"
