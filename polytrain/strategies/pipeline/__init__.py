"""Pipeline parallelism: schedules as data, one executor, and the strategies built on them.

The schedules themselves are pure data one layer below (``polytrain.schedules``: actions, orders,
the registry, their checks), shared with the planner; ``draw`` here prints them (ASCII grid, PNG,
``polytrain schedule``).
Runtime: ``activations_wire`` (stage messages through ctx.comm), ``executor`` (runs any schedule for
one stage), ``weights`` (flush, weight stashing, weight prediction), ``shell`` (setup, segments, checkpoints,
evaluation), ``planning`` (``--set partition=``), ``metrics`` (measured bubble, per-stage figures).
Strategies: ``gpipe``, ``one_f_one_b`` (``1f1b``), ``pipedream``, ``spectrain``. Partitions, the cut
and the planners live in ``polytrain.models.partition``; the layer profiler in
``polytrain.cost.layer_profile``.
"""
