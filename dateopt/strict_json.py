"""Strict JSON for logs and results: JSON has no NaN or infinity, so they are written as null.

Example:
  >>> from dateopt import strict_json
  >>> strict_json.line({"step": 10, "loss": float("nan")})
  '{"step": 10, "loss": null}\\n'
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping


def sanitize(value: Any) -> Any:
  """`value` with every non-finite float (in dicts, lists and tuples too) as None."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, Mapping):
    return {k: sanitize(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [sanitize(v) for v in value]
  return value


def line(row: Mapping[str, Any]) -> str:
  """One JSON Lines row: `row` sanitized, strict (no NaN/Infinity tokens), newline-ended."""
  return json.dumps(sanitize(row), allow_nan=False) + "\n"
