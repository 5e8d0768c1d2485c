"""``torch.export`` for ``split=``: the whole forward as one ATen graph, cut into segments.

``torch.export.export`` (what ``torch.distributed.pipelining.pipeline()`` traces with) records
the forward on an example batch with the batch dimension dynamic; ``ExportedProgram.module()``
holds the module's own parameters. Each node carries the module path it ran in
(``nn_module_stack``), so a stage starts at the first node run inside the named submodule. What the
cut segments need beyond the FX path (:mod:`polytrain.models.trace`):

- parameters are named by where they are used (nanoGPT's tied ``wte``/``lm_head`` weight is one
  tensor under two names; the output head's segment names it ``lm_head.weight``);
- sizes read from the batch (``sym_size``) are recomputed from the tensor a segment receives,
  and tensors the forward creates (``arange(T, device=...)``) on that tensor's device;
- export records the training-mode ops (``dropout(..., train=True)``, BatchNorm with batch
  statistics and its ``num_batches_tracked += 1``); here they follow the segment's
  ``train()``/``eval()`` instead, and the cut model must compute what the module computes in eval
  mode on the example batch, or export is not used (a forward with its own ``if self.training``).
  A model on the meta device (the launcher's checks) has no values to compare: its cut is the
  structure only, and each rank checks its own.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from polytrain.data import DataSpec
from polytrain.models.trace import Forward, cut_graph

aten = torch.ops.aten
#: aten op -> index of its training flag
MODAL = {aten.dropout.default: 2, aten.feature_dropout.default: 2, aten.alpha_dropout.default: 2,
         aten.feature_alpha_dropout.default: 2, aten.batch_norm.default: 5}


def example_batch(spec: DataSpec, batch: int = 2) -> torch.Tensor:
    """A seeded random batch of inputs shaped as ``spec``'s: token/feature ids within their range,
    standard-normal floats (not zeros, which could hide a difference in the eval check)."""
    gen = torch.Generator().manual_seed(0)
    shape = (batch, *spec.input_shape)
    if spec.input_dtype == "long":
        high = spec.input_range or (spec.num_classes if spec.task == "lm" else 1)
        return torch.randint(0, max(1, high), shape, generator=gen, device="cpu")
    return torch.randn(shape, generator=gen, device="cpu")


class _Modal(nn.Module):
    """An exported op whose training flag is this module's mode."""

    def __init__(self, op: Any, flag: int | None) -> None:
        super().__init__()
        self.op, self.flag = op, flag

    def forward(self, *args: Any) -> Any:
        if self.flag is None:  # BatchNorm's num_batches_tracked += 1
            return self.op(*args) if self.training else args[0]
        a = list(args)
        a[self.flag] = self.training or (self.op is aten.batch_norm.default and a[3] is None)
        return self.op(*a)


class Exported:
    """Hooks :func:`polytrain.models.trace._segment` calls when cutting an exported graph."""

    def __init__(self, root: nn.Module, gm: fx.GraphModule) -> None:
        self.root, self.gm = root, gm
        self.aliases: dict[int, list[str]] = defaultdict(list)
        for name, t in [*root.named_parameters(remove_duplicate=False),
                        *root.named_buffers(remove_duplicate=False)]:
            self.aliases[id(t)].append(name)
        self.attrs: dict[str, Any] = {}
        self.mods: dict[str, nn.Module] = {}

    def name_for(self, attr: fx.Node, user: fx.Node | None) -> str:
        """The name of parameter/buffer ``attr`` under the deepest module that uses it."""
        obj: Any = self.gm
        for part in str(attr.target).split("."):
            obj = getattr(obj, part)
        names = self.aliases.get(id(obj)) or [str(attr.target)]
        stack = [str(p) for p, _ in (user.meta.get("nn_module_stack") or {}).values()] if user else []
        name = next((n for p in reversed(stack) for n in names if n.startswith(p + ".")), names[0])
        self.attrs[name] = obj
        return name

    def copy(self, g: fx.Graph, n: fx.Node, env: Any) -> fx.Node:
        counter = (n.target is aten.add_.Tensor and isinstance(n.args[0], fx.Node)
                   and str(n.args[0].target).endswith("num_batches_tracked"))
        if n.op == "call_function" and (n.target in MODAL or counter):
            name = f"modal_{len(self.mods)}"
            self.mods[name] = _Modal(n.target, None if counter else MODAL[n.target])  # type: ignore[index]
            return g.call_module(name, fx.node.map_arg(n.args, env),  # type: ignore[arg-type]
                                 fx.node.map_arg(n.kwargs, env))  # type: ignore[arg-type]
        new = g.node_copy(n, env)
        if isinstance(new.kwargs.get("device"), torch.device):  # export bakes the example's in
            with g.inserting_before(new):
                device = g.call_function(getattr, (env.x, "device"))
            new.update_kwarg("device", device)
        return new

    def unflatten(self, flat: Any) -> Any:
        """The output node's flat values in the forward's own structure (tuple, dict, ...)."""
        spec = self.gm._out_spec
        return flat if spec is None else pytree.tree_unflatten(list(flat), spec)

    def attributes(self, g: fx.Graph) -> dict[str, Any]:
        table = {**self.attrs, **self.mods}
        return {str(n.target): table[str(n.target)] for n in g.nodes
                if n.op in ("get_attr", "call_module")}


def _logits(out: Any) -> torch.Tensor:
    if isinstance(out, (tuple, list)):
        return _logits(out[0])
    return _logits(out["logits"]) if isinstance(out, dict) else out  # type: ignore[no-any-return]


def split_exported(model: nn.Module, paths: list[str] | None, example: torch.Tensor
                   ) -> nn.Sequential:
    """``model`` exported and cut at ``paths`` (``split=auto`` when None); raises on any failure."""
    from polytrain.models.call import token_inputs

    root = Forward(model, token_inputs(example))
    device = next((p.device for p in model.parameters()), example.device)
    example = example.to(device)
    batch = torch.export.Dim("batch", min=1)
    with warnings.catch_warnings():  # a failed attempt is reported as the fallback's reason
        warnings.simplefilter("ignore")
        gm = torch.export.export(root, (example,), dynamic_shapes=({0: batch},)).module()
    # the loss a targets model computed from placeholder targets is not returned: drop it, so that
    # no cut carries the targets (pure nodes only; in-place buffer updates stay)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    seq = cut_graph(gm, model, paths, Exported(root, gm))  # type: ignore[arg-type]
    if device.type == "meta":  # built without memory for the launcher's checks: no values
        return seq
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        seq.eval()
        with torch.no_grad():
            want, got = root(example), seq(example)
    finally:
        for m, training in modes.items():
            m.train(training)
        seq.train()
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise ValueError("the exported cut computes another output than the module in eval "
                         "mode (a forward that branches on self.training?)")
    return seq
