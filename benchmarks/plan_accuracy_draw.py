"""Draw a blind set for `plan_accuracy_blind.py`: scenarios chosen by a seeded random generator, not by
hand, so a set cannot be picked to suit the model it tests.

    .venv/bin/python benchmarks/plan_accuracy_draw.py --seed 10 --rates 275mbit,625mbit,950mbit

prints the set as a Python literal to paste (and commit) before any of it is measured. Per scenario:
the model (cnn, vgg16, gpt-mini in turn for the first six, then drawn), hosts drawn from 2-8, a NIC
rate drawn from ``--rates``, the batch the largest multiple of 8 x hosts (else 4 x hosts) not above the
model's default, and beside allreduce the first two strategies of a shuffled list that the strategy's
own check accepts for that model, host count and batch (`plan_accuracy_model._config_of`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from plan_accuracy_model import MODELS, _config_of  # noqa: E402

from polytrain.errors import ConfigError  # noqa: E402


def candidates(hosts: int, rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """The strategies a scenario may draw, each with its options (the period drawn)."""
    out: list[tuple[str, dict[str, Any]]] = [
        ("owt", {}), ("ps", {"servers": 1}), ("local-sgd", {"period": rng.choice([2, 4])}),
        ("gpipe", {"microbatches": 4}), ("1f1b", {"microbatches": 4}), ("pipedream", {}),
        ("layerwise", {}), ("tensor", {}),
    ]
    if hosts % 2 == 0 and hosts > 2:
        out += [("mesh", {"dp": hosts // 2, "pp": 2}), ("mesh", {"dp": hosts // 2, "tp": 2})]
    return out


def batch_for(model: str, hosts: int) -> int:
    default = MODELS[model][1]
    for step in (8 * hosts, 4 * hosts):
        if step <= default:
            return default // step * step
    return hosts


def accepted(model: str, strategy: str, hosts: int, options: dict[str, Any], batch: int) -> bool:
    try:
        _config_of(model, strategy, hosts, json.dumps(options, sort_keys=True), batch)
    except (ConfigError, ValueError) as e:
        print(f"  refused: {model} {strategy} {options} on {hosts} hosts: {str(e)[:100]}", file=sys.stderr)
        return False
    return True


def draw(seed: int, rates: list[str], n: int = 8) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    models = ["cnn", "vgg16", "gpt-mini"]
    out: list[tuple[Any, ...]] = []
    for i in range(n):
        model = models[i % 3] if i < 6 else rng.choice(models)
        hosts = rng.randint(2, 8)
        nic = rng.choice(rates)
        batch = batch_for(model, hosts)
        pool = candidates(hosts, rng)
        rng.shuffle(pool)
        chosen = [(s, o) for s, o in pool if accepted(model, s, hosts, o, batch)][:2]
        out.append((model, hosts, nic, [("allreduce", {}), *chosen], batch))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--rates", required=True, help="comma-separated NIC rates, e.g. 275mbit,625mbit")
    p.add_argument("--n", type=int, default=8)
    a = p.parse_args()
    for scenario in draw(a.seed, a.rates.split(","), a.n):
        print(f"    {scenario!r},")


if __name__ == "__main__":
    main()
