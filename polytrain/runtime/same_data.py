"""Every rank trains on the same data: a fingerprint compared across ranks before the first step.

Each rank builds the dataset itself (``Job.from_config``, seeded by ``--seed``). A user's dataset
factory that ignores its ``seed`` argument, or draws from an unseeded generator, gives each rank
different data — different samples, or even different shapes and so different models — and the
run trains on nonsense without any error (issue 50, item 11). The fingerprint is the sizes and
sample shapes of both splits and a SHA-256 of the first samples' bytes (at most 64 of each:
cheap for any dataset, and data drawn from different seeds differ there); one all-gather of a
few integers from rank 0 at start compares it, and a difference names the ranks and what differs.
"""

from __future__ import annotations

import hashlib

import torch

from polytrain.errors import ConfigError
from polytrain.runtime.job import Job, RankContext

HEAD = 64  # samples hashed per tensor
DIMS = 6  # sample dimensions compared (a longer shape is compared by its hash)
FIELDS = ("train samples", "test samples", "sample shape", "label shape", "content of the first samples")


def fingerprint(job: Job) -> list[int]:
    """[n_train, n_test, x shape (padded), y shape (padded), 60 bits of the head's SHA-256]."""
    d = job.dataset
    h = hashlib.sha256()
    for t in (d.x_train, d.y_train, d.x_test, d.y_test):
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t[:HEAD].detach().cpu().contiguous().numpy().tobytes())

    def shape(t: torch.Tensor) -> list[int]:
        dims = list(t.shape[1:])[:DIMS]
        return dims + [-1] * (DIMS - len(dims))

    digest = int.from_bytes(h.digest()[:8], "big") >> 4  # fits an int64
    return [int(d.x_train.shape[0]), int(d.x_test.shape[0]), *shape(d.x_train), *shape(d.y_train),
            digest]


def _what_differs(a: list[int], b: list[int]) -> str:
    parts = [a[0:1], a[1:2], a[2:2 + DIMS], a[2 + DIMS:2 + 2 * DIMS], a[-1:]]
    other = [b[0:1], b[1:2], b[2:2 + DIMS], b[2 + DIMS:2 + 2 * DIMS], b[-1:]]
    return ", ".join(name for name, x, y in zip(FIELDS, parts, other, strict=True) if x != y)


def check_same_data(job: Job, ctx: RankContext) -> None:
    """Collective: rank 0's fingerprint goes to every rank (a control message, not counted in
    the run's bytes); a rank whose data differ raises ConfigError naming itself and what."""
    if ctx.world == 1:
        return
    mine = fingerprint(job)
    first = ctx.comm.broadcast_json(mine, src=0)
    if list(first) != mine:
        raise ConfigError(
            f"rank {ctx.rank}'s training data differ from rank 0's in {_what_differs(first, mine)} "
            f"(dataset '{job.config.dataset}'). Every rank builds the dataset from --seed: make the "
            "dataset factory use its seed argument (or no randomness), so every rank gets the same "
            "data.")
