"""The testbed's time per message of a chain of messages, per operation, measured: what each hop of
a ring all-reduce, a ring all-gather, a chain of point-to-point sends, a reduce-scatter sent
directly (every part to its owner at once, as owt's backward does) or a shift (every rank to its
successor at once, a pipeline's boundaries all busy) or a relay (the point-to-point chain sent as a
pipeline stage sends: receives posted ahead, ``isend``) or a shift so posted costs beyond the planner's
α–β price when emulated hosts share this machine's cores (each hop waits for its receiver to be
scheduled). `plan_accuracy.py --hops-from` prices the testbed with these figures.

    sudo .venv/bin/python benchmarks/plan_hops.py [--hosts 2,4,8] [--nic 1gbit]
        [--bytes 4096,262144] [--ops allreduce,...] [--iterations 30] [--repeats 5] [--name plan_hops]

One process per emulated host (``polytrain.testbed.hosts``, one torch thread each); per host count
``--repeats`` jobs (a fresh testbed each, host counts interleaved), each running every (operation,
bytes) case back to back, interleaved in rounds of 5 (``plan_hops_rank.py``); the first of each round
is left out. Per job and case the mean time of the operation (all-reduce, all-gather: the median over
ranks; p2p, relay: rank 0's time for the ring of W sends); per case the median over jobs (min–max).
hop = (measured − priced) / messages, priced by `cost.network` on the testbed's links without shared
cores (``ring_allreduce_s``, ``allgather_s``, W × ``Link.p2p_s``, ``Link.p2p_s`` of (W−1)/W of the
bytes, ``Link.p2p_s``, W × ``Link.p2p_s``, ``Link.p2p_s``), messages per rank in turn: 2(W−1), W−1, W,
W−1, 1, W and 1; the message's bytes: bytes/W, bytes/W, bytes, bytes/W, bytes, bytes and bytes.
``--ops``: the operations measured (default: all).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from harness import write_results  # noqa: E402
from plan_blocking import run_ranks  # noqa: E402

from polytrain.testbed.probes import collective_hop, hop_table, messages, testbed_hops  # noqa: E402, F401

OPS = ("allreduce", "allgather", "p2p", "direct", "shift", "relay", "posted_shift")


def run_job(hosts: int, nic: str, cases: list[list[Any]], iterations: int) -> dict[str, Any]:
    return run_ranks(hosts, nic, "plan_hops_rank.py", cases, iterations)


def message_bytes(op: str, nbytes: float, world: int) -> float:
    return nbytes if op in ("p2p", "shift", "relay", "posted_shift") else nbytes / world


def priced_s(op: str, nbytes: float, hosts: int, nic: str) -> float:
    """The planner's α–β time of the operation on the testbed's links, cores not shared."""
    import dataclasses

    from polytrain.cost.cluster import parse_rate
    from polytrain.cost.network import allgather_s, nic_link, ring_allreduce_s
    from polytrain.plan.calibration import emulate
    from polytrain.plan.predict import run_cluster

    testbed = run_cluster(hosts, {"hosts": hosts, "rate_bits_per_s": 8 * parse_rate(nic, "nic")})
    cluster = emulate(dataclasses.replace(testbed), burst_bytes=testbed.burst_bytes)  # cores not shared
    link = nic_link(cluster)
    if op == "allreduce":
        return ring_allreduce_s(nbytes, hosts, link)
    if op == "allgather":
        return allgather_s(nbytes, hosts, link)
    if op == "direct":  # all W−1 parts in flight at once: one α, (W−1)/W of the bytes
        return link.p2p_s((hosts - 1) / hosts * nbytes)
    if op in ("shift", "posted_shift"):  # one message each way on every link at once
        return link.p2p_s(nbytes)
    return hosts * link.p2p_s(nbytes)


def job_means(res: dict[str, Any]) -> dict[tuple[str, int], float]:
    out = {}
    for key in sorted({(x["op"], int(x["bytes"])) for x in res["rows"]}):
        mine = [x for x in res["rows"] if (x["op"], int(x["bytes"])) == key]
        steady = [x for i, x in enumerate(mine) if i % 5 != 0]
        chain = key[0] in ("p2p", "relay")  # rank 0's time for the ring; otherwise each rank's
        each = [x["s_ranks"][0] if chain else statistics.median(x["s_ranks"]) for x in steady]
        out[key] = statistics.mean(each)
    return out


def spread(values: list[float], digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def rows_of(hosts: int, nic: str, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    per_job = [job_means(res) for res in jobs]
    out = []
    for op, nbytes in per_job[0]:
        got = [j[(op, nbytes)] * 1e3 for j in per_job]
        price = priced_s(op, nbytes, hosts, nic) * 1e3
        n = messages(op, hosts)
        hops = [(g - price) / n for g in got]
        out.append({"hosts": hosts, "nic": nic, "op": op, "bytes": nbytes,
                    "message_bytes": int(message_bytes(op, nbytes, hosts)), "messages": n,
                    "measured_ms": spread(got, 2), "priced_ms": round(price, 3),
                    "hop_ms": spread(hops), "hop_s": statistics.median(hops) / 1e3, "repeats": len(got)})
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", default="2,4,8")
    p.add_argument("--nic", default="1gbit")
    p.add_argument("--bytes", default="4096,262144")
    p.add_argument("--ops", default=",".join(OPS), help="operations to measure, comma-separated")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--name", default="plan_hops")
    a = p.parse_args()
    ops = a.ops.split(",")
    if unknown := [op for op in ops if op not in OPS]:
        p.error(f"--ops: unknown operation(s) {', '.join(unknown)}; choose from {', '.join(OPS)}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cases = [[op, int(b)] for op in ops for b in a.bytes.split(",")]
    host_counts = [int(h) for h in a.hosts.split(",")]
    raw: dict[str, list[dict[str, Any]]] = {}
    for r in range(a.repeats):
        for hosts in host_counts:  # interleaved: the machine's drift falls on every host count
            raw.setdefault(str(hosts), []).append(run_job(hosts, a.nic, cases, a.iterations))
            print(f"repeat {r + 1}/{a.repeats}: {hosts} hosts done", flush=True)
    rows = [row for hosts in host_counts for row in rows_of(hosts, a.nic, raw[str(hosts)])]
    write_results(a.name, rows, [k for k in rows[0] if k != "hop_s"],
                  extra={"runs": raw, "hops": hop_table(rows)},
                  notes=f"One process per emulated host at {a.nic}; {a.repeats} jobs per host count, "
                        f"interleaved; per job {a.iterations} iterations per case in rounds of 5, cases "
                        "interleaved, each round's first left out; shown: median (min–max) over jobs. "
                        "hop = (measured − priced) / messages: a message's time beyond the planner's α–β "
                        "price on the testbed's links.")


if __name__ == "__main__":
    main()
