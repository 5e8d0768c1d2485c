"""``model.pt`` in the user's own key names: a plain ``state_dict`` that the user's class loads.

Strategies hold a job's model in one of three forms, and their state dicts name its tensors
accordingly; :func:`user_state_dict` maps each back to the names of the module the user built:

- a user module held whole (:class:`~polytrain.models.user.UserModule`): ``0.<name>`` → ``<name>``;
- a module cut into traced segments (``--set split=...``): segment ``k`` names the module's own
  tensors ``k.m.<name>`` (``m`` is the traced root's attribute) → ``<name>``; a weight tied across
  segments (nanoGPT's ``wte``/``lm_head``) appears under both of its names, as in the user's own
  ``state_dict``;
- the zoo's layer lists and a user factory's own ``nn.Sequential``: already the user's names.

Pipeline stages and tensor shards are consolidated by the strategies before this mapping (one
full state on the leader), so every strategy's ``model.pt`` has the same keys as ``single``'s.
``polytrain export RUN [--step N] --out F`` (:func:`export_checkpoint`) writes the same from a
checkpoint taken during the run.
"""

from __future__ import annotations

from typing import Literal

import torch

Form = Literal["layers", "whole", "traced"]
ROOT = "m"


def user_key(key: str, form: Form) -> str:
    """The user's name for one key of the strategy's state dict."""
    if form == "whole":
        return key.removeprefix("0.")
    if form == "traced":
        head, _, rest = key.partition(".")
        if head.isdigit() and rest.startswith(ROOT + "."):
            return rest.removeprefix(ROOT + ".")
    return key


def user_state_dict(state: dict[str, torch.Tensor], form: Form,
                    keys: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """``state`` under the user's own key names (see the module doc); the same tensor named
    twice (a tied weight seen by two segments) is kept once per user name. ``keys``: the user
    module's own keys, in its order (a traced model's segments may hold more)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        out.setdefault(user_key(key, form), value)
    if keys is not None:
        out = {k: out[k] for k in keys if k in out}
    return out
