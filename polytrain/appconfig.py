"""The base of the apps' job descriptions (``polytrain rl``, ``polytrain aco``): one pydantic
model style with one error style.

A job is a frozen pydantic model that refuses unknown options; :meth:`AppConfig.parse` turns a
mapping (CLI flags, Python keywords, a run's saved config) into the model, and every pydantic
refusal into one :class:`~polytrain.errors.ConfigError` line naming the flag, its value and the
rule (:func:`polytrain.errors.validation_parts`, as ``polytrain train``'s :class:`JobConfig`
and the strategies' options). Rules across fields stay with each app (its ``validate``/checks),
and raise ConfigError the same way.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from polytrain.errors import ConfigError, validation_parts


class AppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: how a refusal names the job: "Invalid {JOB}: ..."
    JOB: ClassVar[str] = "job"

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Self:
        """``data`` as this job, or a ConfigError (one line, every problem named)."""
        try:
            return cls(**data)
        except ValidationError as err:
            parts = validation_parts(err, cls.model_fields, "option", flags=True)
            raise ConfigError(f"Invalid {cls.JOB}: " + "; ".join(parts) + ".") from None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (not re-validated: the caller's values are already checked)."""
        return self.model_copy(update=changes)
