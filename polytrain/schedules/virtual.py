"""Schedules of today's generation: virtual stages and a split backward, as plain orders.

Virtual stages. With ``V`` chunks per rank the model is cut into ``P·V`` chunks; ``Action.stage``
names the chunk and the orders' rows are ranks. Placement ``loop`` puts chunk c on rank c mod P
(Megatron's interleaving); placement ``v`` (V = 2) puts chunk c on rank c for c < P and on rank
2P−1−c after, so rank 0 holds the first and the last chunk (ZB-V, DualPipeV).

Split backward. ``B`` is then the input gradient only (what the previous chunk waits for) and
``W`` the weight gradient, which nothing waits for: a schedule may defer it into a bubble.

Bubbles with uniform costs per chunk (F, B = input grad, W; a full backward is B+W), per rank:

- interleaved-1f1b: (P−1)(F+B+W), that is (P−1)(F_stage+B_stage)/V for a stage of V chunks;
- zb-h1: (P−1)(F+B−W) — the ZB paper's (P−1)(F+B_full−2W);
- looped-bfs: as GPipe over the P·V chunks, (P−1)(F+B+W)... plus the loop's own waits.

P = 4, M = 4, V = 2, interleaved (rank 0; chunks 0 and 4)::

    0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 | 4F... steady one forward, one backward ... | drain
"""

from __future__ import annotations

from polytrain.errors import ConfigError
from polytrain.schedules.actions import Action, Op, Orders, check_sizes


def chunk_rank(chunk: int, ranks: int, placement: str) -> int:
    """The rank that holds model chunk ``chunk`` (see the module docstring)."""
    if placement == "v":
        return chunk if chunk < ranks else 2 * ranks - 1 - chunk
    return chunk % ranks


def check_virtual(name: str, ranks: int, microbatches: int, virtual: int, placement: str,
                  rounds: bool) -> None:
    """Refuse a V or M the schedule cannot run, in one line that names the rule and a fix."""
    check_sizes(ranks, microbatches)
    if isinstance(virtual, bool) or not isinstance(virtual, int) or virtual < 1:
        raise ConfigError(
            f"virtual_stages is {virtual!r}. Rule: a whole number >= 1. Fix: --set virtual_stages=2."
        )
    if placement == "v" and virtual != 2:
        raise ConfigError(
            f"'{name}' runs virtual_stages={virtual}. Rule: a V-shape schedule places exactly 2 chunks "
            "per rank. Fix: --set virtual_stages=2."
        )
    if placement == "loop" and virtual < 2:
        raise ConfigError(
            f"'{name}' runs virtual_stages={virtual}. Rule: an interleaved schedule needs >= 2 chunks "
            "per rank (with 1 it is 1f1b or gpipe). Fix: --set virtual_stages=2."
        )
    if placement == "none" and virtual != 1:
        raise ConfigError(
            f"'{name}' runs virtual_stages={virtual}. Rule: it places one chunk per rank. "
            "Fix: --set virtual_stages=1, or a schedule with virtual stages (interleaved-1f1b)."
        )
    if rounds and microbatches % ranks:
        fix = -(-microbatches // ranks) * ranks
        raise ConfigError(
            f"'{name}' runs microbatches={microbatches} on {ranks} ranks. Rule: microbatches must be a "
            f"multiple of the ranks (rounds of P). Fix: --set microbatches={fix}."
        )


def interleaved_orders(ranks: int, microbatches: int, virtual: int = 2) -> Orders:
    """Interleaved 1F1B (Narayanan et al., SC'21): 1F1B over P·V chunks, chunk c on rank c mod P.

    A rank walks micro-batches in rounds of P: forward step k runs local chunk (k // P) mod V of
    micro-batch (k // PV)·P + k mod P, so each round goes through all its chunks before the next
    round starts. Rank r warms up with 2(P−1−r) + (V−1)P forwards (enough for the first
    backward to come back round the loop), then alternates, then drains; backward step k takes
    the local chunks in reverse. Peak in flight on rank r: that warm-up + 1 chunk-micro-batches.
    """
    check_virtual("interleaved-1f1b", ranks, microbatches, virtual, "loop", rounds=True)
    total = microbatches * virtual

    def step(k: int, op: Op, backward: bool) -> Action:
        local = (k // ranks) % virtual
        local = virtual - 1 - local if backward else local
        mb = (k // (ranks * virtual)) * ranks + k % ranks
        return Action(local * ranks + r, op, mb)

    orders: Orders = {}
    for r in range(ranks):
        warm = min(2 * (ranks - 1 - r) + (virtual - 1) * ranks, total)
        row = [step(k, "F", False) for k in range(warm)]
        for j in range(total - warm):
            row += [step(warm + j, "F", False), step(j, "B", True)]
        row += [step(j, "B", True) for j in range(total - warm, total)]
        orders[r] = row
    return orders


def looped_bfs_orders(ranks: int, microbatches: int, virtual: int = 2) -> Orders:
    """Looped BFS (Lamy-Poirier, 2023, "Breadth-First Pipeline Parallelism"): GPipe over loops.

    Each rank runs every micro-batch through its first chunk, then its second, …; then the
    backwards, last chunk first, newest micro-batch first. No round constraint on M; every chunk
    holds all M micro-batches (GPipe's memory).
    """
    check_virtual("looped-bfs", ranks, microbatches, virtual, "loop", rounds=False)
    orders: Orders = {}
    for r in range(ranks):
        chunks = [v * ranks + r for v in range(virtual)]
        row = [Action(c, "F", m) for c in chunks for m in range(microbatches)]
        row += [Action(c, "B", m) for c in reversed(chunks) for m in reversed(range(microbatches))]
        orders[r] = row
    return orders


def zb_h1_orders(ranks: int, microbatches: int, virtual: int = 1) -> Orders:
    """ZB-H1 (Qi et al., ICLR'24): 1F1B with the backward split into B (input grad) and W.

    Stage s warms up with P−1−s forwards, as 1F1B, then alternates F and B; the W of
    micro-batch j runs right after the B of micro-batch j + s, so stage s keeps s weight
    gradients pending — they fill the slots where 1F1B's stage s would wait for the next
    backward — and the last pending ones run in the drain. Every stage then holds at most P
    micro-batches (activations are freed by W): 1F1B's peak, on stage 0.
    """
    check_virtual("zb-h1", ranks, microbatches, virtual, "none", rounds=False)
    orders: Orders = {}
    for s in range(ranks):
        warm = min(ranks - 1 - s, microbatches)
        row = [Action(s, "F", m) for m in range(warm)]
        w = 0
        for j in range(microbatches):
            if warm + j < microbatches:
                row.append(Action(s, "F", warm + j))
            row.append(Action(s, "B", j))
            if j >= s:
                row.append(Action(s, "W", w))
                w += 1
        row += [Action(s, "W", m) for m in range(w, microbatches)]
        orders[s] = row
    return orders


class _VRow:
    """One rank's order under the V placement: chunk 0 (rank r, going down) and chunk 1
    (2P−1−r, coming back up), with per-chunk counters so each op takes the next micro-batch and
    a FIFO of deferred weight gradients (W runs the oldest B that left its W for later)."""

    def __init__(self, ranks: int, r: int) -> None:
        self.chunk = (r, 2 * ranks - 1 - r)
        self.row: list[Action] = []
        self.next = {(c, op): 0 for c in (0, 1) for op in ("F", "B")}
        self.deferred: list[Action] = []

    def do(self, ops: str) -> None:
        """Run ``ops`` in turn: ``F0``/``F1`` forward of chunk 0/1; ``B0``/``B1`` its input gradient
        with the W deferred; ``X0``/``X1`` its whole backward (B without W); ``W`` the oldest W."""
        for op in ops.split():
            if op == "W":
                self.w()
            elif op[0] == "F":
                self._add(int(op[1]), "F")
            else:
                self.b(int(op[1]), split=op[0] == "B")

    def b(self, c: int, split: bool = True) -> None:
        """B of the next micro-batch; ``split``: its W waits in the FIFO, else B is the full one."""
        a = self._add(c, "B")
        if split:
            self.deferred.append(Action(a.stage, "W", a.microbatch))

    def w(self) -> None:
        self.row.append(self.deferred.pop(0))

    def _add(self, c: int, op: Op) -> Action:
        a = Action(self.chunk[c], op, self.next[(c, op)])
        self.next[(c, op)] += 1
        self.row.append(a)
        return a


def _restrict(orders: Orders, microbatches: int) -> Orders:
    """Keep micro-batches below ``microbatches``: a builder that needs a minimum M builds for that
    and drops the rest. Dependencies never cross micro-batches, so the kept actions, in the same
    order, run as they did in the larger schedule (no new deadlock)."""
    return {r: [a for a in row if a.microbatch < microbatches] for r, row in orders.items()}


def zbv_orders(ranks: int, microbatches: int, virtual: int = 2) -> Orders:
    """ZB-V (Qi et al., ICLR'24, "zero bubble V"): two chunks per rank in a V, B and W split.

    Rank r: 2(P−r)−1 forwards of chunk 0; r pairs (F1, F0); P−r triples (F1 B1 W1) — the loss
    is on rank 0, so chunk 1's backward starts the way back; then the steady state (F0 B0 W0 F1
    B1 W1) while forwards remain; then the drain: r pairs (B0 B1), P−r pairs (B0 W0), and the
    deferred W's. Built for max(M, 2P−1) micro-batches and restricted to M (`_restrict`).
    """
    check_virtual("zbv", ranks, microbatches, virtual, "v", rounds=False)
    n = max(microbatches, 2 * ranks - 1)
    orders: Orders = {}
    for r in range(ranks):
        v = _VRow(ranks, r)
        for _ in range(2 * (ranks - r) - 1):
            v.do("F0")
        for _ in range(r):
            v.do("F1 F0")
        for _ in range(ranks - r):
            v.do("F1 B1 W")
        while v.next[(1, "F")] < v.next[(0, "F")] or v.next[(0, "F")] < n:
            if v.next[(0, "F")] < n:
                v.do("F0")
            v.do("B0 W F1 B1 W")
        for _ in range(r):
            v.do("B0 B1")
        for _ in range(ranks - r):
            v.do("B0 W")
        while v.deferred:
            v.do("W")
        orders[r] = v.row
    return _restrict(orders, microbatches)


def dualpipev_orders(ranks: int, microbatches: int, virtual: int = 2) -> Orders:
    """DualPipeV (DeepSeek-V3's DualPipe cut in half, Sea AI Lab): two chunks per rank in a V.

    The eight phases of rank r (n = M micro-batches, P ranks; F0/B0 chunk 0, F1/B1 chunk 1):
    (P−r−1)·2 F0 | r+1 × (F0 F1) | P−r−1 × (B1 W F1), split | n−2P+r+1 × (F0 B1 F1 B0), full
    backwards, where DualPipe overlaps each F with the B beside it (here they run in turn) |
    P−r−1 × (B1 F1 B0) | r+1 × (B1 B0), split from the middle on | P−r−1 × (W B0), split |
    the remaining W's. Built for max(M, 2P) micro-batches and restricted to M.
    """
    check_virtual("dualpipev", ranks, microbatches, virtual, "v", rounds=False)
    n = max(microbatches, 2 * ranks)
    orders: Orders = {}
    for r in range(ranks):
        v = _VRow(ranks, r)
        for _ in range(2 * (ranks - r - 1)):
            v.do("F0")
        for _ in range(r + 1):
            v.do("F0 F1")
        for _ in range(ranks - r - 1):
            v.do("B1 W F1")
        for _ in range(n - 2 * ranks + r + 1):
            v.do("F0 X1 F1 X0")
        for _ in range(ranks - r - 1):
            v.do("X1 F1 X0")
        for i in range(r + 1):  # the second half of these backwards leave W for later
            v.b(1, split=i > (r + 1) // 2 or (i == (r + 1) // 2 and r % 2 == 1))
            v.b(0, split=i >= (r + 1) // 2)
        for _ in range(ranks - r - 1):
            v.do("W B0")
        while v.deferred:
            v.do("W")
        orders[r] = v.row
    return _restrict(orders, microbatches)
