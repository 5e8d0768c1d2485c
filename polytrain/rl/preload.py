"""Imported once by the fork server that starts RL processes (see `polytrain.rl.ranks.start`).

Every process of a run then starts as a fork of a warm interpreter instead of importing torch
anew: on the busy 2-core box, 7 processes importing torch at once took minutes. Nothing here
starts a thread (forking a process with threads is unsafe).
"""

import gymnasium  # noqa: F401
import torch

import polytrain.rl.roles_run  # noqa: F401
from polytrain.rl import actor, apex, dqn, gorila, replay_server  # noqa: F401
from polytrain.strategies.ps import server  # noqa: F401

# The first optimizer imports torch._dynamo (seconds); pay it here, once.
torch.optim.Adam([torch.zeros(1, requires_grad=True)])
