"""Weights tied across pipeline stages (nanoGPT's ``wte``/``lm_head``): one gradient, two copies.

Every rank builds the full model and keeps its stage's slice, so a parameter used by two stages
(the same ``nn.Parameter`` in both slices) exists once per stage, on different ranks. Each copy's
``.grad`` holds only the part of the gradient its own stage's uses produced; the true gradient is
their sum. At the flush the stages that share a parameter all-reduce (sum) its gradient over
their ranks (``tied_allreduce`` bytes), then each takes the same optimizer step from the same
initial value and optimizer state, so the copies stay equal — training equals ``single``, which
holds one tied parameter (as Megatron-LM ties its first and last stage's word embeddings).

With virtual stages (``interleaved-1f1b``, ``looped-bfs``, ``zbv``, ``dualpipev``) the "stages"
are model chunks, several per rank: chunks of one rank share the one ``nn.Parameter`` (their
uses already add into its ``.grad``), and the ranks holding it sum as above.

Only flush schedules can do this (gpipe, 1f1b, zb-h1, the virtual-stage schedules, and the
pipelines inside ``layerwise`` and ``mesh``): ``pipedream``/``spectrain`` update each stage after
every backward on versions the other stage never sees, and ``distbelief`` keeps each stage's
parameters on that stage's servers, so they refuse tied weights before launch (`refuse_ties`). A
replicated stage (``partition=3x2``) with a tie is refused too (its replicas would each add the
same sum).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from polytrain.comm import Comm, GroupComm, new_groups
from polytrain.config import JobConfig
from polytrain.errors import ConfigError


@dataclass(frozen=True)
class Tie:
    """One parameter used by several stages: the stages, its name in each stage's module, and
    its names in the full model (for messages)."""

    stages: tuple[int, ...]
    local: tuple[str, ...]
    names: tuple[str, ...]


def find_ties(full: nn.Module, pieces: Sequence[nn.Module]) -> list[Tie]:
    """The parameters shared by two or more of ``pieces`` (the stages cut from ``full``)."""
    where: dict[int, list[tuple[int, str]]] = {}
    for s, piece in enumerate(pieces):
        seen: set[int] = set()
        for name, p in piece.named_parameters(remove_duplicate=False):
            if id(p) not in seen:
                seen.add(id(p))
                where.setdefault(id(p), []).append((s, name))
    by_id = {id(p): [n for n, q in full.named_parameters(remove_duplicate=False) if q is p]
             for p in full.parameters()}
    return [Tie(tuple(s for s, _ in uses), tuple(n for _, n in uses), tuple(by_id.get(pid, [])))
            for pid, uses in where.items() if len(uses) > 1]


class TiedGrads:
    """This rank's tied parameters and the groups that sum their gradients at the flush.

    ``all_pipelines[q][s]``: the global rank holding stage ``s`` of pipeline ``q``; ``stages``:
    the stage (or the chunks, with virtual stages) this rank holds. Chunks of one rank that share
    a parameter share the very ``nn.Parameter`` (the rank cut them from one model), so its
    ``.grad`` already sums their uses; only the ranks holding a tied parameter sum over a group,
    one member per rank. Collective: every rank of the job calls it with the same ties and
    ``all_pipelines`` (every pipeline's stage ranks, for ``mesh`` several), since creating a
    process group is.
    """

    def __init__(self, comm: Comm, module: nn.Module, ties: list[Tie],
                 all_pipelines: Sequence[Sequence[int]], stages: int | Collection[int]) -> None:
        self.ties: list[tuple[nn.Parameter, GroupComm]] = []
        held = {stages} if isinstance(stages, int) else set(stages)
        params = dict(module.named_parameters(remove_duplicate=False))
        for tie in ties:
            groups = [sorted({ranks[s] for s in tie.stages}) for ranks in all_pipelines]
            if all(len(g) == 1 for g in groups):
                continue  # every use on one rank: one Parameter, nothing to sum
            covered = {r for g in groups for r in g}
            singles = [[r] for r in range(comm.world) if r not in covered]
            group = new_groups(comm, groups + singles)
            mine = [i for i, s in enumerate(tie.stages) if s in held]
            if mine:
                self.ties.append((params[tie.local[mine[0]]], group))

    def __bool__(self) -> bool:
        return bool(self.ties)

    def sum_gradients(self) -> None:
        """Each tied parameter's gradient summed over the stages that use it."""
        for p, group in self.ties:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            group.all_reduce(p.grad, op="tied_allreduce")


def check_no_replicated_ties(ties: list[Tie], replicas: Sequence[int]) -> None:
    for tie in ties:
        rep = [s for s in tie.stages if replicas[s] > 1]
        if rep:
            raise ConfigError(
                f"Tied weights {' = '.join(tie.names)} are used by stages {list(tie.stages)}, and "
                f"stage {rep[0]} is replicated ({replicas[rep[0]]} ranks). Rule: a tie across stages "
                "needs one rank per tied stage. Fix: an unreplicated partition, or untie them.")


def refuse_ties(model: nn.Module | None, cfg: JobConfig, strategy: str, why: str) -> None:
    """Before launch: ``strategy`` cannot keep weights tied across stages (``why``). ``model``:
    the job's model on the meta device (None: a factory that cannot build there; ranks check)."""
    if model is None:
        return
    pieces = list(model.children()) if isinstance(model, nn.Sequential) else [model]
    tied = [" = ".join(t.names) for t in find_ties(model, pieces)]
    if tied:
        split = cfg.model_options.get("split")
        raise ConfigError(
            f"Strategy '{strategy}'{f' with split={split}' if split else ''}: the tied weights "
            f"{'; '.join(tied)} are used by two layers that may sit on two stages, and {why}, so "
            "their copies would drift apart. Fix: --strategy gpipe or 1f1b (they sum a tied "
            "gradient over its stages at the flush), untie them, or a data-parallel strategy.")
