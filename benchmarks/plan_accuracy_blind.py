"""The planner's blind test: scenarios measured only after the model and its calibration were
frozen, predicted with the numbers `plan_accuracy.py --analyse` fitted (read from
``results/plan_accuracy.json``, never refitted here), and used to fit or choose nothing.

They mix new host counts (3, 6) and NIC rates (250, 500 Mbit/s) with the old ones, on the same three
models, each with allreduce and two other strategies. The runs are `plan_accuracy.py`'s own
(`run_one`: `polytrain testbed`, 12 steps, the mean step after two), 5 repeats interleaved.

    # as root (the testbed), in chunks under the benchmark lock, as plan_accuracy.py:
    .venv/bin/python benchmarks/plan_accuracy_blind.py --repeats 5 \\
        [--budget-min 28 --resume] --no-analyse
    .venv/bin/python benchmarks/plan_accuracy_blind.py --analyse   # → results/plan_accuracy_blind.md

``--set 2`` ... ``--set 11`` measure and analyse the second to eleventh blind sets (`BLIND2` ...
`BLIND11`, → results/plan_accuracy_blind2.md ... blind11.md; sets 5 to 11 with the second to sixth
passes' fits, `FROZEN_OF`; a fit whose compute scale, executor time or time per pass was measured by
its pass's probes is priced with the set's own probes, one whose time per collective step
`plan_hops.py` measured with the set's own measurement, `HOPS_OF` or ``--hops-from``; sets 10 and
11 were drawn by `plan_accuracy_draw.py`);
``--frozen FILE --name NAME`` analyses with the fit of another `plan_accuracy` analysis.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

import plan_accuracy as pa
from harness import add_common_flags, hold_lock, write_results
from plan_accuracy_model import (
    PIPE_PROBES,
    PS_PROBES,
    SPLIT,
    STEP_PROBES,
    add_display_columns,
    merge_repeats,
    predict,
    probe_action_overheads,
    probe_pass_overheads,
    probe_ps_requests,
    probe_scales,
    recommended_hits,
    stats,
)
from plan_accuracy_traces import write_executor
from plan_hops import testbed_hops

# (model, hosts, nic, [(strategy, --set options)][, batch]), fixed before any of them was measured
BLIND: list[tuple[Any, ...]] = [  # a 5th item: the global batch, where the default does not divide
    ("cnn", 3, "500mbit", [("allreduce", {}), ("ps", {"servers": 1}), ("gpipe", {"microbatches": 4})], 48),
    ("cnn", 6, "250mbit", [("allreduce", {}), ("local-sgd", {"period": 4}), ("ps", {"servers": 2})], 48),
    ("cnn", 2, "1gbit", [("allreduce", {}), ("1f1b", {"microbatches": 4}), ("layerwise", {})]),
    ("cnn", 8, "100mbit", [("allreduce", {}), ("ps", {"servers": 4}), ("owt", {})]),
    ("vgg16", 3, "500mbit", [("allreduce", {}), ("owt", {}), ("gpipe", {"microbatches": 4})], 48),
    ("vgg16", 6, "1gbit", [("allreduce", {}), ("owt", {}), ("mesh", {"dp": 3, "pp": 2})], 48),
    ("vgg16", 8, "250mbit", [("allreduce", {}), ("owt", {}), ("mesh", {"dp": 4, "pp": 2})]),
    ("vgg16", 2, "500mbit", [("allreduce", {}), ("pipedream", {}), ("1f1b", {"microbatches": 4})]),
    ("gpt-mini", 3, "500mbit",
     [("allreduce", {}), ("ps", {"servers": 1}), ("gpipe", {"microbatches": 4})], 24),
    ("gpt-mini", 2, "100mbit", [("allreduce", {}), ("tensor", {}), ("1f1b", {"microbatches": 4})]),
    ("gpt-mini", 8, "1gbit", [("allreduce", {}), ("local-sgd", {"period": 4}), ("mesh", {"dp": 4, "tp": 2})]),
    ("gpt-mini", 6, "250mbit", [("allreduce", {}), ("mesh", {"dp": 3, "tp": 2}), ("ps", {"servers": 2})], 24),
]
# The second blind set, fixed (and committed) before any of it was measured: new host counts (4, 5, 7)
# and NIC rates (200, 400, 750 Mbit/s); measured while the planner's model was being changed, and
# not looked at until that model and its calibration were committed.
BLIND2: list[tuple[Any, ...]] = [
    ("cnn", 5, "200mbit", [("allreduce", {}), ("ps", {"servers": 1}), ("local-sgd", {"period": 2})], 40),
    ("cnn", 7, "750mbit", [("allreduce", {}), ("owt", {}), ("ps", {"servers": 3})], 56),
    ("cnn", 4, "400mbit", [("allreduce", {}), ("gpipe", {"microbatches": 8}), ("pipedream", {})]),
    ("cnn", 3, "100mbit", [("allreduce", {}), ("layerwise", {}), ("1f1b", {"microbatches": 4})], 48),
    ("vgg16", 5, "750mbit", [("allreduce", {}), ("owt", {}), ("ps", {"servers": 1})], 40),
    ("vgg16", 4, "200mbit", [("allreduce", {}), ("mesh", {"dp": 2, "pp": 2}), ("1f1b", {"microbatches": 4})]),
    ("vgg16", 7, "1gbit", [("allreduce", {}), ("owt", {}), ("local-sgd", {"period": 4})], 56),
    ("vgg16", 3, "400mbit", [("allreduce", {}), ("pipedream", {}), ("layerwise", {})], 48),
    ("gpt-mini", 5, "400mbit", [("allreduce", {}), ("ps", {"servers": 1}), ("local-sgd", {"period": 2})], 40),
    ("gpt-mini", 4, "750mbit",
     [("allreduce", {}), ("mesh", {"dp": 2, "tp": 2}), ("gpipe", {"microbatches": 4})]),
    ("gpt-mini", 7, "200mbit", [("allreduce", {}), ("ps", {"servers": 3}), ("local-sgd", {"period": 4})], 28),
    ("gpt-mini", 2, "750mbit", [("allreduce", {}), ("tensor", {}), ("pipedream", {})]),
]
# The third blind set, fixed (and committed) before any of it was measured: new NIC rates (150, 300,
# 600 Mbit/s), more parameter-server pairs (the model's parameter-server phases changed after the
# second set), every host count from 2 to 8 but 7.
BLIND3: list[tuple[Any, ...]] = [
    ("cnn", 6, "300mbit", [("allreduce", {}), ("ps", {"servers": 2}), ("owt", {})], 48),
    ("cnn", 4, "600mbit", [("allreduce", {}), ("ps", {"servers": 1}), ("1f1b", {"microbatches": 4})], 48),
    ("cnn", 8, "150mbit", [("allreduce", {}), ("local-sgd", {"period": 2}), ("ps", {"servers": 2})], 48),
    ("cnn", 2, "300mbit", [("allreduce", {}), ("gpipe", {"microbatches": 8}), ("layerwise", {})]),
    ("vgg16", 4, "150mbit", [("allreduce", {}), ("owt", {}), ("ps", {"servers": 1})], 48),
    ("vgg16", 6, "600mbit",
     [("allreduce", {}), ("local-sgd", {"period": 2}), ("mesh", {"dp": 3, "pp": 2})], 48),
    ("vgg16", 5, "300mbit", [("allreduce", {}), ("owt", {}), ("gpipe", {"microbatches": 4})], 40),
    ("vgg16", 2, "150mbit", [("allreduce", {}), ("1f1b", {"microbatches": 8}), ("pipedream", {})]),
    ("gpt-mini", 6, "600mbit", [("allreduce", {}), ("ps", {"servers": 2}), ("mesh", {"dp": 3, "tp": 2})], 24),
    ("gpt-mini", 4, "300mbit", [("allreduce", {}), ("ps", {"servers": 1}), ("local-sgd", {"period": 4})], 24),
    ("gpt-mini", 8, "600mbit",
     [("allreduce", {}), ("mesh", {"dp": 4, "pp": 2}), ("local-sgd", {"period": 2})]),
    ("gpt-mini", 3, "150mbit", [("allreduce", {}), ("ps", {"servers": 1}), ("tensor", {})], 24),
]
# The fourth blind set, fixed (and committed) before any of it was measured, a short one (6
# scenarios) for the model kept after the third: NIC rates 350 and 800 Mbit/s.
BLIND4: list[tuple[Any, ...]] = [
    ("cnn", 5, "350mbit", [("allreduce", {}), ("ps", {"servers": 1}), ("local-sgd", {"period": 2})], 40),
    ("cnn", 3, "800mbit", [("allreduce", {}), ("gpipe", {"microbatches": 4}), ("owt", {})], 48),
    ("vgg16", 3, "350mbit", [("allreduce", {}), ("owt", {}), ("1f1b", {"microbatches": 4})], 48),
    ("vgg16", 8, "800mbit", [("allreduce", {}), ("mesh", {"dp": 4, "pp": 2}), ("ps", {"servers": 4})]),
    ("gpt-mini", 5, "800mbit",
     [("allreduce", {}), ("ps", {"servers": 1}), ("local-sgd", {"period": 4})], 40),
    ("gpt-mini", 4, "350mbit", [("allreduce", {}), ("mesh", {"dp": 2, "tp": 2}), ("pipedream", {})]),
]
# The fifth blind set, fixed (and committed) before any of it was measured, for the model unchanged
# since the third set and the fit of the second pass of plan_accuracy.py (plan_accuracy_1129.json,
# measured in the same state of the machine): NIC rates 120, 450 and 900 Mbit/s.
BLIND5: list[tuple[Any, ...]] = [
    ("cnn", 6, "450mbit", [("allreduce", {}), ("ps", {"servers": 2}), ("local-sgd", {"period": 2})], 48),
    ("cnn", 2, "900mbit", [("allreduce", {}), ("gpipe", {"microbatches": 4}), ("layerwise", {})]),
    ("vgg16", 4, "900mbit", [("allreduce", {}), ("owt", {}), ("mesh", {"dp": 2, "pp": 2})]),
    ("vgg16", 3, "120mbit", [("allreduce", {}), ("owt", {}), ("pipedream", {})], 48),
    ("gpt-mini", 8, "450mbit", [("allreduce", {}), ("ps", {"servers": 2}), ("mesh", {"dp": 4, "tp": 2})], 48),
    ("gpt-mini", 2, "120mbit", [("allreduce", {}), ("tensor", {}), ("gpipe", {"microbatches": 4})]),
]
# The sixth blind set, fixed (and committed) before any of it or the pass it is priced with was
# measured: the third pass of plan_accuracy.py (plan_accuracy_1129b: a profile of every model before
# each repeat round, priced with their median) fits the numbers; NIC rates 175, 550 and 700 Mbit/s.
BLIND6: list[tuple[Any, ...]] = [
    ("cnn", 4, "700mbit", [("allreduce", {}), ("ps", {"servers": 2}), ("owt", {})]),
    ("cnn", 7, "175mbit", [("allreduce", {}), ("local-sgd", {"period": 4}), ("ps", {"servers": 1})], 42),
    ("vgg16", 2, "550mbit", [("allreduce", {}), ("gpipe", {"microbatches": 4}), ("layerwise", {})]),
    ("vgg16", 6, "175mbit", [("allreduce", {}), ("owt", {}), ("mesh", {"dp": 3, "pp": 2})], 48),
    ("gpt-mini", 3, "700mbit",
     [("allreduce", {}), ("local-sgd", {"period": 2}), ("pipedream", {})], 24),
    ("gpt-mini", 4, "550mbit",
     [("allreduce", {}), ("ps", {"servers": 1}), ("1f1b", {"microbatches": 4})], 48),
]
# The seventh blind set, fixed (and committed) before any of it or the pass it is priced with was
# measured: the fourth pass of plan_accuracy.py (plan_accuracy_1129c: besides a profile, a probe job
# of every model before each repeat round, whose trace measures the compute scale per model) fits the
# other numbers, and this set's own probes measure its compute scales; NIC rates 225, 650, 850 Mbit/s.
BLIND7: list[tuple[Any, ...]] = [
    ("cnn", 5, "650mbit", [("allreduce", {}), ("owt", {}), ("ps", {"servers": 1})], 40),
    ("cnn", 3, "225mbit",
     [("allreduce", {}), ("1f1b", {"microbatches": 4}), ("local-sgd", {"period": 2})], 48),
    ("vgg16", 7, "850mbit", [("allreduce", {}), ("owt", {}), ("local-sgd", {"period": 2})], 56),
    ("vgg16", 4, "225mbit",
     [("allreduce", {}), ("mesh", {"dp": 2, "pp": 2}), ("gpipe", {"microbatches": 4})]),
    ("gpt-mini", 6, "650mbit",
     [("allreduce", {}), ("mesh", {"dp": 3, "tp": 2}), ("local-sgd", {"period": 4})], 24),
    ("gpt-mini", 2, "850mbit", [("allreduce", {}), ("tensor", {}), ("gpipe", {"microbatches": 4})]),
]
# The eighth blind set, fixed (and committed) before any of it was measured and before the model it
# is priced with was final: the fourth pass's calibration half (plan_accuracy_1129c) fits the numbers
# the probes do not measure; each model's forward and backward scales are measured apart by this
# set's own compute probes, beside which a pipeline probe per model runs (`plan_accuracy_runs.PROBES`);
# eight scenarios, NIC rates 150, 400 and 750 Mbit/s.
BLIND8: list[tuple[Any, ...]] = [
    ("cnn", 6, "750mbit", [("allreduce", {}), ("owt", {}), ("local-sgd", {"period": 2})], 48),
    ("cnn", 4, "150mbit", [("allreduce", {}), ("ps", {"servers": 1}), ("gpipe", {"microbatches": 4})], 48),
    ("cnn", 2, "400mbit", [("allreduce", {}), ("1f1b", {"microbatches": 4}), ("layerwise", {})], 32),
    ("vgg16", 5, "400mbit", [("allreduce", {}), ("owt", {}), ("ps", {"servers": 1})], 40),
    ("vgg16", 2, "150mbit", [("allreduce", {}), ("pipedream", {}), ("gpipe", {"microbatches": 2})]),
    ("vgg16", 6, "750mbit",
     [("allreduce", {}), ("mesh", {"dp": 3, "pp": 2}), ("local-sgd", {"period": 4})], 48),
    ("gpt-mini", 4, "750mbit", [("allreduce", {}), ("tensor", {}), ("1f1b", {"microbatches": 4})]),
    ("gpt-mini", 3, "400mbit", [("allreduce", {}), ("ps", {"servers": 1}), ("layerwise", {})], 24),
]
# The ninth blind set, fixed (and committed) before any of it was measured and before the fifth pass
# it is priced with (plan_accuracy_raw_1129d, its last repeat round measured beside this commit) was
# analysed: the fifth pass's calibration half fits the numbers, the pipeline executor's time per
# action is measured by the pipeline probes (`plan_accuracy_model.probe_action_overheads`), and this
# set's own probes measure its compute scales and its executor time. Drawn, not chosen: random.Random(9);
# per scenario the model (cnn, vgg16, gpt-mini in turn for the first six, then drawn), hosts 2-8, a
# NIC rate of 300, 550 or 900 Mbit/s (rates no pass or set has used), the model's default batch cut
# to a multiple of the hosts, and beside allreduce the first two strategies of a shuffled list that
# the strategy's own check accepts (owt, ps, local-sgd period 2 or 4, gpipe, 1f1b, pipedream,
# layerwise, tensor, mesh dp×pp or dp×tp, as the model allows).
BLIND9: list[tuple[Any, ...]] = [
    ("cnn", 5, "900mbit", [("allreduce", {}), ("local-sgd", {"period": 4}), ("layerwise", {})], 40),
    ("vgg16", 6, "300mbit", [("allreduce", {}), ("layerwise", {}), ("gpipe", {"microbatches": 4})], 48),
    ("gpt-mini", 3, "300mbit",
     [("allreduce", {}), ("1f1b", {"microbatches": 4}), ("local-sgd", {"period": 2})], 24),
    ("cnn", 8, "900mbit", [("allreduce", {}), ("layerwise", {}), ("owt", {})], 64),
    ("vgg16", 3, "550mbit", [("allreduce", {}), ("local-sgd", {"period": 2}), ("layerwise", {})], 48),
    ("gpt-mini", 5, "550mbit", [("allreduce", {}), ("layerwise", {}), ("local-sgd", {"period": 4})], 20),
    ("cnn", 4, "300mbit", [("allreduce", {}), ("local-sgd", {"period": 4}), ("layerwise", {})], 64),
    ("gpt-mini", 3, "550mbit",
     [("allreduce", {}), ("local-sgd", {"period": 4}), ("gpipe", {"microbatches": 4})], 24),
]
# The tenth blind set, drawn (`plan_accuracy_draw.py --seed 10 --rates 275mbit,625mbit,950mbit`, rates
# no pass or set has used) and committed before any of it was measured and before the sixth pass it
# is priced with (plan_accuracy_raw_1129e, still being measured) was analysed: that pass's calibration
# half fits the numbers; its probes measure the compute scales, the executor's time per action and
# (step probes) the runtimes' time per pass; this set's own probes measure them for its pricing.
BLIND10: list[tuple[Any, ...]] = [
    ("cnn", 6, "275mbit",
     [("allreduce", {}), ("mesh", {"dp": 3, "pp": 2}), ("local-sgd", {"period": 4})], 48),
    ("vgg16", 4, "275mbit",
     [("allreduce", {}), ("mesh", {"dp": 2, "pp": 2}), ("gpipe", {"microbatches": 4})], 64),
    ("gpt-mini", 4, "950mbit", [("allreduce", {}), ("layerwise", {}), ("mesh", {"dp": 2, "tp": 2})], 32),
    ("cnn", 6, "625mbit",
     [("allreduce", {}), ("mesh", {"dp": 3, "pp": 2}), ("local-sgd", {"period": 2})], 48),
    ("vgg16", 7, "950mbit", [("allreduce", {}), ("pipedream", {}), ("local-sgd", {"period": 4})], 56),
    ("gpt-mini", 8, "275mbit",
     [("allreduce", {}), ("local-sgd", {"period": 4}), ("mesh", {"dp": 4, "tp": 2})], 32),
    ("cnn", 5, "950mbit", [("allreduce", {}), ("ps", {"servers": 1}), ("owt", {})], 40),
    ("vgg16", 5, "625mbit",
     [("allreduce", {}), ("local-sgd", {"period": 2}), ("gpipe", {"microbatches": 4})], 40),
]
# The eleventh blind set, drawn (`plan_accuracy_draw.py --seed 11 --rates 325mbit,675mbit,875mbit`,
# rates no pass or set has used) and committed before any of it was measured: priced with the fit of
# the sixth pass's calibration half analysed with the time per collective step (`Cluster.hop_s`) that
# `plan_hops.py` measured just before this set ran (`HOPS_OF`); this set's own probes measure the
# compute scales, the executor's time per action and the runtimes' time per pass for its pricing.
BLIND11: list[tuple[Any, ...]] = [
    ("cnn", 5, "875mbit", [("allreduce", {}), ("owt", {}), ("local-sgd", {"period": 4})], 40),
    ("vgg16", 7, "875mbit", [("allreduce", {}), ("1f1b", {"microbatches": 4}), ("layerwise", {})], 56),
    ("gpt-mini", 6, "675mbit",
     [("allreduce", {}), ("mesh", {"dp": 3, "pp": 2}), ("local-sgd", {"period": 4})], 24),
    ("cnn", 3, "875mbit", [("allreduce", {}), ("pipedream", {}), ("owt", {})], 48),
    ("vgg16", 7, "675mbit", [("allreduce", {}), ("1f1b", {"microbatches": 4}), ("layerwise", {})], 56),
    ("gpt-mini", 7, "675mbit", [("allreduce", {}), ("local-sgd", {"period": 4})], 28),
    ("vgg16", 2, "675mbit",
     [("allreduce", {}), ("gpipe", {"microbatches": 4}), ("local-sgd", {"period": 4})], 64),
    ("vgg16", 5, "875mbit", [("allreduce", {}), ("gpipe", {"microbatches": 4}), ("pipedream", {})], 40),
]
# The twelfth set: plan_accuracy.py's held-back half (its scenarios 1, 3, 5, 7, 9, 11, as they stand)
# measured afresh, priced with the fit of the seventh pass's calibration half analysed with the model
# of 2026-11-30 (gloo's ring-only all-reduce, the executor's time per neighbour, a parameter server's
# time per request; `plan_accuracy_1129f_1130`), the time per collective step `plan_hops.py` measured
# just before (`HOPS_OF`) and this set's own probes.
BLIND12: list[tuple[Any, ...]] = [pa.SCENARIOS[i] for i in (1, 3, 5, 7, 9, 11)]
# the thirteenth: the same held-back half measured afresh again, priced with the seventh pass's fit
# under the model of 2026-11-30 03:20 (owt's backward as its runtime sends it; parameter servers'
# time per request from plan_ps_requests.py's table by workers)
BLIND13: list[tuple[Any, ...]] = list(BLIND12)
# the fourteenth: the same half again, priced with the seventh pass's fit under the model of
# 2026-11-30 05:00 (a waiting pipeline stage's wake-up, from plan_hops' shift cases)
BLIND14: list[tuple[Any, ...]] = list(BLIND12)
# the fifteenth: the same half again, priced with the seventh pass's fit under the model of
# 2026-11-30 07:00 (the wake-up paid only by a message that shared the wire with another)
BLIND15: list[tuple[Any, ...]] = list(BLIND12)
SETS = {  # --set: scenarios, raw runs, results name
    1: (BLIND, pa.HERE / "results" / "plan_accuracy_blind_raw.json", "plan_accuracy_blind"),
    2: (BLIND2, pa.HERE / "results" / "plan_accuracy_blind2_raw.json", "plan_accuracy_blind2"),
    3: (BLIND3, pa.HERE / "results" / "plan_accuracy_blind3_raw.json", "plan_accuracy_blind3"),
    4: (BLIND4, pa.HERE / "results" / "plan_accuracy_blind4_raw.json", "plan_accuracy_blind4"),
    5: (BLIND5, pa.HERE / "results" / "plan_accuracy_blind5_raw.json", "plan_accuracy_blind5"),
    6: (BLIND6, pa.HERE / "results" / "plan_accuracy_blind6_raw.json", "plan_accuracy_blind6"),
    7: (BLIND7, pa.HERE / "results" / "plan_accuracy_blind7_raw.json", "plan_accuracy_blind7"),
    8: (BLIND8, pa.HERE / "results" / "plan_accuracy_blind8_raw.json", "plan_accuracy_blind8"),
    9: (BLIND9, pa.HERE / "results" / "plan_accuracy_blind9_raw.json", "plan_accuracy_blind9"),
    10: (BLIND10, pa.HERE / "results" / "plan_accuracy_blind10_raw.json", "plan_accuracy_blind10"),
    11: (BLIND11, pa.HERE / "results" / "plan_accuracy_blind11_raw.json", "plan_accuracy_blind11"),
    12: (BLIND12, pa.HERE / "results" / "plan_accuracy_blind12_raw.json", "plan_accuracy_blind12"),
    13: (BLIND13, pa.HERE / "results" / "plan_accuracy_blind13_raw.json", "plan_accuracy_blind13"),
    14: (BLIND14, pa.HERE / "results" / "plan_accuracy_blind14_raw.json", "plan_accuracy_blind14"),
    15: (BLIND15, pa.HERE / "results" / "plan_accuracy_blind15_raw.json", "plan_accuracy_blind15"),
}
FROZEN = pa.HERE / "results" / "plan_accuracy.json"  # the first pass's fit: sets 1-4 were frozen against it
FROZEN_OF = {  # the second pass's fit (set 5), the third's (set 6), the fourth's (set 7)
    5: pa.HERE / "results" / "plan_accuracy_1129.json",
    6: pa.HERE / "results" / "plan_accuracy_1129b.json",
    7: pa.HERE / "results" / "plan_accuracy_1129c.json",
    8: pa.HERE / "results" / "plan_accuracy_1129c_split.json",  # the fourth pass, forward and backward apart
    9: pa.HERE / "results" / "plan_accuracy_1129d_actions.json",  # the fifth, executor time from its probes
    10: pa.HERE / "results" / "plan_accuracy_1129e.json",  # the sixth, time per pass from its step probes
    11: pa.HERE / "results" / "plan_accuracy_1129e_hops.json",  # the sixth, with measured collective steps
    12: pa.HERE / "results" / "plan_accuracy_1129f_1130.json",  # the seventh, the model of 2026-11-30
    13: pa.HERE / "results" / "plan_accuracy_1129f_1130b.json",  # the seventh, request times by workers
    14: pa.HERE / "results" / "plan_accuracy_1129f_1130d.json",  # the seventh, waiting stages woken late
    15: pa.HERE / "results" / "plan_accuracy_1129f_1130e.json",  # the seventh, woken late when crowded
}
HOPS_OF = {  # measured just before the set ran
    11: pa.HERE / "results" / "plan_hops_1129.json",
    12: pa.HERE / "results" / "plan_hops_1130.json",
    13: pa.HERE / "results" / "plan_hops_1130c.json",
    14: pa.HERE / "results" / "plan_hops_14.json",  # --bytes 4096,32768,262144: it needs shift cases
    15: pa.HERE / "results" / "plan_hops_15.json",
}


def analyse(raw: dict[str, Any], name: str = "plan_accuracy_blind", frozen_file: Path = FROZEN,
            hops_file: Path | None = None) -> None:
    frozen = json.loads(frozen_file.read_text())["summary"]
    c = frozen["calibration"]
    rows = merge_repeats(raw["runs"])
    failed = [r for r in raw["runs"] if "measured_step_s" not in r]
    os.environ["POLYTRAIN_CACHE"] = str(pa.PROFILES)
    profiles = pa.stored_profiles(raw)
    # a fit whose compute scale its pass's probes measured: this set's own probes measure it
    source = c.get("compute_scale_from")
    scale = c["compute_scale"]
    if source in ("probes", SPLIT):
        scale = probe_scales(raw, profiles, split=source == SPLIT)
    # and a fit whose executor time per action its pipeline probes measured: this set's own measure it
    actions = c["action_overhead_s"]
    if c.get("action_overhead_from") == PIPE_PROBES:
        actions = probe_action_overheads(raw)
    # and a fit whose runtimes' time per pass its step probes measured: this set's own measure it
    passes = c["pass_overhead_s"]
    if c.get("pass_overhead_from") == STEP_PROBES:
        passes = probe_pass_overheads(raw)
    # and a fit whose time per collective step plan_hops measured: the measurement before this set
    hop = c.get("hop_s", 0.0)
    if c.get("hop_from"):
        if hops_file is None:
            raise SystemExit(f"{frozen_file.name} prices collective steps measured by plan_hops.py: "
                             "give this set's own measurement with --hops-from FILE")
        # a fit that priced a waiting stage's wake-up (three figures) takes the set's own too
        wake = isinstance(hop, list) and len(hop) == 3
        hop = testbed_hops(json.loads(hops_file.read_text()), wake)
    # and a fit whose parameter server's time per request its ps probes measured: this set's own
    # probes measure it, priced with the rest of the frozen fit
    requests = c.get("ps_request_s") or {}
    params = (scale, c["extra_alpha_s"], c["cores_per_host"], actions, passes, c.get("call_s", 0.0))
    if c.get("ps_request_from") == PS_PROBES:
        requests = probe_ps_requests(raw, profiles, params, hop)
    predict(rows, profiles, *params, hop, requests)
    add_display_columns(rows)
    hits, total, lines = recommended_hits(rows, {r["scenario"] for r in rows})
    executor = write_executor(raw, name)  # the executor's own time per action, from the traces
    summary = {
        "executor_time": executor,
        "frozen_calibration": c,
        "frozen_fit_commit": frozen["git_commit"],
        "frozen_fit_file": frozen_file.name,
        "compute_scale": scale,
        "action_overhead_s": actions,
        "pass_overhead_s": passes,
        "hop_s": hop,
        "hop_from": hops_file.name if c.get("hop_from") and hops_file else None,
        "ps_request_s": requests,
        "blind": stats([r["error"] for r in rows]),
        "median_signed_error": statistics.median(r["error"] for r in rows),
        "recommended_is_fastest": f"{hits}/{total}",
        "runs": sum(r["repeats"] for r in rows),
        "repeats_min_max": [min(r["repeats"] for r in rows), max(r["repeats"] for r in rows)],
        "runs_commit": raw.get("commit"),
        "failed_runs": failed,
    }
    cols = ["scenario", "model", "hosts", "nic", "strategy", "opts", "measured_ms", "measured_min_ms",
            "measured_max_ms", "repeats", "predicted_ms", "error_%", "load_start"]
    notes = "\n".join([f"Summary: {json.dumps(summary)}", "", *lines])
    write_results(name, [{k: r.get(k) for k in [*cols, "repeat_step_s"]} for r in rows],
                  cols, notes, extra={"summary": summary})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--analyse", action="store_true", help="only recompute from the saved raw runs")
    p.add_argument("--resume", action="store_true", help="keep and skip the runs already saved")
    p.add_argument("--no-analyse", action="store_true", help="measure only (a chunk); analyse later")
    p.add_argument("--budget-min", type=float, default=math.inf)
    p.add_argument("--set", type=int, choices=sorted(SETS), default=1, help="which blind set")
    p.add_argument("--frozen", type=Path, help="analyse with the fit stored in this plan_accuracy "
                   "analysis (default: the set's, results/plan_accuracy.json but for set 5)")
    p.add_argument("--name", help="results file name of the analysis (default: the set's)")
    p.add_argument("--hops-from", type=Path, help="analyse: this set's plan_hops.py measurement "
                   "(default: the set's, HOPS_OF)")
    add_common_flags(p)
    a = p.parse_args()
    hold_lock(a.lock)
    scenarios, raw, name = SETS[a.set]
    if not a.analyse:
        pa.measure(a.steps, None, a.repeats, a.resume, 60 * a.budget_min, scenarios, raw)
        if a.no_analyse:
            return
    analyse(json.loads(Path(raw).read_text()), a.name or name, a.frozen or FROZEN_OF.get(a.set, FROZEN),
            a.hops_from or HOPS_OF.get(a.set))


if __name__ == "__main__":
    main()
