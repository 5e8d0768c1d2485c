"""The α–β cost model: explicit, small formulas for every message pattern polytrain's strategies use.

A message of S bytes over a link costs α + S/β (α: latency per message, s; β: bytes/s). On top:

- ring all-reduce over n ranks (reduce-scatter then all-gather, 2(n−1) steps of S/n bytes):
  ``2(n−1)/n · S/β + 2(n−1)·α``; tree (binary reduce then broadcast, whole message per level):
  ``2⌈log2 n⌉·(α + S/β)``; all-gather / reduce-scatter of S bytes in total: ``(n−1)/n · S/β +
  (n−1)·α``; a reduce-scatter as direct sends (all n−1 parts in flight at once):
  ``(n−1)/n · S/β + α`` (`direct_exchange_s`);
- hierarchical links: a group inside one host uses the intra-host link; a group spanning hosts is
  bound by the NICs, whose bandwidth is shared by the ``nic_share`` groups crossing each NIC at
  once. Across hosts the two-level all-reduce (intra reduce-scatter, per-slice inter-host ring,
  intra all-gather) pays 2(H−1) NIC latencies instead of 2(n−1); `allreduce_s` takes the fastest
  of flat ring, tree and two-level, as NCCL picks its algorithm, or the ring alone where the
  library has no other (``Cluster.collectives = "ring"``: gloo, polytrain's CPU backend);
- DDP bucket overlap (`ddp_overlap`): gradients are grouped into buckets in backward order (the
  first bucket capped at 1 MiB, then ``bucket_mb``); a bucket's all-reduce starts when backward
  has produced its last gradient and the previous bucket's all-reduce is done (one channel);
- parameter-server link load (`ps_traffic`): from the shard plan's bytes per server, every worker
  pushes each server its shard and pulls it back; per host NIC the bytes in and out per step, and
  the time the busiest NIC (or intra link) needs for them; each push and each reply is two messages
  (a header, then the payload), whose hops wait on the machine's contention as a collective's do;
- shaped links (``Cluster.burst_bytes``, the testbed's token bucket): a link idle before a message,
  a collective call or a parameter-server phase passes its first ``burst`` bytes at line speed,
  ``(S − burst)⁺/β`` (`Link.wire_s`); the NIC's flows share the bucket as they share its rate;
  the bucket refills at the shaped rate, so after ``t`` seconds of compute only ``min(burst, β·t)``
  is back (`refilled`: collectives separated by a little compute, as tensor parallelism's);
- shared cores (`shared_cores`): where all ranks share a machine's cores (the testbed), every
  message of a collective pays α·W/cores when the machine's W ranks outnumber its cores (each hop
  waits for its receiver to be scheduled, and every rank computes between collectives, not only
  the collective's own: a dp×tp mesh's pair of tensor-parallel ranks waits on all W);
- a collective call's own time (``Cluster.call_s``): entering the collective and waking from it
  costs a rank a fixed time beyond its messages, which on shared cores also grows by W/cores
  (`call_s`; fitted on the testbed by `benchmarks/plan_accuracy.py`'s calibration); and each of its
  steps (``Cluster.hop_s``): a collective library that wakes its process at every step of a ring
  pays that wake-up per step, whatever the step's size (gloo on the testbed's shared cores: ~1.3 ms
  a step for 2–8 ranks and 0.5–130 kB steps, `benchmarks/plan_hops.py`); a direct exchange's
  messages, all in flight at once, ``Cluster.direct_hop`` each (~0.9 ms on the testbed);
- tensor-parallel collectives: per transformer block, two all-reduces of the (B, T, D) activations
  in forward and two of their gradients in backward (Megatron's f and g), `tp_block_s`.

All functions are pure; sizes in bytes, times in seconds. Hand-computed cases in tests/test_plan_cost.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from polytrain.cost.cluster import Cluster

FIRST_BUCKET_BYTES = 1024 * 1024  # DDP's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)


@dataclass(frozen=True)
class Link:
    """α (seconds per message) and β (bytes per second) of one link; ``burst``: bytes a shaped
    link passes at line speed after an idle spell (a token bucket's depth; 0 for a plain link)."""

    alpha: float
    bps: float
    burst: float = 0.0

    def wire_s(self, nbytes: float) -> float:
        """Seconds to put ``nbytes`` sent back to back on the link, starting idle: (S − burst)⁺/β."""
        return max(0.0, nbytes - self.burst) / self.bps

    def p2p_s(self, nbytes: float) -> float:
        return self.alpha + self.wire_s(nbytes)


def ring_allreduce_s(nbytes: float, n: int, link: Link) -> float:
    """2(n−1)/n · S/β + 2(n−1)α."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return link.wire_s(2 * (n - 1) / n * nbytes) + 2 * (n - 1) * link.alpha


def tree_allreduce_s(nbytes: float, n: int, link: Link) -> float:
    """2⌈log2 n⌉(α + S/β): reduce up a binary tree, broadcast down, the whole message per level."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    levels = 2 * math.ceil(math.log2(n))
    return levels * link.alpha + link.wire_s(levels * nbytes)


def allgather_s(total_bytes: float, n: int, link: Link) -> float:
    """(n−1)/n · S/β + (n−1)α: ring all-gather (or reduce-scatter) of S bytes in total."""
    if n <= 1 or total_bytes <= 0:
        return 0.0
    return link.wire_s((n - 1) / n * total_bytes) + (n - 1) * link.alpha


def intra_link(cluster: Cluster) -> Link:
    return Link(cluster.intra_alpha, cluster.intra_bps)


def nic_link(cluster: Cluster, nic_share: int = 1) -> Link:
    """The NIC as one of ``nic_share`` equal flows (each with its share of a shaper's bucket); a
    host-crossing ring also uses intra hops."""
    share = max(1, nic_share)
    bps = min(cluster.nic_bps / share, cluster.intra_bps)
    return Link(cluster.latency_s, bps, cluster.burst_bytes / share)


def refilled(cluster: Cluster, idle_s: float) -> Cluster:
    """``cluster`` with the shaper's bucket as it stands after ``idle_s`` seconds without sending,
    starting empty: a token bucket refills at the shaped rate, up to its depth."""
    if cluster.burst_bytes <= 0:
        return cluster
    return cluster.refilled(min(cluster.burst_bytes, cluster.nic_bps * max(0.0, idle_s)))


def hosts_of(cluster: Cluster, ranks: Sequence[int]) -> int:
    if isinstance(ranks, range) and ranks.step == 1 and len(ranks):  # consecutive: no set of 10^5 ranks
        return cluster.host_of(ranks[-1]) - cluster.host_of(ranks[0]) + 1
    return len({cluster.host_of(r) for r in ranks})


def shared_cores(cluster: Cluster, n: float) -> Cluster:
    """On shared cores (the testbed) every hop waits for its receiver to be scheduled among ``n``
    ranks competing for the cores: each message's α grows by the contention, n/cores when n > cores."""
    k = cluster.contention(n)
    if k == 1.0:
        return cluster
    return replace(cluster, latency_s=cluster.latency_s * k, intra_latency_s=cluster.intra_alpha * k)


def call_s(cluster: Cluster, steps: int = 0) -> float:
    """A rank's own time in one collective call of ``steps`` steps: ``Cluster.call_s``, times W/cores
    on shared cores, plus ``Cluster.hop_s`` per step."""
    return cluster.call_s * cluster.contention(cluster.world) + steps * cluster.hop_s


def allreduce_s(nbytes: float, ranks: Sequence[int], cluster: Cluster, nic_share: int = 1) -> float:
    """Fastest of flat ring, tree and two-level all-reduce of ``nbytes`` over ``ranks``, each with
    the call's own time for its steps (`call_s`: 2(n−1), 2⌈log2 n⌉, 2(k−1) + 2(H−1)); the ring
    alone on a cluster whose library has no other (``Cluster.collectives == "ring"``)."""
    n = len(ranks)
    if n <= 1 or nbytes <= 0:
        return 0.0
    base = cluster  # the call and its steps (`call_s`); the links below wait on shared cores
    cluster = shared_cores(cluster, cluster.world)
    hosts = hosts_of(cluster, ranks)
    link = intra_link(cluster) if hosts <= 1 else nic_link(cluster, nic_share)
    ring = ring_allreduce_s(nbytes, n, link) + call_s(base, 2 * (n - 1))
    if cluster.collectives == "ring":
        return ring
    tree = tree_allreduce_s(nbytes, n, link) + call_s(base, 2 * math.ceil(math.log2(n)))
    if hosts <= 1:
        return min(ring, tree)
    k = n // hosts
    two = two_level_allreduce_s(nbytes, k, hosts, cluster, nic_share)
    two += call_s(base, 2 * (k - 1) + 2 * (hosts - 1))
    return min(ring, tree, two)


def two_level_allreduce_s(
    nbytes: float, per_host: int, hosts: int, cluster: Cluster, nic_share: int = 1
) -> float:
    """Intra reduce-scatter, ``per_host`` concurrent inter-host rings on S/per_host each (sharing
    the NIC), intra all-gather: 2(k−1)/k·S/β_intra + 2(k−1)α_intra + 2(H−1)/H·S/β_nic + 2(H−1)α."""
    k = max(1, per_host)
    intra = intra_link(cluster)
    flows = max(1, nic_share) * k
    inter = Link(cluster.latency_s, cluster.nic_bps / flows, cluster.burst_bytes / flows)
    return 2 * allgather_s(nbytes, k, intra) + ring_allreduce_s(nbytes / k, hosts, inter)


def group_link(cluster: Cluster, ranks: Sequence[int], nic_share: int = 1) -> Link:
    """The link a group's messages cross — intra-host within one host, else the NIC — with each
    message's α waiting on the machine's contention (`shared_cores`)."""
    cluster = shared_cores(cluster, cluster.world)
    return intra_link(cluster) if hosts_of(cluster, ranks) <= 1 else nic_link(cluster, nic_share)


def group_allgather_s(
    total_bytes: float, ranks: Sequence[int], cluster: Cluster, nic_share: int = 1
) -> float:
    if len(ranks) <= 1 or total_bytes <= 0:
        return 0.0
    own = call_s(cluster, len(ranks) - 1)
    return own + allgather_s(total_bytes, len(ranks), group_link(cluster, ranks, nic_share))


def direct_exchange_s(
    total_bytes: float, ranks: Sequence[int], cluster: Cluster, nic_share: int = 1
) -> float:
    """A reduce-scatter of S bytes in total as direct sends: every rank posts its n−1 parts of S/n
    to their owners at once and receives its own part from each (`shard_collectives.reduce_scatter`):
    (n−1)/n · S/β on the link and one α, as the messages are all in flight together (a ring pays
    n−1 of each), plus the call's own time and ``Cluster.direct_hop`` per message (n−1)."""
    if len(ranks) <= 1 or total_bytes <= 0:
        return 0.0
    own = call_s(cluster) + (len(ranks) - 1) * cluster.direct_hop
    return own + group_link(cluster, ranks, nic_share).p2p_s((len(ranks) - 1) / len(ranks) * total_bytes)


def p2p_s(nbytes: float, a: int, b: int, cluster: Cluster, nic_share: int = 1) -> float:
    same = cluster.host_of(a) == cluster.host_of(b)
    return (intra_link(cluster) if same else nic_link(cluster, nic_share)).p2p_s(nbytes)


# --- DDP: buckets overlapped with backward ---------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    """One DDP bucket: its bytes, when backward produced it, and its all-reduce's span."""

    nbytes: int
    ready_s: float
    start_s: float
    end_s: float


def buckets_of(grad_bytes_backward: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Layer indices (in backward order) per bucket: the first capped at 1 MiB, then ``bucket_bytes``."""
    out: list[list[int]] = [[]]
    filled, cap = 0, min(FIRST_BUCKET_BYTES, bucket_bytes)
    for i, nbytes in enumerate(grad_bytes_backward):
        if nbytes == 0:
            continue
        if out[-1] and filled + nbytes > cap:
            out.append([])
            filled, cap = 0, bucket_bytes
        out[-1].append(i)
        filled += nbytes
    return [b for b in out if b]


def ddp_overlap(
    forward_s: float,
    backward: Sequence[tuple[float, int]],
    allreduce: Callable[[float], float],
    bucket_bytes: int,
) -> tuple[float, list[Bucket]]:
    """(seconds until every gradient is reduced, buckets) for one step.

    ``backward``: (seconds, gradient bytes) per layer in backward order (last layer first);
    ``allreduce(nbytes)``: the all-reduce time of one bucket. Backward starts at ``forward_s``.
    """
    done_at, t = [], forward_s
    for seconds, _ in backward:
        t += seconds
        done_at.append(t)
    compute_end = t
    channel, buckets = 0.0, []
    for members in buckets_of([g for _, g in backward], bucket_bytes):
        nbytes = sum(backward[i][1] for i in members)
        ready = done_at[members[-1]]
        start = max(ready, channel)
        channel = start + allreduce(nbytes)
        buckets.append(Bucket(nbytes, ready, start, channel))
    return max(compute_end, channel), buckets


# --- parameter servers: link load from the shard plan ----------------------------------------------


@dataclass(frozen=True)
class PsTraffic:
    """Bytes per host NIC per step (each direction) and the seconds of a push (or pull) phase."""

    nic_in: tuple[float, ...]
    nic_out: tuple[float, ...]
    phase_s: float
    solo_s: float  # one worker alone: its whole push (or pull) over its own link
    bytes_per_step: float  # push + pull bytes of all workers


PS_MESSAGES = 2  # a push and a reply are each a header, then the payload (strategies/ps/client.py)


def ps_traffic(
    shard_bytes: Sequence[float],
    servers: Sequence[int],
    workers: Sequence[int],
    cluster: Cluster,
    pushes_per_step: float = 1.0,
) -> PsTraffic:
    """One push phase (every worker sends server s its ``shard_bytes[s]``); pulls mirror it.

    The phase ends when the busiest link is drained: per host NIC, max(in, out) / β_nic, and
    inside a host the traffic between its own ranks over the intra link; plus α per message a
    worker sends or receives (`PS_MESSAGES` per server and phase), α grown by the machine's
    contention on shared cores (`shared_cores`). ``pushes_per_step`` < 1 for n_push / n_fetch > 1.
    """
    cluster = shared_cores(cluster, cluster.world)
    # per host: workers on it, server bytes on it (O(ranks), not O(workers x servers))
    workers_on = [0] * cluster.hosts
    for w in workers:
        workers_on[cluster.host_of(w)] += 1
    served = [0.0] * cluster.hosts
    for s, nbytes in zip(servers, shard_bytes, strict=True):
        served[cluster.host_of(s)] += nbytes
    total, n_workers = sum(shard_bytes), len(workers)
    nic_out = [workers_on[h] * (total - served[h]) for h in range(cluster.hosts)]
    nic_in = [served[h] * (n_workers - workers_on[h]) for h in range(cluster.hosts)]
    intra = [workers_on[h] * served[h] for h in range(cluster.hosts)]
    # a NIC's traffic of one phase leaves back to back: a shaper's bucket helps once per phase
    burst = cluster.burst_bytes
    link_s = max(max(0.0, max(i, o) - burst) / cluster.nic_bps for i, o in zip(nic_in, nic_out, strict=True))
    link_s = max(link_s, max(intra) / cluster.intra_bps)
    alpha = cluster.latency_s if cluster.hosts > 1 else cluster.intra_alpha
    phase = (link_s + PS_MESSAGES * len(servers) * alpha) * pushes_per_step
    own = nic_link(cluster) if cluster.hosts > 1 else intra_link(cluster)
    solo = (own.wire_s(total) + PS_MESSAGES * len(servers) * own.alpha) * pushes_per_step
    scale = pushes_per_step
    return PsTraffic(
        tuple(x * scale for x in nic_in),
        tuple(x * scale for x in nic_out),
        phase,
        solo,
        2 * total * n_workers * scale,
    )


# --- tensor parallelism ----------------------------------------------------------------------------


def tp_block_s(
    activation_bytes: float,
    ranks: Sequence[int],
    cluster: Cluster,
    nic_share: int = 1,
    compute_s: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """(forward, backward) collective seconds of one Megatron block: 2 all-reduces of the (B, T, D)
    activations each way. ``compute_s``: the block's (forward, backward) compute; each all-reduce
    follows half of it, all a shaped link's bucket has to refill in (`refilled`)."""
    def twice(idle_s: float | None) -> float:
        link = cluster if idle_s is None else refilled(cluster, idle_s)
        return 2 * allreduce_s(activation_bytes, ranks, link, nic_share)

    if compute_s is None:
        return twice(None), twice(None)
    return twice(compute_s[0] / 2), twice(compute_s[1] / 2)
