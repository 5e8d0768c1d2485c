"""Compressed ps pulls (tier 1, no processes): the worker's copy equals the server's copy of it
bit for bit, nothing is dropped (the difference is carried to the next reply), and the first
reply and the first after a checkpoint are the dense shard."""

from __future__ import annotations

import pytest
import torch

from polytrain.comm.options import CodecOptions
from polytrain.strategies.ps.pulls import PullDecoder, PullEncoder, pulls_compressible


@pytest.mark.parametrize("name", ["topk", "randomk", "onebit", "qsgd", "topk+onebit", "fp16"])
def test_worker_copy_tracks_the_server_copy_and_converges(name: str) -> None:
    opts = CodecOptions(compression=name, ratio=0.1, entropy="zstd")
    server, worker = PullEncoder(opts, world=3, rank=0, seed=5), PullDecoder(opts, world=3, seed=5)
    shard, view = torch.randn(500), torch.zeros(500)
    for step in range(120):
        if step < 20:  # the shard moves for 20 steps, then stands still for 100
            shard = shard - 0.01 * torch.randn(500)
        code, data = server.reply(7, shard)
        assert (code == 0) == (step == 0)
        buf = worker.receive_buffer(code, 500)
        buf.copy_(data)  # what travels
        view = worker.apply(0, 0, code, buf, view)
        assert torch.equal(view, server.known[7]), step  # same bits on both sides
    assert (shard - view).abs().mean() < 1e-3 * shard.abs().mean()  # the left-out part was sent later
    stats = server.stats()
    assert stats["dense_replies"] == 1 and stats["payload_bytes"] < stats["fp32_bytes"]
    server.reset()
    worker.reset()
    code, data = server.reply(7, shard)
    assert code == 0 and torch.equal(worker.apply(0, 0, code, data.clone(), view), shard)


def test_dgc_and_compress_pulls_false_keep_pulls_dense() -> None:
    assert pulls_compressible(CodecOptions(compression="topk"))
    assert not pulls_compressible(CodecOptions(compression="dgc"))
    assert not pulls_compressible(CodecOptions(compression="none"))
