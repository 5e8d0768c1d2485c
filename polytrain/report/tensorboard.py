"""TensorBoard export (``--tensorboard``): a run's events as TensorBoard scalars.

Written from ``metrics.jsonl`` when the run ends (and by ``polytrain report --tensorboard``), into
``RUN/tensorboard/``; view with ``tensorboard --logdir RUN/tensorboard``. Scalars: the loss per
step (mean over the ranks that reported it; x = step, wall time = the step's time), test accuracy
and loss at each evaluation, and the run's throughput and bytes per sample. Needs the optional
``tensorboard`` package (``pip install 'polytrain[tensorboard]'``).
"""

from __future__ import annotations

from pathlib import Path

from polytrain.errors import ConfigError
from polytrain.report.curves import loss_curve
from polytrain.report.load import load_run


def export_tensorboard(run_dir: Path, tag: str | None = None) -> Path:
    """Write ``run_dir``'s scalars as TensorBoard events; returns the log directory."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "--tensorboard needs the tensorboard package, which is not installed. "
            "Install it with: pip install 'polytrain[tensorboard]' (or pip install tensorboard)."
        ) from None
    run = load_run(run_dir)
    summary = run.summary
    prefix = tag or str(summary.get("strategy", "run"))
    out = run_dir / "tensorboard"
    writer = SummaryWriter(log_dir=str(out))
    try:
        for p in loss_curve(run.events):
            writer.add_scalar(f"{prefix}/train_loss", p.loss, global_step=p.step)
        for e in run.events:
            if e.get("event") == "eval":
                for key in ("accuracy", "loss"):
                    if e.get(key) is not None:
                        writer.add_scalar(f"{prefix}/test_{key}", float(e[key]), global_step=e["step"])
        last = summary.get("steps_run") or summary.get("steps") or 0
        writer.add_scalar(f"{prefix}/throughput_samples_per_s",
                          float(summary.get("throughput_samples_per_s") or 0.0), global_step=last)
        writer.add_scalar(f"{prefix}/bytes_sent_per_sample",
                          float(summary.get("bytes_sent_per_sample") or 0.0), global_step=last)
    finally:
        writer.close()
    return out
