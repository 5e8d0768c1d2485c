"""Pipeline parallelism: schedules as data, one executor, and the strategies built on them.

Pure data (no torch): ``actions`` (Action, Orders, Grid), ``schedule`` (builders and registry),
``checks`` (validate, simulate, dry_run), ``draw`` (ASCII grid, PNG, ``polytrain schedule``).
Runtime: ``activations_wire`` (stage messages through ctx.comm), ``executor`` (runs any schedule for
one stage), ``weights`` (flush, weight stashing, weight prediction), ``shell`` (setup, segments, checkpoints,
evaluation), ``planning`` (``--set partition=``), ``metrics`` (measured bubble, per-stage figures).
Strategies: ``gpipe``, ``one_f_one_b`` (``1f1b``), ``pipedream``, ``spectrain``. Partitions, the cut
and the planners live in ``polytrain.models.partition``; the profiler in ``polytrain.cost.profile``.
"""
