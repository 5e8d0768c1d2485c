"""Data only a rank can see (issue 50, item 11): a dataset factory that ignores its seed gives
each rank other samples; the ranks compare a fingerprint of their data before the first step
and the run fails naming the rank and what differs."""

from __future__ import annotations

from pathlib import Path

import pytest

import polytrain
from polytrain.config import load_config
from polytrain.errors import RankFailure
from polytrain.runtime.job import Job
from polytrain.runtime.same_data import fingerprint


def test_the_fingerprint_sees_content_and_shape() -> None:
    seeded = load_config(overrides={"dataset": "digits"})
    assert fingerprint(Job.from_config(seeded)) == fingerprint(Job.from_config(seeded))
    a = fingerprint(Job.from_config(load_config(overrides={"dataset": "tests.bad_data:unseeded"})))
    from polytrain.data.user import _load

    _load.cache_clear()  # a second "process"
    b = fingerprint(Job.from_config(load_config(overrides={"dataset": "tests.bad_data:unseeded"})))
    assert a[:-1] == b[:-1] and a[-1] != b[-1]


@pytest.mark.slow
def test_a_factory_that_ignores_its_seed_is_caught_at_the_first_step(tmp_path: Path) -> None:
    with pytest.raises(RankFailure, match=r"rank 1's training data differ from rank 0's in "
                                          r"content of the first samples"):
        polytrain.train(strategy="allreduce", procs=2, model="mlp", dataset="tests.bad_data:unseeded",
                        batch_size=16, steps=2, out=str(tmp_path / "run"))
