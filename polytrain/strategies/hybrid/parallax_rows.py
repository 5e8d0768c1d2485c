"""The row-sparse parameter-server path of ``hybrid-ps-ar``: lazy row updates on the servers and
the synchronous push/pull of touched rows.

One step (all point-to-point through the accounted ``ctx.comm``; a rank may be a worker, a
server, or both — co-located, one server per worker as Parallax places them)::

    worker -> server s   header (K,) int64: rows of each server-held parameter     op ps_header
                         ids (n,) int32, all K parameters' rows one after another  op ps_push_rows
                         values (Σ n_k·D_k,) f32: those rows of the gradient       op ps_push_rows
    server s             sums each row over the W workers, divides by W (the mean
                         gradient of the global batch), applies the optimizer to
                         those rows only
    server s -> worker   the same three messages with every row that changed this  op ps_pull_rows
                         step (the union of what the workers pushed) and its new value

(ids and values are skipped when a header says 0 rows.) So every worker ends the step with the
servers' exact rows, and a row nobody touched is neither sent nor changed. Every transfer is an
``isend``/``irecv`` posted before anything waits, so the exchange cannot deadlock; per pair of
ranks gloo matches messages in posting order, and both sides post them in the order above.

Lazy updates (what TensorFlow's sparse optimizers, which Parallax uses, do): ``sgd`` is exactly
dense SGD when weight decay is 0 (an untouched row's gradient is 0). ``momentum`` and ``adam``
keep their state per row and advance it only on rows with a gradient (``torch.optim.SparseAdam``
semantics), and weight decay applies to touched rows only — both differ from dense training on
the rows a step does not touch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from polytrain.comm import Comm
from polytrain.strategies.hybrid.parallax_plan import RowPartition

Message = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (counts (K,), ids (n,), values (m,))


@dataclass(frozen=True)
class SparseParam:
    """A server-held parameter: ``rows`` × ``width`` elements (its dims after the first, flattened)."""

    name: str
    rows: int
    width: int


class LazyRows:
    """One server's rows (n, D) of one parameter and their optimizer state."""

    def __init__(self, table: torch.Tensor, optimizer: str, lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.table, self.kind, self.lr = table, optimizer, lr
        self.momentum, self.wd, self.betas, self.eps = momentum, weight_decay, betas, eps
        self.t = 0  # applications (adam's bias correction, as SparseAdam counts them)
        if optimizer == "momentum":
            self.buf = torch.zeros_like(table)
        elif optimizer == "adam":
            self.m, self.v = torch.zeros_like(table), torch.zeros_like(table)
        elif optimizer != "sgd":
            raise ValueError(f"unknown optimizer '{optimizer}'; valid: sgd, momentum, adam")

    def state(self) -> dict[str, Any]:
        kept = {"sgd": (), "momentum": ("buf",), "adam": ("m", "v")}[self.kind]
        return {"table": self.table, "t": self.t, **{k: getattr(self, k) for k in kept}}

    def load_state(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if key == "t":
                self.t = int(value)
            else:
                getattr(self, key).copy_(value)

    def apply(self, local: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """Update rows ``local`` (u,) with ``grad`` (u, D); returns their new values (u, D)."""
        w = self.table[local]
        if self.wd:
            grad = grad.add(w, alpha=self.wd)
        if self.kind == "sgd":  # the same float operations as torch.optim.SGD
            w.add_(grad, alpha=-self.lr)
        elif self.kind == "momentum":
            buf = self.buf[local].mul_(self.momentum).add_(grad)
            self.buf[local] = buf
            w.add_(buf, alpha=-self.lr)
        else:
            self.t += 1
            b1, b2 = self.betas
            m = self.m[local].mul_(b1).add_(grad, alpha=1 - b1)
            v = self.v[local].mul_(b2).addcmul_(grad, grad, value=1 - b2)
            self.m[local], self.v[local] = m, v
            denom = (v / (1 - b2 ** self.t)).sqrt_().add_(self.eps)
            w -= (self.lr / (1 - b1 ** self.t)) * m / denom
        self.table[local] = w
        return w


class RowServer:
    """Server ``index`` of ``servers``: its rows of every server-held parameter."""

    def __init__(self, params: Sequence[SparseParam], initial: Sequence[torch.Tensor], kind: str,
                 index: int, servers: int, workers: int, **optimizer: Any) -> None:
        self.params, self.workers = list(params), workers
        self.local_of: list[torch.Tensor] = []  # per parameter: (R,) local row of each id, -1 if not ours
        self.rows: list[LazyRows] = []
        for p, init in zip(self.params, initial, strict=True):
            owned = RowPartition(kind, p.rows, servers).owned(index)
            local = torch.full((p.rows,), -1, dtype=torch.int64)
            local[owned] = torch.arange(owned.numel())
            self.local_of.append(local)
            self.rows.append(LazyRows(init.reshape(p.rows, p.width)[owned].clone(), **optimizer))
        self.rows_received = 0

    @property
    def held(self) -> int:
        """Rows this server holds, over all its parameters."""
        return sum(r.table.shape[0] for r in self.rows)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: every parameter's rows and optimizer state."""
        return {"rows": [r.state() for r in self.rows]}

    def load_state(self, state: dict[str, Any]) -> None:
        for rows, saved in zip(self.rows, state["rows"], strict=True):
            rows.load_state(saved)

    def update(self, pushes: Sequence[Message]) -> Message:
        """Apply one step's pushes (one per worker); the reply: every changed row's new value."""
        unpacked = [unpack(m, self.params) for m in pushes]
        counts, ids, vals = [], [], []
        for k, p in enumerate(self.params):
            got_ids = torch.cat([u[k][0] for u in unpacked])
            got = torch.cat([u[k][1] for u in unpacked])  # (n, D)
            self.rows_received += got_ids.numel()
            rows, inverse = torch.unique(got_ids, return_inverse=True)
            grad = torch.zeros(rows.numel(), p.width).index_add_(0, inverse, got).div_(self.workers)
            local = self.local_of[k][rows]
            if bool((local < 0).any()):
                raise RuntimeError(f"{p.name}: a worker pushed rows this server does not own")
            counts.append(rows.numel())
            ids.append(rows)
            vals.append(self.rows[k].apply(local, grad))
        return pack(counts, ids, vals)


def pack(counts: list[int], ids: list[torch.Tensor], vals: list[torch.Tensor]) -> Message:
    """One message from per-parameter row ids (n_k,) and row values (n_k, D_k)."""
    return (torch.tensor(counts, dtype=torch.int64),
            torch.cat(ids).to(torch.int32) if ids else torch.zeros(0, dtype=torch.int32),
            torch.cat([v.reshape(-1) for v in vals]) if vals else torch.zeros(0))


def unpack(msg: Message, params: Sequence[SparseParam]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per parameter: (row ids (n_k,) int64, values (n_k, D_k))."""
    counts, ids, vals = msg
    out, i, v = [], 0, 0
    for n, p in zip(counts.tolist(), params, strict=True):
        out.append((ids[i : i + n].long(), vals[v : v + n * p.width].view(n, p.width)))
        i, v = i + n, v + n * p.width
    return out


@dataclass
class RowExchange:
    """One rank's side of the synchronous row-sparse push and pull."""

    comm: Comm
    params: list[SparseParam]
    kind: str  # row partition: hash | range
    workers: list[int]
    servers: list[int]
    server: RowServer | None = None  # set on a server rank
    partitions: list[RowPartition] = field(init=False)
    rows_pushed: int = 0
    rows_pulled: int = 0

    def __post_init__(self) -> None:
        self.partitions = [RowPartition(self.kind, p.rows, len(self.servers)) for p in self.params]

    def split(self, grads: Sequence[torch.Tensor]) -> list[Message]:
        """Per server, the touched rows it owns of every gradient (R_k, D_k)."""
        from polytrain.strategies.hybrid.parallax_plan import touched_rows

        per: list[tuple[list[int], list[torch.Tensor], list[torch.Tensor]]] = [
            ([], [], []) for _ in self.servers]
        for g, part in zip(grads, self.partitions, strict=True):
            rows = touched_rows(g)
            owner = part.owner(rows)
            for s in range(len(self.servers)):
                mine = rows[owner == s]
                per[s][0].append(mine.numel())
                per[s][1].append(mine)
                per[s][2].append(g[mine])
        return [pack(*m) for m in per]

    def step(self, grads: Sequence[torch.Tensor] | None) -> list[Message]:
        """One synchronous exchange. A worker passes its gradients (R_k, D_k) and gets the
        servers' replies; a server-only rank passes None (and gets []). Nothing is sent when
        no parameter is server-held (a dense model: all-reduce only)."""
        if not self.params:
            return []
        sends: list[Any] = []
        own_push: list[Message] = []
        if grads is not None:
            for srank, msg in zip(self.servers, self.split(grads), strict=True):
                self.rows_pushed += int(msg[0].sum())
                if srank == self.comm.rank:
                    own_push.append(msg)
                else:
                    sends += self._isend(msg, srank, "ps_push_rows")
        own_reply: list[Message] = []
        if self.server is not None:
            peers = [w for w in self.workers if w != self.comm.rank]
            reply = self.server.update(self._recv_all(peers, "ps_push_rows") + own_push)
            for w in peers:
                sends += self._isend(reply, w, "ps_pull_rows")
            if self.comm.rank in self.workers:
                own_reply.append(reply)
        replies: list[Message] = []
        if grads is not None:
            peers = [s for s in self.servers if s != self.comm.rank]
            replies = self._recv_all(peers, "ps_pull_rows") + own_reply
            self.rows_pulled += sum(int(m[0].sum()) for m in replies)
        for work in sends:
            work.wait()
        return replies

    def _isend(self, msg: Message, dst: int, op: str) -> list[Any]:
        counts, ids, vals = msg
        works = [self.comm.isend(counts, dst, op="ps_header")]
        if ids.numel():
            works += [self.comm.isend(ids, dst, op=op), self.comm.isend(vals, dst, op=op)]
        return works

    def _recv_all(self, peers: list[int], op: str) -> list[Message]:
        """One message from each of ``peers``: all headers, then all payloads, at once."""
        heads = [torch.zeros(len(self.params), dtype=torch.int64) for _ in peers]
        for w in [self.comm.irecv(h, p, op="ps_header") for h, p in zip(heads, peers, strict=True)]:
            w.wait()
        msgs, works = [], []
        widths = torch.tensor([p.width for p in self.params], dtype=torch.int64)
        for head, peer in zip(heads, peers, strict=True):
            ids = torch.empty(int(head.sum()), dtype=torch.int32)
            vals = torch.empty(int((head * widths).sum()))
            if ids.numel():
                works += [self.comm.irecv(ids, peer, op=op), self.comm.irecv(vals, peer, op=op)]
            msgs.append((head, ids, vals))
        for w in works:
            w.wait()
        return msgs


def write_rows(params: Sequence[torch.Tensor], replies: Sequence[Message],
               specs: Sequence[SparseParam]) -> None:
    """Write the servers' new rows into a worker's parameters (each viewed as (R_k, D_k))."""
    with torch.no_grad():
        for msg in replies:
            for p, spec, (ids, vals) in zip(params, specs, unpack(msg, specs), strict=True):
                if ids.numel():
                    p.view(spec.rows, spec.width)[ids] = vals
