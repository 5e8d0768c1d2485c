"""Tier 1: the α–β cost formulas against hand-computed cases, and the cluster description."""

from __future__ import annotations

from dataclasses import replace

import pytest

from polytrain.cost.cluster import Cluster, parse_bytes
from polytrain.cost.network import (
    Link,
    allgather_s,
    allreduce_s,
    buckets_of,
    ddp_overlap,
    direct_exchange_s,
    group_allgather_s,
    nic_link,
    ps_traffic,
    refilled,
    ring_allreduce_s,
    tp_block_s,
    tree_allreduce_s,
    two_level_allreduce_s,
)
from polytrain.errors import ConfigError
from polytrain.plan.calibration import emulate

MB = 1_000_000


def test_ring_allreduce_by_hand() -> None:
    # 4 ranks, 100 MB, 1 GB/s, 10 us: 2*3/4*0.1 s + 6*10 us = 0.15 s + 60 us
    assert ring_allreduce_s(100 * MB, 4, Link(10e-6, 1e9)) == pytest.approx(0.15006)
    assert ring_allreduce_s(100 * MB, 1, Link(10e-6, 1e9)) == 0.0


def test_tree_and_allgather_by_hand() -> None:
    # 8 ranks: 2*3 levels of (1 ms + 1 MB / 1 GB/s = 1 ms) = 12 ms
    assert tree_allreduce_s(MB, 8, Link(1e-3, 1e9)) == pytest.approx(0.012)
    # all-gather of 8 MB in total over 8 ranks: 7/8 * 8 ms + 7 * 1 ms
    assert allgather_s(8 * MB, 8, Link(1e-3, 1e9)) == pytest.approx(0.014)


def test_allreduce_picks_link_by_hosts() -> None:
    cl = Cluster(hosts=2, procs_per_host=2, nic_bps=1e8, intra_bps=1e10, latency_s=1e-4, intra_latency_s=1e-6)
    # inside host 0: ranks 0, 1 over the intra link: 2*1/2*10 MB/1e10 + 2*1e-6
    assert allreduce_s(10 * MB, [0, 1], cl) == pytest.approx(1e-3 + 2e-6)
    # across hosts (ranks 0 and 2): the NIC, 10 MB / 1e8 = 0.1 s + 2 * 100 us
    assert allreduce_s(10 * MB, [0, 2], cl) == pytest.approx(0.1002)
    # two concurrent groups sharing each NIC halve its bandwidth
    assert allreduce_s(10 * MB, [0, 2], cl, nic_share=2) == pytest.approx(0.2002)


def test_two_level_pays_fewer_nic_latencies() -> None:
    cl = Cluster(
        hosts=64, procs_per_host=8, nic_bps=1e9, intra_bps=1e11, latency_s=1e-3, intra_latency_s=1e-6
    )
    ranks = range(cl.world)
    flat = ring_allreduce_s(1e3, cl.world, Link(1e-3, 1e9))  # 2*511 latencies of 1 ms: ~1 s
    two = two_level_allreduce_s(1e3, 8, 64, cl)  # 2*63 NIC latencies: ~0.126 s
    assert two < flat / 5
    assert allreduce_s(1e3, ranks, cl) <= two
    # by hand: 2 * (7/8 * 1e3/1e11 + 7e-6) + 2*63/64 * (1e3/8)/(1e9/8) + 126e-3
    assert two == pytest.approx(2 * (7 / 8 * 1e-8 + 7e-6) + 2 * 63 / 64 * 1e-6 + 0.126)


def test_more_bandwidth_never_slower() -> None:
    for nic in (1e6, 1e7, 1e8, 1e9):
        slow = Cluster(hosts=8, procs_per_host=4, nic_bps=nic, intra_bps=1e10)
        fast = Cluster(hosts=8, procs_per_host=4, nic_bps=nic * 10, intra_bps=1e10)
        for size in (1e3, 1e6, 1e8):
            assert allreduce_s(size, range(32), fast) <= allreduce_s(size, range(32), slow)


def test_ddp_buckets_overlap_backward_by_hand() -> None:
    # backward order: 3 layers of 10 ms each producing 0.6 MiB, 0.6 MiB, 3 MiB of gradients;
    # first bucket capped at 1 MiB -> [0], then 25 MiB -> [1, 2].
    mib = 2**20
    layers = [(0.01, int(0.6 * mib)), (0.01, int(0.6 * mib)), (0.01, 3 * mib)]
    assert buckets_of([g for _, g in layers], 25 * mib) == [[0], [1, 2]]
    done, buckets = ddp_overlap(0.005, layers, lambda s: s / 1e8, 25 * mib)
    # bucket 0 ready at 5+10 ms, takes 6.29 ms; bucket 1 ready at 35 ms, takes 37.7 ms
    assert buckets[0].start_s == pytest.approx(0.015)
    assert buckets[0].end_s == pytest.approx(0.015 + 0.6 * mib / 1e8, rel=1e-6)
    assert buckets[1].start_s == pytest.approx(0.035)
    assert done == pytest.approx(0.035 + 3.6 * mib / 1e8, rel=1e-6)
    # an all-reduce slower than backward delays the next bucket (one channel)
    _, late = ddp_overlap(0.0, [(0.001, 2 * mib), (0.001, 2 * mib)], lambda s: 0.1, 2 * mib)
    assert late[1].start_s == pytest.approx(late[0].end_s)


def test_ps_server_link_load_from_shards() -> None:
    # 1 host per rank: server 0 holds 3 MB, server 1 holds 1 MB; 4 workers (ranks 2..5)
    cl = Cluster(hosts=6, procs_per_host=1, nic_bps=1e8, latency_s=0.0)
    t = ps_traffic([3 * MB, 1 * MB], [0, 1], [2, 3, 4, 5], cl)
    assert t.nic_in[0] == 12 * MB and t.nic_in[1] == 4 * MB  # every worker pushes its shard
    assert t.nic_out[2] == 4 * MB  # a worker sends the whole model, one piece per server
    assert t.phase_s == pytest.approx(0.12)  # the busiest link: 12 MB at 100 MB/s
    assert t.bytes_per_step == 2 * 4 * 4 * MB  # push + pull, 4 workers, 4 MB each
    balanced = ps_traffic([2 * MB, 2 * MB], [0, 1], [2, 3, 4, 5], cl)
    assert balanced.phase_s == pytest.approx(0.08)  # size sharding balances the servers


def test_ps_servers_on_one_host_share_its_nic() -> None:
    cl = Cluster(hosts=3, procs_per_host=2, nic_bps=1e8, intra_bps=1e12, latency_s=0.0)
    t = ps_traffic([MB, MB], [0, 1], [2, 3, 4, 5], cl)  # both servers on host 0
    assert t.nic_in[0] == 8 * MB and t.phase_s == pytest.approx(0.08)


def test_ps_messages_pay_alpha_and_shared_cores_by_hand() -> None:
    # 8 hosts, one rank each: 2 servers, 6 workers; 1 ms hops; a worker's push is a header and a
    # payload per server: 2 * 2 messages of 1 ms (no bytes to speak of)
    cl = Cluster(hosts=8, procs_per_host=1, nic_bps=1e12, intra_bps=1e12, latency_s=1e-3)
    t = ps_traffic([1.0, 1.0], [0, 1], range(2, 8), cl)
    assert t.phase_s == pytest.approx(0.004, rel=1e-6) and t.solo_s == pytest.approx(0.004, rel=1e-6)
    # on 2 shared cores each hop waits for the machine's 8 ranks: α × 8/2
    shared = emulate(cl, cores=2)
    assert ps_traffic([1.0, 1.0], [0, 1], range(2, 8), shared).phase_s == pytest.approx(0.016, rel=1e-6)


def test_tp_block_collectives_by_hand() -> None:
    cl = Cluster(hosts=1, procs_per_host=4, intra_bps=1e9, intra_latency_s=0.0)
    f, b = tp_block_s(MB, range(4), cl)
    # 2 ring all-reduces of 1 MB over 4 ranks each way: 2 * 1.5 ms
    assert f == b == pytest.approx(0.003)


def test_cluster_parse_and_errors() -> None:
    cl = Cluster.parse("hosts=64,procs_per_host=8,nic=100gbit,intra=300gbyte,latency=5us")
    assert (cl.world, cl.nic_bps, cl.intra_bps) == (512, 12.5e9, 3e11)
    assert cl.latency_s == pytest.approx(5e-6)
    for bad, field in (
        ("hosts=0", "hosts"),
        ("nic=fast", "nic"),
        ("latency=5", "latency"),
        ("nic=100gbit,colour=red", "colour"),
        ("intra=-1gbyte", "intra"),
    ):
        with pytest.raises(ConfigError, match=field) as err:
            Cluster.parse(bad)
        assert "\n" not in str(err.value)
    assert parse_bytes("16GiB") == 16 * 2**30 and parse_bytes("500MB") == 500 * MB
    with pytest.raises(ConfigError, match="memory-limit"):
        parse_bytes("lots")


def test_shared_cores_scale_alpha_by_hand() -> None:
    # 8 hosts, one rank each, all on 2 shared cores: each message's α is 8/2 = 4 times 1 ms.
    # Ring (tiny message): 2*7 messages * 4 ms; tree: 2*3 levels * 4 ms = 24 ms is the faster
    cl = Cluster(hosts=8, procs_per_host=1, nic_bps=1e12, intra_bps=1e12, latency_s=1e-3)
    cl = emulate(cl, cores=2)
    assert allreduce_s(1.0, range(8), cl) == pytest.approx(0.024, rel=1e-6)
    # 2 of the 8 ranks (a dp×tp mesh's tensor pair): every rank computes between collectives, so
    # the pair's 2 messages wait on the machine's contention too, 2 * 4 ms
    assert allreduce_s(1.0, [0, 1], cl) == pytest.approx(0.008, rel=1e-6)
    # 2 ranks on 2 cores: no contention, α unchanged (tree = ring = 2 messages of 1 ms)
    pair = emulate(Cluster(hosts=2, procs_per_host=1, nic_bps=1e12, intra_bps=1e12, latency_s=1e-3), cores=2)
    assert allreduce_s(1.0, [0, 1], pair) == pytest.approx(0.002, rel=1e-6)
    # a call's own time: 0.5 ms per all-reduce or all-gather, times the contention 8/2
    called = emulate(cl, call_s=5e-4)
    assert allreduce_s(1.0, range(8), called) == pytest.approx(0.024 + 0.002, rel=1e-6)
    extra = group_allgather_s(1.0, range(8), called) - group_allgather_s(1.0, range(8), cl)
    assert extra == pytest.approx(0.002)
    assert allreduce_s(1.0, [0], called) == 0.0  # one rank: no call
    # without shared cores nothing changes
    free = Cluster(hosts=8, procs_per_host=1, nic_bps=1e12, intra_bps=1e12, latency_s=1e-3)
    assert allreduce_s(1.0, range(8), free) == pytest.approx(0.006, rel=1e-6)


def test_collective_steps_pay_the_hop_by_hand() -> None:
    """``hop``: each step of a collective costs its time once, whatever its size and the cores."""
    free = Cluster(hosts=8, procs_per_host=1, nic_bps=1e12, intra_bps=1e12, latency_s=1e-3)
    hopped = emulate(free, hop_s=2e-3)
    # ring: 14 steps of (1 + 2) ms = 42 ms; tree: 6 levels of (1 + 2) ms = 18 ms is the faster
    assert allreduce_s(1.0, range(8), hopped) == pytest.approx(0.018, rel=1e-6)
    # a big message: the ring (14 steps, 2·7/8·S on the wire) beats the tree (6 whole messages)
    big = 8e9
    ring = 2 * 7 / 8 * big / 1e12 + 14 * 3e-3
    assert allreduce_s(big, range(8), hopped) == pytest.approx(ring, rel=1e-6)
    # all-gather over 4: 3 steps of (1 + 2) ms
    assert group_allgather_s(1.0, range(4), hopped) == pytest.approx(0.009, rel=1e-6)
    # on shared cores the hop is not multiplied: α grows by 8/2, the hop does not
    shared = emulate(hopped, cores=2)
    assert allreduce_s(1.0, range(8), shared) == pytest.approx(6 * (4e-3 + 2e-3), rel=1e-6)
    assert "1.3 ms per collective step" in emulate(free, hop_s=1.3e-3).describe()


def test_direct_exchange_by_hand() -> None:
    """A reduce-scatter sent directly (owt's backward): one α and (n−1)/n of the bytes on the link,
    ``direct_hop`` per message, ``hop`` where none is given."""
    free = Cluster(hosts=8, procs_per_host=1, nic_bps=1e9, intra_bps=1e12, latency_s=1e-3)
    # 8 MB over 8 ranks: 1 ms + 7/8 · 8 ms = 8 ms
    assert direct_exchange_s(8e6, range(8), free) == pytest.approx(0.008, rel=1e-6)
    # a ring all-gather of the same bytes pays 7 α
    assert group_allgather_s(8e6, range(8), free) == pytest.approx(0.014, rel=1e-6)
    hopped = emulate(free, hop_s=2e-3)
    assert direct_exchange_s(8e6, range(8), hopped) == pytest.approx(0.008 + 7 * 2e-3, rel=1e-6)
    direct = emulate(hopped, direct_hop_s=1e-3)
    assert direct_exchange_s(8e6, range(8), direct) == pytest.approx(0.008 + 7 * 1e-3, rel=1e-6)
    assert direct_exchange_s(8e6, [3], direct) == 0.0
    parsed = emulate(free, hop_s=1.3e-3, direct_hop_s=0.9e-3)
    assert (parsed.hop_s, parsed.direct_hop) == pytest.approx((1.3e-3, 0.9e-3))
    assert "0.9 ms per direct message" in parsed.describe()
    assert emulate(free, hop_s=1.3e-3).direct_hop == pytest.approx(1.3e-3)
    woken = emulate(free, cores=2, wake_s=1e-3)
    assert woken.wake_s == pytest.approx(1e-3) and "1 ms to wake a waiting rank" in woken.describe()
    with pytest.raises(ConfigError, match=r"wake_s is 1 ms with no cores"):
        emulate(free, wake_s=1e-3)


def test_owt_scatters_all_gathers_but_the_last() -> None:
    """owt's backward, as its runtime: the last gather (every rank computes the same loss from it)
    sends nothing back; the others are reduce-scattered directly."""
    from polytrain.cost.estimate import owt
    from polytrain.cost.scene import Scene
    from tests.test_plan_recommend import vgg_like

    cl = emulate(Cluster(hosts=4, procs_per_host=1, nic_bps=1e9, intra_bps=1e12, latency_s=1e-3), hop_s=2e-3)
    scene = Scene(vgg_like(), cl, 64)
    prof = scene.profile
    est = owt(scene, 4)
    spans = {s.label: s.end - s.start for s in est.spans}
    gathered = [prof.layers[i].activation_bytes * 64 / prof.batch_size
                for i in range((prof.fc_start or 0) - 1, scene.layers)]
    assert spans["reduce-scatters"] == pytest.approx(
        sum(direct_exchange_s(g, range(4), cl) for g in gathered[:-1]), rel=1e-6)
    # bytes: every gather once, every scatter but the last once, the conv gradients twice; (W−1)/W each
    conv = sum(r.param_bytes for r in prof.layers[: prof.fc_start])
    assert est.bytes_per_step == pytest.approx(3 * (sum(gathered) + sum(gathered[:-1]) + 2 * conv))


def test_shaped_link_bucket_by_hand() -> None:
    """A token-bucket NIC (the testbed's tbf) sends its first ``burst`` bytes at line speed."""
    link = Link(alpha=1e-4, bps=1e7, burst=50_000)
    assert link.p2p_s(150_000) == pytest.approx(1e-4 + 0.01)  # (150 kB − 50 kB) / 10 MB/s
    assert link.p2p_s(30_000) == pytest.approx(1e-4)  # within the bucket: only α
    # ring over 4: each rank sends 2·3/4·S back to back, the bucket helps once per call
    assert ring_allreduce_s(4 * MB, 4, link) == pytest.approx((6 * MB - 50_000) / 1e7 + 6e-4)
    assert allgather_s(4 * MB, 4, link) == pytest.approx((3 * MB - 50_000) / 1e7 + 3e-4)
    shaped = emulate(Cluster(hosts=6, procs_per_host=1, nic_bps=1e8, latency_s=0.0), burst_bytes=MB)
    t = ps_traffic([3 * MB, 1 * MB], [0, 1], [2, 3, 4, 5], shaped)
    assert t.phase_s == pytest.approx(0.11)  # (12 MB − 1 MB) / 100 MB/s
    for nic in (1e7, 1e8):  # the bucket never makes a faster link slower
        fast, slow = Link(1e-4, nic * 10, 5e4), Link(1e-4, nic, 5e4)
        assert ring_allreduce_s(MB, 4, fast) <= ring_allreduce_s(MB, 4, slow)


def test_bucket_refills_at_the_shaped_rate_by_hand() -> None:
    """Collectives separated by a little compute find only what the bucket refilled meanwhile."""
    cl = emulate(Cluster(hosts=2, procs_per_host=1, nic_bps=1e8, latency_s=0.0), burst_bytes=MB)
    assert refilled(cl, 0.002).burst_bytes == pytest.approx(200_000)  # 2 ms at 100 MB/s
    assert refilled(cl, 0.5).burst_bytes == MB  # never more than the bucket's depth
    assert refilled(cl, -1.0).burst_bytes == 0.0
    plain = Cluster(hosts=2, procs_per_host=1, nic_bps=1e8, latency_s=0.0)
    assert refilled(plain, 0.002) == plain
    # a tensor-parallel block over the 2 hosts: each all-reduce sends S = 1 MB per rank (2·1/2·S);
    # forward compute 4 ms → 2 ms before each all-reduce → 200 kB of bucket; backward 20 ms → full
    f, b = tp_block_s(MB, [0, 1], cl, compute_s=(0.004, 0.020))
    assert f == pytest.approx(2 * (MB - 200_000) / 1e8)
    assert b == pytest.approx(0.0)
    # without the compute, every all-reduce is priced with a full bucket, as before
    assert tp_block_s(MB, [0, 1], cl) == pytest.approx((0.0, 0.0))


def test_testbed_cluster_has_the_testbeds_bucket() -> None:
    from types import SimpleNamespace

    from polytrain.plan.predict import TESTBED_GOODPUT, run_cluster
    from polytrain.testbed.hosts import Testbed

    for bits in (1e8, 1e9, 1e6):
        stub = SimpleNamespace(rate_bits_per_s=int(bits), _delay_us=0, _loss_pct=0.0)
        shaping = Testbed._shaping(stub, host_side=True)  # type: ignore[arg-type]
        cluster = run_cluster(2, {"hosts": 2, "rate_bits_per_s": bits})
        # the shaper counts frame bytes; the cluster prices payload: 1448 of every 1514
        assert cluster.burst_bytes == pytest.approx(shaping.burst_bytes * 1448 / 1514)
        assert cluster.nic_bps == pytest.approx(bits / 8 * TESTBED_GOODPUT)
        assert shaping.rate_bits_per_s == bits


def test_gloo_all_reduce_is_always_a_ring() -> None:
    """``collectives=ring`` (gloo: its all-reduce has no other algorithm): 2(n−1) steps even where
    a tree or two levels would be faster; ``auto`` (NCCL) takes the fastest."""
    hopped = emulate(Cluster(hosts=8, procs_per_host=1, nic_bps=1e12, intra_bps=1e12, latency_s=1e-3),
                     hop_s=2e-3)
    gloo = replace(hopped, collectives="ring")
    assert allreduce_s(1.0, range(8), hopped) == pytest.approx(6 * 3e-3, rel=1e-6)  # the tree
    assert allreduce_s(1.0, range(8), gloo) == pytest.approx(14 * 3e-3, rel=1e-6)  # the ring
    two = Cluster(hosts=2, procs_per_host=4, nic_bps=1e8, intra_bps=1e12, latency_s=1e-3)
    ring = ring_allreduce_s(8 * MB, 8, nic_link(two))
    assert allreduce_s(8 * MB, range(8), two) < ring  # two levels: the NIC carries less
    assert allreduce_s(8 * MB, range(8), replace(two, collectives="ring")) == pytest.approx(ring)
    parsed = Cluster.parse("hosts=2,collectives=RING")
    assert parsed.collectives == "ring" and "ring all-reduce only" in parsed.describe()
    assert parsed.to_json()["collectives"] == "ring"
    with pytest.raises(ConfigError, match=r"'collectives' is 'tree'.*collectives=ring"):
        Cluster.parse("hosts=2,collectives=tree")
