"""A run's ``summary.json``, typed: one model per app on one base, written and read only here.

Every app (``polytrain train``, ``rl``, ``aco``) ends by writing ``RUN/summary.json``; readers
(``report``, ``export``, ``merge``, the launchers, benchmarks) load it back through
:func:`read_summary`, which validates it and gives attribute access::

    s = read_summary(run_dir, TrainSummary)      # what polytrain.train returns
    s.throughput_samples_per_s, s.eval, s.to_dict()["per_rank"]
    s["throughput_samples_per_s"]                   # reading by key works too (read-only)

The JSON keys and values are those of the plain dicts the apps wrote before the models existed;
each model declares the keys it knows (typed) and keeps any other key a caller adds (the compare's
``time_to_accuracy_s``, rl's ``run_dir``), so a file round-trips key for key. Keys a summary did
not hold stay absent (a launcher's summary of a failed run has fewer keys than rank 0's).

``schema_version`` is written into every file; a file without it is the same shape, written
before the field existed (version 1). A file of another version, or whose fields do not match,
is refused with one line naming the file and the field.
"""

from __future__ import annotations

import json
from collections.abc import ItemsView, KeysView, ValuesView
from pathlib import Path
from typing import Any, Self, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from polytrain.errors import ConfigError
from polytrain.metrics.jsonsafe import atomic_json

SCHEMA_VERSION = 1
FILE = "summary.json"

Json = dict[str, Any]


class RunSummary(BaseModel):
    """What every app's summary holds: the schema version and the job's resolved config; the
    figures common to the apps that have them."""

    model_config = ConfigDict(extra="allow", strict=True)

    schema_version: int = SCHEMA_VERSION
    config: Json | None = None
    wall_s: float | None = None
    bytes_sent: int | None = None
    per_rank: list[Json] | None = None

    @classmethod
    def of(cls, data: Json, source: str = "a run summary") -> Self:
        """Validate ``data`` (``source``: where it came from, for the error)."""
        version = data.get("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise ConfigError(f"{source}: field 'schema_version' is {version!r}; this polytrain reads "
                              f"version {SCHEMA_VERSION}. Fix: re-run the job with this version, or "
                              "read it with the polytrain that wrote it.")
        try:
            return cls.model_validate({**data, "schema_version": SCHEMA_VERSION})
        except ValidationError as err:
            e = err.errors()[0]
            field = ".".join(str(p) for p in e["loc"]) or "(whole file)"
            if e["type"] == "missing":
                raise ConfigError(f"{source} lacks required key '{field}' (a {cls.__name__} has at "
                                  f"least {', '.join(cls.required())}). Fix: re-run the job with this "
                                  "polytrain version to rewrite it.") from None
            got = json.dumps(e.get("input"), default=str)
            got = got if len(got) <= 60 else got[:57] + "..."
            raise ConfigError(f"{source}: field '{field}' is malformed ({e['msg']}; got {got}). "
                              f"Fix: re-run the job to rewrite it.") from None

    @classmethod
    def required(cls) -> list[str]:
        return [name for name, f in cls.model_fields.items() if f.is_required()]

    def to_dict(self) -> Json:
        """The JSON object, key for key as written (absent keys stay absent)."""
        return self.model_dump(exclude_unset=True) | {"schema_version": self.schema_version}

    def write(self, run_dir: Path) -> None:
        """``RUN/summary.json``, by rename (a reader sees the old file or the new one)."""
        atomic_json(run_dir / FILE, self.to_dict())

    # Reading by key, as the JSON object (``s["eval"]["accuracy"]``, ``s.get("eval")``, ``"eval"
    # in s``, ``dict(s)``): code written when ``polytrain.train`` returned the plain dict keeps
    # working. Read-only: ``to_dict()`` gives a dict to edit.
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)

    def keys(self) -> KeysView[str]:
        return self.to_dict().keys()

    def items(self) -> ItemsView[str, Any]:
        return self.to_dict().items()

    def values(self) -> ValuesView[Any]:
        return self.to_dict().values()

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()


class TrainSummary(RunSummary):
    """``polytrain train``'s summary (:func:`polytrain.launch.rundir.build_summary`; the launcher's
    ``write_stopped`` writes the keys up to ``divergence_warnings`` when rank 0 wrote none)."""

    strategy: str
    world_size: int
    steps: int | None = None
    steps_run: int | None = None
    samples: int | None = None
    final_loss: float | None = None
    interrupted: Json | None = None
    stopped: Json | None = None
    divergence_warnings: list[int] = []
    skipped_steps: list[int] = []
    resumes: list[Json] = []
    segments: list[Json] = []
    throughput_samples_per_s: float | None = None
    eval: Json | None = None
    bytes_sent_per_sample: float | None = None
    peak_rss_bytes: int | None = None
    strategy_metrics: Json = {}
    model_call: str | None = None
    testbed: Json | None = None
    prediction: Json | None = None
    backend: str | None = None
    precision: str | None = None
    device: str | None = None
    polytrain_version: str | None = None
    torch_version: str | None = None


class RLSummary(RunSummary):
    """``polytrain rl``'s summary (:func:`polytrain.rl.results.build_summary`)."""

    strategy: str
    algo: str
    env: str
    world_size: int
    env_steps: int
    episodes: int
    learner_updates: int | None = None
    solved: bool | None = None
    stop_reason: str | None = None
    time_to_target_s: float | None = None
    best_mean_return: float | None = None
    final_mean_return: float | None = None
    roles: dict[str, str] = {}
    lost_actors: list[Json] = []
    exits: dict[str, Json] = {}
    resumes: list[Json] = []
    bytes_by_op: dict[str, int] = {}
    interrupted: Json | None = None
    run_dir: str | None = None
    plots: list[str] | None = None


class ACOSummary(RunSummary):
    """``polytrain aco``'s summary (:func:`polytrain.aco.results.build_summary`)."""

    instance: str
    n: int
    variant: str
    procs: int
    best_length: float
    best_tour: list[int]
    optimum: float | None = None
    gap: float | None = None
    iterations: int
    tours: int


S = TypeVar("S", bound=RunSummary)


def read_summary(run_dir: Path, kind: type[S]) -> S:
    """``RUN/summary.json`` as ``kind``; ConfigError (one line naming the file and what is wrong)
    when it is missing, not JSON, from another schema version, or a field is malformed."""
    path = Path(run_dir) / FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{run_dir} has no readable {FILE} ({e}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a JSON object (a run summary); got {type(data).__name__}. "
                          "Fix: re-run the job to rewrite it.")
    return kind.of(data, str(path))
