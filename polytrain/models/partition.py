"""Cutting a model into stages: the partition as plain data, the cut, and the planners.

A model that can be cut is an ``nn.Sequential`` whose children are its ordered layers, each mapping
one tensor to one tensor (every zoo model; a user factory returning a list of modules). A
`Partition` says how many consecutive layers each stage holds and how many replicas each stage
has; `cut` turns a model into one ``nn.Sequential`` per stage, keeping the children's names so a
stage's ``state_dict`` keys are the full model's keys (``"fc2.0.weight"``).

Planners, all returning a Partition:

- `uniform`: equal layer counts (the earlier stages take the remainder);
- `balanced`: contiguous split minimising the largest stage cost (per-layer parameter bytes for
  ``partition=params``, measured forward+backward time for ``partition=time``);
- `pipedream_plan`: PipeDream's dynamic programme (Narayanan et al., SOSP'19, §3.1; seed 003
  §3.2): for layers i..j replicated m times, T(i→j, m) = (1/m)·max(Σ T_l, Σ W_l^m), where W_l^m
  is the weight synchronisation time of layer l over m replicas (ring all-reduce: 2(m−1)/m·w_l
  bytes over the link); A(j, m) = min over the last cut i and its replicas m' of
  max(A(i, m − m'), 2·C_i, T(i+1→j, m')) with C_i the transfer time of layer i's activations.
  O(N²·W²) for N layers and W workers.

Pure Python apart from `cut` (torch): plans are data, printable and comparable.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from polytrain.errors import ConfigError

_TOKEN = re.compile(r"^\s*(\d+)\s*(?:[x*]\s*(\d+)\s*)?$")
NEEDS_LAYERS = (
    "an ordered list of layers: an nn.Sequential whose children each map one tensor to one "
    "tensor (every zoo model is one), or a factory returning a list of such modules"
)


@dataclass(frozen=True)
class Partition:
    """Layers per stage and replicas per stage, e.g. ``Partition((3, 5, 5, 6))`` prints ``3,5,5,6``.

    Stage s holds layers ``bounds[s]`` (a half-open range of child indices); a stage with r
    replicas uses r ranks. Ranks are numbered stage by stage: stage 0's replicas first.
    """

    counts: tuple[int, ...]
    replicas: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        counts, replicas = tuple(self.counts), tuple(self.replicas) or (1,) * len(self.counts)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "replicas", replicas)
        bad = [c for c in counts + replicas if isinstance(c, bool) or not isinstance(c, int) or c < 1]
        if not counts or bad or len(replicas) != len(counts):
            raise ConfigError(
                f"Partition counts={counts} replicas={replicas}. Rule: at least one stage, every "
                "layer count and replica count a whole number >= 1, one replica count per stage. "
                "Fix: e.g. --set partition=3,5,5,6 (4 stages), or partition=3,5x2 (stage 1 twice)."
            )

    @property
    def stages(self) -> int:
        return len(self.counts)

    @property
    def layers(self) -> int:
        return sum(self.counts)

    @property
    def ranks(self) -> int:
        return sum(self.replicas)

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """``[(start, end), ...]``: stage s holds children ``start..end-1``."""
        out, start = [], 0
        for c in self.counts:
            out.append((start, start + c))
            start += c
        return out

    def __str__(self) -> str:
        return ",".join(
            f"{c}x{r}" if r > 1 else str(c) for c, r in zip(self.counts, self.replicas, strict=True)
        )

    @classmethod
    def parse(cls, text: str | int | Sequence[int]) -> Partition:
        """``"3,5,5,6"``, ``"3,5x2"`` (stage 1 replicated twice), ``4`` or ``[3, 5]``."""
        if isinstance(text, int):
            return cls((text,))
        if not isinstance(text, str):
            return cls(tuple(text))
        counts, replicas = [], []
        for token in text.split(","):
            match = _TOKEN.match(token)
            if match is None:
                raise ConfigError(
                    f"Cannot read partition '{text}' at '{token.strip()}'. Rule: comma-separated "
                    "layer counts per stage, each optionally xR for R replicas. Fix: e.g. "
                    "--set partition=3,5,5,6, or one of auto, uniform, params, time."
                )
            counts.append(int(match[1]))
            replicas.append(int(match[2] or 1))
        return cls(tuple(counts), tuple(replicas))

    def check(self, layers: int, ranks: int) -> None:
        """Raise ConfigError unless the counts add up to ``layers`` and the stages use ``ranks``."""
        if self.layers != layers:
            fix = str(uniform(layers, self.stages)) if layers >= self.stages else f"{layers} stages at most"
            raise ConfigError(
                f"Partition {self} holds {self.layers} layers but the model has {layers}. Rule: the "
                f"layer counts must add up to the model's layers. Fix: e.g. --set partition={fix}, "
                "or --set partition=auto."
            )
        if self.ranks != ranks:
            fit = str(uniform(layers, min(ranks, layers))) if ranks <= layers else None
            fix = f"--set partition={fit}, or " if fit else ""
            raise ConfigError(
                f"Partition {self} needs {self.ranks} ranks ({self.stages} stages, replicas "
                f"{list(self.replicas)}) but the job has --procs {ranks}. Rule: one rank per stage "
                f"replica. Fix: {fix}--procs {self.ranks}."
            )

    def stage_of_rank(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of ``rank``: stage 0's replicas take the first ranks."""
        first = 0
        for s, r in enumerate(self.replicas):
            if rank < first + r:
                return s, rank - first
            first += r
        raise ValueError(f"rank {rank} is beyond the partition's {self.ranks} ranks")

    def stage_ranks(self, stage: int) -> list[int]:
        """The ranks of ``stage``'s replicas (replica j is the j-th)."""
        first = sum(self.replicas[:stage])
        return list(range(first, first + self.replicas[stage]))

    def to_json(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "replicas": list(self.replicas), "text": str(self)}


# --- the cut ---------------------------------------------------------------------------------------


def layers_of(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The ordered (name, layer) children of a model that can be cut, or a ConfigError."""
    if not isinstance(model, nn.Sequential):
        raise ConfigError(
            f"Cannot cut a {type(model).__name__} into pipeline stages: its forward() is code, not "
            f"a list. Needed: {NEEDS_LAYERS}. Fix: return nn.Sequential(layer1, layer2, ...) "
            "from your model factory."
        )
    return list(model.named_children())


def cut(model: nn.Module, partition: Partition) -> list[nn.Sequential]:
    """One ``nn.Sequential`` per stage holding its layers (shared, not copied), names kept.

    ``cut(mlp, Partition((2, 1)))`` -> ``[Sequential(fc1, fc2), Sequential(head)]``; stage
    ``state_dict`` keys equal the full model's (``"fc1.1.weight"``), so the stages' states merge
    back into the model's. Replicas do not change the cut: every replica holds its stage's layers.
    """
    children = layers_of(model)
    if partition.layers != len(children):
        partition.check(len(children), partition.ranks)
    return [nn.Sequential(OrderedDict(children[a:b])) for a, b in partition.bounds]


def check_cuttable(model: nn.Module, stages: int) -> int:
    """The number of layers, refusing models too short for ``stages`` with what is needed."""
    n = len(layers_of(model))
    if n < stages:
        single = (
            " A model that is not an nn.Sequential is held as ONE layer until it is cut: add "
            "--set split=auto to cut it at its blocks by tracing (or split=PATHS to name the "
            "cuts, e.g. split=transformer.h.1)."
            if n == 1
            else ""
        )
        raise ConfigError(
            f"The model has {n} layer(s) but the pipeline needs at least one per stage ({stages} "
            f"stages).{single} Needed: {NEEDS_LAYERS}. Fix: use --procs {n} or fewer, or give the "
            "model more layers (split=auto offers a cut before every block)."
        )
    return n


# --- simple planners -------------------------------------------------------------------------------


def uniform(layers: int, stages: int) -> Partition:
    """Equal layer counts; the first ``layers % stages`` stages take one more."""
    base, extra = divmod(layers, stages)
    return Partition(tuple(base + (s < extra) for s in range(stages)))


def balanced(costs: Sequence[float], stages: int) -> Partition:
    """Contiguous split of ``costs`` into ``stages`` minimising the largest stage sum (exact DP).

    ``best[k][j]``: smallest achievable max over k stages holding layers 0..j-1. O(N²·P).
    Ties prefer later cuts, so earlier stages take more layers (as `uniform` does).
    """
    n = len(costs)
    check_stage_count(n, stages)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut_at = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value <= best[k][j]:
                    best[k][j], cut_at[k][j] = value, i
    counts, j = [], n
    for k in range(stages, 0, -1):
        i = cut_at[k][j]
        counts.append(j - i)
        j = i
    return Partition(tuple(reversed(counts)))


def check_stage_count(layers: int, stages: int) -> None:
    if not 1 <= stages <= layers:
        raise ConfigError(
            f"Cannot split {layers} layers into {stages} stages. Rule: 1 <= stages <= layers. "
            f"Fix: use --procs {max(1, min(stages, layers))}, or a model with more layers."
        )


# --- PipeDream's planner ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerCost:
    """What the planner knows of a layer: measured compute, output and parameter sizes."""

    name: str
    compute_s: float  # forward + backward of one (micro-)batch
    activation_bytes: int  # this layer's output for that batch
    param_bytes: int


@dataclass(frozen=True)
class Plan:
    """A planner's answer: the partition and the times its cost model predicts."""

    partition: Partition
    period_s: float  # the slowest stage or transfer: time per (micro-)batch in steady state
    stage_s: tuple[float, ...]  # T(stage, replicas) per stage
    transfer_s: tuple[float, ...]  # 2·C at each cut (activation forward + gradient back)

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition.to_json(),
            "period_s": self.period_s,
            "stage_s": list(self.stage_s),
            "transfer_s": list(self.transfer_s),
        }


def sync_s(param_bytes: float, replicas: int, bandwidth: float) -> float:
    """W^m: ring all-reduce time of ``param_bytes`` over ``replicas`` at ``bandwidth`` bytes/s."""
    return 0.0 if replicas <= 1 else 2 * (replicas - 1) / replicas * param_bytes / bandwidth


def stage_s(costs: Sequence[LayerCost], i: int, j: int, replicas: int, bandwidth: float) -> float:
    """T(i→j, m) = (1/m)·max(Σ compute, Σ sync) for layers ``i..j-1`` on ``m`` replicas."""
    part = costs[i:j]
    compute = sum(c.compute_s for c in part)
    sync = sync_s(sum(c.param_bytes for c in part), replicas, bandwidth)
    return max(compute, sync) / replicas


def evaluate(costs: Sequence[LayerCost], partition: Partition, bandwidth: float) -> Plan:
    """The cost model's times for any partition (to compare planners on equal terms)."""
    stages = tuple(
        stage_s(costs, a, b, r, bandwidth)
        for (a, b), r in zip(partition.bounds, partition.replicas, strict=True)
    )
    transfers = tuple(2 * costs[b - 1].activation_bytes / bandwidth for _, b in partition.bounds[:-1])
    return Plan(partition, max(stages + transfers), stages, transfers)


def pipedream_plan(
    costs: Sequence[LayerCost], workers: int, bandwidth: float, replicate: bool = True
) -> Plan:
    """PipeDream's DP: layer counts and replicas per stage minimising the pipeline's period.

    Uses exactly ``workers`` ranks. ``replicate=False`` keeps every stage at one replica (then
    stages = workers), for runtimes without replicated stages.
    """
    n = len(costs)
    if replicate:
        check_stage_count(n, 1)
    else:
        check_stage_count(n, workers)
    inf = float("inf")
    # best[j][m]: (period, partition as ((count, replicas), ...)) for layers 0..j-1 on m workers
    best: list[list[tuple[float, tuple[tuple[int, int], ...]]]] = [
        [(inf, ())] * (workers + 1) for _ in range(n + 1)
    ]
    for j in range(1, n + 1):
        for m in range(1, workers + 1):
            if replicate or m == 1:
                best[j][m] = (stage_s(costs, 0, j, m, bandwidth), ((j, m),))
            for i in range(1, j):
                link = 2 * costs[i - 1].activation_bytes / bandwidth
                for last in range(1, m) if replicate else (1,):
                    head, parts = best[i][m - last]
                    value = max(head, link, stage_s(costs, i, j, last, bandwidth))
                    if parts and value < best[j][m][0]:
                        best[j][m] = (value, (*parts, (j - i, last)))
    period, parts = best[n][workers]
    if not parts:
        check_stage_count(n, workers)
    partition = Partition(tuple(c for c, _ in parts), tuple(r for _, r in parts))
    plan = evaluate(costs, partition, bandwidth)
    return Plan(partition, period, plan.stage_s, plan.transfer_s)
