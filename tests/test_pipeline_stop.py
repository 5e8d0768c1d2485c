"""A stream pipeline stopped early (SIGTERM, Ctrl-C) ends as a shorter stream would: its order
cut to the micro-batches the input stage admitted is the order of that shorter stream, on every
stage, so every stage drains exactly those and its weights, versions and predictions (spectrain's
distances) are those of a segment that ended there. The stop itself, through the launcher:
tests/faults/test_launcher_signals.py (pipedream on 3 stages, spectrain nightly)."""

from __future__ import annotations

from polytrain.schedules.registry import stage_orders
from polytrain.strategies.pipeline.weights import backward_distances


def test_a_stream_cut_short_is_the_shorter_stream() -> None:
    for stages in range(1, 6):
        for n in range(1, 13):
            full = stage_orders("pipedream", stages, n)
            for first in range(1, n + 1):
                short = stage_orders("pipedream", stages, first)
                for s in range(stages):
                    cut = [a for a in full[s] if a.microbatch < first]
                    assert cut == short[s], (stages, n, first, s)
                    kept = {m: d for m, d in backward_distances(full[s]).items() if m < first}
                    assert kept == backward_distances(short[s])
