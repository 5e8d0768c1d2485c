"""``--optimizer adamw`` and ``--lr-schedule`` (issue 45 item 4): the schedule's values, one
scheduler stepping with the optimizer inside the real strategies, exact resume, and refusal before
launch where a strategy does not honour it."""

from __future__ import annotations

import math

import pytest
import torch

from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.runtime.job import Job
from polytrain.runtime.schedule import LrSchedule, updates_taken

JOB = {"model": "mlp", "model_options": {"hidden": 16}, "dataset": "digits", "batch_size": 16,
       "steps": 8, "seed": 3, "optimizer": "adamw", "lr": 0.01, "weight_decay": 0.1,
       "lr_schedule": "cosine", "warmup_steps": 3, "min_lr": 0.001}


def test_schedule_values() -> None:
    s = LrSchedule("cosine", lr=1.0, horizon=12, warmup=2, min_lr=0.1)
    assert [s.at(n) for n in (1, 2)] == [0.5, 1.0]  # linear warm-up reaches lr at its last step
    assert s.at(7) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 0.5)) / 2)  # halfway
    assert s.at(12) == pytest.approx(0.1) and s.at(40) == pytest.approx(0.1)  # ends at min_lr
    lin = LrSchedule("linear", lr=1.0, horizon=10, min_lr=0.0)
    assert [lin.at(n) for n in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])
    assert not LrSchedule("constant", 1.0, 10).active and LrSchedule("constant", 1.0, 10, 1).active


def _reference(job: Job, steps: int) -> tuple[torch.nn.Module, list[float]]:
    """The job trained in this process with torch's own AdamW and LambdaLR (no polytrain hook)."""
    c = job.config
    model = job.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=c.weight_decay)
    sched = LrSchedule(c.lr_schedule, c.lr, job.steps, c.warmup_steps, c.min_lr)
    lrs = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: sched.at(k + 1) / c.lr)
    batches, used = job.batches(), []
    for i in range(1, steps + 1):
        x, y = batches.shard(i)
        opt.zero_grad()
        job.forward_loss(model, x, y).backward()
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        lrs.step()
    return model, used


def test_make_optimizer_follows_the_schedule_and_resumes_exactly() -> None:
    job = Job.from_config(make_config(JOB))
    ref, ref_lrs = _reference(job, 8)

    def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> list[float]:
        used, batches = [], job.batches()
        for i in steps:
            x, y = batches.shard(i)
            opt.zero_grad()
            job.forward_loss(model, x, y).backward()
            opt.step()
            used.append(opt.param_groups[0]["lr"])  # the hook set it just before this step
        return used

    whole = job.build_model()
    whole_lrs = train(whole, job.make_optimizer(whole.parameters()), range(1, 9))
    assert whole_lrs == pytest.approx(ref_lrs, rel=1e-12)  # torch's LambdaLR rounds differently
    for a, b in zip(whole.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)

    model = job.build_model()
    opt = job.make_optimizer(model.parameters())
    assert isinstance(opt, torch.optim.AdamW)
    lrs = train(model, opt, range(1, 5))
    saved_model, saved_opt = model.state_dict(), opt.state_dict()  # a checkpoint at step 4
    again = job.build_model()
    again.load_state_dict(saved_model)
    opt2 = job.make_optimizer(again.parameters())
    opt2.load_state_dict(saved_opt)
    assert updates_taken(opt2) == 4
    lrs += train(again, opt2, range(5, 9))
    assert lrs == whole_lrs  # resumed: bit-exact, the same floats in the same order
    for a, b in zip(again.parameters(), whole.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bad,match", [
    ({"min_lr": 0.5}, "--min-lr 0.5 is above --lr 0.01"),
    ({"warmup_steps": 8}, "--warmup-steps 8 is not below --steps 8"),
    ({"lr_schedule": "step"}, "'lr_schedule' = 'step'"),
    ({"optimizer": "lamb"}, "'optimizer' = 'lamb'"),
])
def test_bad_schedule_refused(bad: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_config(JOB | bad)


def test_schedule_refused_before_launch_where_not_honoured() -> None:
    cfg = make_config(JOB | {"strategy": "hogwild", "procs": 2, "optimizer": "sgd"})
    with pytest.raises(ConfigError, match=r"does not support lr_schedule \(--lr-schedule cosine "
                                          r"--warmup-steps 3\).*that does: .*allreduce"):
        prepare(cfg)
    prepare(cfg.model_copy(update={"lr_schedule": "constant", "warmup_steps": 0}))
