"""What a model's children are, read from their weights: the layers a split can cut by output
rows (Linear, Conv2d) and the trailing run of fully connected children (one Linear each)."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

WeightLayer = nn.Linear | nn.Conv2d


def weight_layers(module: nn.Module) -> Iterator[tuple[str, WeightLayer]]:
    """(name, layer) of every Linear / Conv2d inside ``module``, in order."""
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear | nn.Conv2d):
            yield name, m


def first_weight_layer(module: nn.Module) -> tuple[str, WeightLayer] | None:
    return next(weight_layers(module), None)


def fully_connected(child: nn.Module) -> tuple[str, nn.Linear] | None:
    """(path, layer) when ``child``'s only weights are one nn.Linear's (with activations, dropout or
    a flatten beside it): a layer that can be cut into output rows. None otherwise — a transformer
    block (several Linears, LayerNorms) or a child with a normalisation beside its Linear."""
    found = first_weight_layer(child)
    if found is None or not isinstance(found[1], nn.Linear):
        return None
    own = {id(p) for p in found[1].parameters()}
    if any(id(p) not in own for p in child.parameters()):
        return None
    return found[0], found[1]


def trailing_fc_start(model: nn.Module) -> int:
    """Index of the first child of the trailing run of fully connected children (`fully_connected`);
    the number of children when the last one is not such a layer."""
    children = list(model.children())
    start = len(children)
    while start > 0 and fully_connected(children[start - 1]) is not None:
        start -= 1
    return start
