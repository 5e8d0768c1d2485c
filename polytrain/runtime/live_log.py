"""``--log csv,tensorboard,wandb``: the run's figures written while it runs, from the launcher.

A thread in the launching process tails every rank's event file (``RUN/ranks/rank*.jsonl``, the
same files the progress display reads) and writes one row per step once every rank that reports
losses has reported that step: the step, the run's clock, samples so far and the loss — the mean
over those ranks of their losses of that step, the figure the progress line and the summary
show. Evaluations are written as they appear. The ranks are not slowed: they only append to
their files, as they always do.

``--log-ranks 0|all`` (TOML ``log_ranks``, Python ``log_ranks=``): ``0`` (the default) writes
those figures of the run only; ``all`` also writes, for every step, each rank's own loss (csv:
rows of kind ``rank`` with the rank in column ``rank``; tensorboard and wandb: ``rank<R>/train_loss``),
so a rank whose data or replica drifts from the others shows.

Sinks: ``csv`` (``RUN/log.csv``, flushed every row), ``tensorboard`` (``RUN/tensorboard/``,
flushed every row; needs the tensorboard package), ``wandb`` (offline mode in ``RUN/wandb``:
never a network call; ``wandb sync`` uploads it later; needs the wandb package).
"""

from __future__ import annotations

import csv
import json
import threading
from pathlib import Path
from typing import Any, Protocol

from polytrain.errors import ConfigError

SINKS = ("csv", "tensorboard", "wandb")
NEEDS = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb"}


def check_sinks(names: list[str]) -> None:
    """Refuse, before launch, a sink whose package is not installed."""
    import importlib

    for name in names:
        if name in NEEDS:
            try:
                importlib.import_module(NEEDS[name])
            except ImportError:
                raise ConfigError(f"--log {name} needs the {name} package, which is not installed "
                                  f"here. Install it (pip install {name}), or use --log csv.") from None


class Sink(Protocol):
    def step(self, step: int, t: float, samples: int, loss: float) -> None: ...
    def rank_step(self, step: int, t: float, rank: int, loss: float) -> None: ...
    def eval(self, step: int, t: float, figures: dict[str, float]) -> None: ...
    def close(self) -> None: ...


class CsvSink:
    FIELDS = ("kind", "step", "t", "samples", "loss", "accuracy", "rank")

    def __init__(self, run_dir: Path) -> None:
        self.file = (run_dir / "log.csv").open("a", newline="")
        self.out = csv.writer(self.file)
        if self.file.tell() == 0:
            self.out.writerow(self.FIELDS)

    def step(self, step: int, t: float, samples: int, loss: float) -> None:
        self.out.writerow(("train", step, round(t, 6), samples, loss, "", ""))
        self.file.flush()

    def rank_step(self, step: int, t: float, rank: int, loss: float) -> None:
        self.out.writerow(("rank", step, round(t, 6), "", loss, "", rank))
        self.file.flush()

    def eval(self, step: int, t: float, figures: dict[str, float]) -> None:
        self.out.writerow(("eval", step, round(t, 6), "", figures.get("loss", ""),
                           figures.get("accuracy", ""), ""))
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class TensorBoardSink:
    def __init__(self, run_dir: Path, tag: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.tag, self.writer = tag, SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def step(self, step: int, t: float, samples: int, loss: float) -> None:
        self.writer.add_scalar(f"{self.tag}/train_loss", loss, global_step=step)
        self.writer.flush()

    def rank_step(self, step: int, t: float, rank: int, loss: float) -> None:
        self.writer.add_scalar(f"{self.tag}/rank{rank}/train_loss", loss, global_step=step)

    def eval(self, step: int, t: float, figures: dict[str, float]) -> None:
        for key, value in figures.items():
            self.writer.add_scalar(f"{self.tag}/test_{key}", value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, tag: str, config: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(mode="offline", dir=str(run_dir), name=run_dir.name, group=tag,
                              config=config)

    def step(self, step: int, t: float, samples: int, loss: float) -> None:
        self.run.log({"train_loss": loss, "samples": samples, "t": t}, step=step)

    def rank_step(self, step: int, t: float, rank: int, loss: float) -> None:
        self.run.log({f"rank{rank}/train_loss": loss}, step=step)

    def eval(self, step: int, t: float, figures: dict[str, float]) -> None:
        self.run.log({f"test_{k}": v for k, v in figures.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


def make_sinks(names: list[str], run_dir: Path, tag: str, config: dict[str, Any]) -> list[Sink]:
    sinks: list[Sink] = []
    for name in names:
        if name == "csv":
            sinks.append(CsvSink(run_dir))
        elif name == "tensorboard":
            sinks.append(TensorBoardSink(run_dir, tag))
        elif name == "wandb":
            sinks.append(WandbSink(run_dir, tag, config))
    return sinks


class StepRows:
    """Step events of every rank folded into rows: a step is complete when every rank that
    reports losses has reported it (or at the end).

    ``world``: the ranks there are. Each says at its loop's start whether it reports a loss per
    step (``start`` event, ``losses``: a parameter server does not); until all ``world`` have
    said so, no step is complete, since a rank whose first steps are still in its buffer would
    otherwise be left out of their mean. None: the ranks whose events are seen (one host's files
    of a multi-host run)."""

    def __init__(self, world: int | None = None) -> None:
        self.losses: dict[int, dict[int, float]] = {}  # step -> rank -> loss
        self.head: dict[int, dict[str, Any]] = {}  # step -> rank 0's (else first) event
        self.latest: dict[int, int] = {}  # rank -> its newest step
        self.reports: dict[int, bool] = {}  # rank -> whether it reports losses (its start event)
        self.world = world
        self.written = 0

    def started(self, ev: dict[str, Any]) -> None:
        self.reports[int(ev.get("rank", 0))] = bool(ev.get("losses", True))

    def add(self, ev: dict[str, Any]) -> None:
        step, rank = int(ev["step"]), int(ev.get("rank", 0))
        if ev.get("loss") is None:
            return
        self.losses.setdefault(step, {})[rank] = float(ev["loss"])
        if rank == 0 or step not in self.head:
            self.head[step] = ev
        self.latest[rank] = max(step, self.latest.get(rank, 0))

    def ready(self, final: bool = False) -> list[tuple[int, float, int, float, dict[int, float]]]:
        """(step, t, samples, mean loss, loss by rank) of the steps complete now, oldest first."""
        if final:
            upto = max(self.losses, default=0)
        elif self.world is None:
            upto = min(self.latest.values(), default=0)
        elif len(self.reports) < self.world:
            upto = 0  # a rank has not said yet whether it reports losses
        else:
            upto = min((self.latest.get(r, 0) for r, yes in self.reports.items() if yes), default=0)
        rows = []
        for step in sorted(s for s in self.losses if self.written < s <= upto):
            losses, head = self.losses.pop(step), self.head.pop(step)
            rows.append((step, float(head.get("t", 0.0)), int(head.get("samples") or 0),
                         sum(losses.values()) / len(losses), losses))
            self.written = step
        return rows


class LiveLog:
    """The launcher's thread that writes ``sinks`` from the ranks' event files as they grow."""

    def __init__(self, ranks: Path, sinks: list[Sink], interval_s: float = 0.5,
                 resume: bool = False, per_rank: bool = False, world: int | None = None) -> None:
        """``resume``: the files' events so far are logged already; start at their ends.
        ``per_rank`` (``--log-ranks all``): also each rank's own loss, every step.
        ``world``: the job's ranks, whose files this process sees (`StepRows`)."""
        self.ranks, self.sinks, self.interval_s = ranks, sinks, interval_s
        self.per_rank = per_rank
        self.offsets: dict[Path, int] = ({p: p.stat().st_size for p in ranks.glob("rank*.jsonl")}
                                         if resume else {})
        self.rows = StepRows(world)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="polytrain-live-log", daemon=True)

    def __enter__(self) -> LiveLog:
        if self.sinks:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sinks:
            self._stop.set()
            self._thread.join()
            for sink in self.sinks:
                sink.close()

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            self.poll(final=stopping)
            if stopping:
                return
            self._stop.wait(self.interval_s)

    def poll(self, final: bool = False) -> None:
        for ev in self._read():
            if ev.get("event") == "step":
                self.rows.add(ev)
            elif ev.get("event") == "start":
                self.rows.started(ev)
            elif ev.get("event") == "eval" and int(ev.get("rank", 0)) == 0:
                figures: dict[str, float] = {k: float(ev[k]) for k in ("accuracy", "loss") if k in ev}
                for sink in self.sinks:
                    sink.eval(int(ev["step"]), float(ev.get("t", 0.0)), figures)
        for step, t, samples, loss, by_rank in self.rows.ready(final):
            for sink in self.sinks:
                sink.step(step, t, samples, loss)
                for rank in sorted(by_rank) if self.per_rank else ():
                    sink.rank_step(step, t, rank, by_rank[rank])

    def _read(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.ranks.glob("rank*.jsonl")):
            with path.open() as f:
                f.seek(self.offsets.get(path, 0))
                for line in f:
                    if not line.endswith("\n"):
                        break  # a line still being written: read it next time
                    self.offsets[path] = self.offsets.get(path, 0) + len(line)
                    if '"event": "step"' in line or '"event": "eval"' in line or '"event": "start"' in line:
                        try:
                            out.append(json.loads(line))
                        except ValueError:
                            continue
        return out
