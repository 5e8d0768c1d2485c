"""One rank of ``collective_wire.py`` (run by torchrun inside an emulated host; not a CLI).

    collective_wire_rank.py OUT_DIR CHUNK_ELEMS CALLS

Runs each collective CALLS times on float32 tensors (chunk S = CHUNK_ELEMS elements, full W·S)
and reads this host's interface tx counter (``/proc/net/dev`` of the rank's network namespace,
every interface but ``lo``) before and after, a barrier on either side. Collectives: gloo's own
``all_reduce`` (on W·S), ``reduce_scatter_tensor`` and ``all_gather_into_tensor``, then the same
three through polytrain's accounted ``Comm`` (which also reports what it counted). Rank 0 writes
OUT_DIR/wire.json: per collective, every rank's tx bytes per call and Comm's count per call.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from polytrain.comm import Comm


def _tx_bytes() -> int:
    total = 0
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, data = line.split(":", 1)
        if name.strip() != "lo":
            total += int(data.split()[8])
    return total


def main() -> None:
    out, s, calls = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = Comm(rank, world)
    full, chunk = torch.randn(world * s), torch.randn(s)
    out_full, out_chunk = torch.empty(world * s), torch.empty(s)
    kinds: dict[str, Callable[[], object]] = {
        "gloo all_reduce": lambda: dist.all_reduce(full),
        "gloo reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(out_chunk, full),
        "gloo all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out_full, chunk),
        "Comm all_reduce": lambda: comm.all_reduce(full),
        "Comm reduce_scatter": lambda: comm.reduce_scatter(out_chunk, full),
        "Comm all_gather_into": lambda: comm.all_gather_into(out_full, chunk),
    }
    rows = []
    for name, call in kinds.items():
        call()  # warm-up (connections, buffers)
        counted0 = comm.bytes_sent
        dist.barrier()
        tx0 = _tx_bytes()
        for _ in range(calls):
            work = call()
            if work is not None and hasattr(work, "wait"):
                work.wait()
        dist.barrier()
        tx = torch.tensor([float(_tx_bytes() - tx0) / calls])
        txs = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(txs, tx)
        rows.append({"collective": name, "tx_per_call": [float(t) for t in txs],
                     "counted_per_call": (comm.bytes_sent - counted0) / calls})
    if rank == 0:
        (out / "wire.json").write_text(json.dumps({"world": world, "chunk_elems": s, "calls": calls,
                                                   "rows": rows}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
