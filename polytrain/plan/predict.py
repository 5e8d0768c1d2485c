"""The prediction every run records beside its measurement (``summary.json`` → ``prediction``).

`predict_run` prices the job as configured — its strategy and options, its world size, this machine
or the testbed it ran on — with the same estimators `polytrain plan` ranks, so each run checks the
cost model. Profiles are cached per (model, options, dataset, batch, optimizer) under
``$POLYTRAIN_CACHE`` (default ``~/.cache/polytrain/profiles``): a job profiles its model once.
Strategies the planner does not model record ``{"modelled": false, "why": ...}``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import polytrain.env as env
from polytrain.config import JobConfig
from polytrain.cost.cluster import Cluster
from polytrain.cost.profile import Profile, measure_profile
from polytrain.cost.scene import Estimate, Scene
from polytrain.plan.calibration import SCHEMA, Calibration, EmulationFile, emulate


def cache_dir() -> Path:
    return Path(os.environ.get(env.CACHE) or Path.home() / ".cache" / "polytrain")


_BASE_PROBE = (
    "import torch, torch.distributed, polytrain.launch.worker, polytrain.runtime.loop\n"
    "import os; print(int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE'))"
)


def process_base_bytes() -> int:
    """Resident bytes of a fresh rank process before its model (torch and polytrain imported),
    measured once in a new interpreter and cached: a process that has trained holds more."""
    path = cache_dir() / "base_memory.json"
    try:
        return int(json.loads(path.read_text())["bytes"])
    except (OSError, ValueError, KeyError):
        pass
    out = subprocess.run([sys.executable, "-c", _BASE_PROBE], capture_output=True, text=True, timeout=120)
    value = int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bytes": value}))
    return value


def cached_profile(cfg: JobConfig, repeats: int = 2) -> Profile:
    key = json.dumps(
        [
            cfg.model,
            cfg.model_options,
            cfg.dataset,
            cfg.data_options,
            cfg.batch_size,
            cfg.optimizer,
            torch.__version__,
        ],
        sort_keys=True,
        default=str,
    )
    path = cache_dir() / "profiles" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if path.is_file():
        try:
            return Profile.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            pass
    threads = torch.get_num_threads()
    try:
        prof = measure_profile(cfg, repeats=repeats)
    finally:
        torch.set_num_threads(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    prof = dataclasses.replace(prof, base_memory_bytes=process_base_bytes() or prof.base_memory_bytes)
    prof.save(tmp)
    tmp.replace(path)
    return prof


def local_collectives() -> str:
    """The all-reduce algorithms of this machine's backend (`Cluster.collectives`): NCCL's choice on
    GPUs, gloo's ring on CPU (`launch.worker.pick_device`)."""
    return "auto" if torch.cuda.is_available() else "ring"


# What share of a testbed link's shaped rate carries payload: its tbf charges every frame's length,
# and a full TCP segment is 1448 payload bytes in a 1514-byte frame (Ethernet 14, IPv4 20, TCP with
# timestamps 32 header bytes; veth MTU 1500). benchmarks/results/testbed_p2p.md measured 512 KiB
# messages at 1.06x the price without it.
TESTBED_GOODPUT = 1448 / 1514


def testbed_hardware(world: int, testbed: dict[str, Any]) -> Cluster:
    """The hardware a testbed describes (its hosts, shaped line rate and latency, loopback-like
    intra links), before what emulating it adds (`testbed_calibration`)."""
    hosts = int(testbed["hosts"])
    latency = float(testbed.get("latency") or 0) * 1e-6  # the testbed records µs
    rate = float(testbed["rate_bits_per_s"]) / 8
    return Cluster(hosts, max(1, world // hosts), rate, 2e9, 1e-4 + latency, 1e-4,
                   collectives=local_collectives())


def testbed_calibration(cores: float | None = None, **emulation: Any) -> Calibration:
    """What the testbed adds to its hardware by construction: every host shares this machine's
    cores, and its tbf shaper (`testbed.hosts.Testbed._shaping`) lets 4 ms of line rate (at least two
    full frames) through after an idle spell and charges whole frames (`TESTBED_GOODPUT`);
    ``emulation``: measured terms added."""
    return Calibration(schema=SCHEMA, source={"what": "the testbed's construction"},
                       emulation=EmulationFile(cores=cores or os.cpu_count() or 1, burst_s=0.004,
                                               min_burst_bytes=3028, goodput=TESTBED_GOODPUT, **emulation))


def run_cluster(world: int, testbed: dict[str, Any] | None) -> Cluster:
    """The testbed the run used (hosts, NIC rate, latency; all hosts share this machine's cores), or
    this machine: one host, ``world`` processes. The testbed's shaped rate and bucket are in frame
    bytes; the cluster's, in payload bytes (`TESTBED_GOODPUT`)."""
    if testbed:
        return testbed_calibration().cluster(testbed_hardware(world, testbed))
    return emulate(Cluster(1, world, 10e9 / 8, 2e9, 1e-4, 1e-4, collectives=local_collectives()),
                   cores=os.cpu_count() or 1)


def run_calibration() -> Calibration:
    """The calibration a testbed job is priced with: the file ``polytrain testbed --calibration``
    gave its hosts, else the testbed's construction (`testbed_calibration`)."""
    path = os.environ.get(env.CALIBRATION)
    return Calibration.load(Path(path)) if path else testbed_calibration()


def run_scene(prof: Profile, batch: int, world: int, testbed: dict[str, Any] | None,
              cal: Calibration | None = None) -> Scene:
    """What a run of ``world`` ranks is priced as: on the testbed's hardware with ``cal`` (default:
    `run_calibration`), or on this machine (`run_cluster`)."""
    if not testbed:
        return Scene(prof, run_cluster(world, None), batch)
    return (cal or run_calibration()).scene(prof, testbed_hardware(world, testbed), batch)


def estimate_for(cfg: JobConfig, world: int, scene: Scene) -> Estimate | str:
    """The estimate of ``cfg``'s strategy with its options on ``world`` ranks (the strategy prices
    itself: `Strategy.price`), or why it has none."""
    from polytrain.strategies import make_strategy

    return make_strategy(cfg.strategy, cfg.options).price(scene, world)


def predict_run(cfg: JobConfig, world: int, testbed: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"step_s", "samples_per_s", "peak_memory_bytes", ...}`` or ``{"modelled": False, "why"}``."""
    from polytrain.strategies import get_strategy_class

    if not get_strategy_class(cfg.strategy).priced():  # before profiling: nothing to measure for it
        return {"modelled": False, "why": f"the planner does not model '{cfg.strategy}' yet"}
    try:
        scene = run_scene(cached_profile(cfg), cfg.batch_size, world, testbed)
        e = estimate_for(cfg, world, scene)
    except Exception as err:  # why: a prediction must never fail the run it describes
        return {"modelled": False, "why": f"{type(err).__name__}: {err}"}
    if isinstance(e, str):
        return {"modelled": False, "why": e}
    return {
        "modelled": True,
        "step_s": e.step_s,
        "samples_per_s": cfg.batch_size / e.step_s,
        "peak_memory_bytes": e.peak_memory_bytes,
        "bytes_per_step": e.bytes_per_step,
        "cluster": scene.cluster.to_json(),
        "calibration": os.environ.get(env.CALIBRATION) if testbed else None,
    }


def record_prediction(run_dir: Path) -> dict[str, Any]:
    """Add the planner's prediction for the job that ran in ``run_dir`` to its summary.json,
    beside the measurement, and return the summary. Only a summary the ranks wrote (a run that
    completed or was interrupted) gets one; a launcher's summary of a failed run does not."""
    from polytrain.launch.records import atomic_json
    from polytrain.launch.rundir import read_summary

    summary = read_summary(run_dir)
    if "per_rank" in summary and "prediction" not in summary:
        cfg = JobConfig.model_validate(summary["config"])
        summary["prediction"] = predict_run(cfg, int(summary["world_size"]), summary.get("testbed"))
        atomic_json(run_dir / "summary.json", summary)
    return summary
