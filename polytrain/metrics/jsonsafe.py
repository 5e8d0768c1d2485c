"""JSON that parses everywhere: non-finite floats (NaN, inf) become ``null``.

``json.dumps`` writes ``NaN``/``Infinity`` by default, which strict parsers (and ``jq``) refuse.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float, at any depth, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def atomic_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON (non-finite floats as null) by rename: a reader never sees half."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(json_safe(data), indent=1, default=float))
    tmp.replace(path)
