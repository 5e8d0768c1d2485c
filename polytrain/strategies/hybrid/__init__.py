"""Hybrid parallelism: ``owt``, ``mesh`` (dp × pp, dp × tp; layouts in :mod:`.layout`), ``ddnn``
(tiers in :mod:`.ddnn_tiers`, network in :mod:`.ddnn_net`) and ``distbelief``."""
