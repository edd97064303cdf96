"""Reading `metrics.jsonl` back: the rows a run logged, and one metric's curve.

The trainer writes the file (`dateopt.train.metrics.MetricWriter`); figures, the
studies and scripts read it. Reading a local file needs no extra, so
`dateopt.plots` works with the `plots` extra alone; a gs:// one reads through
etils.epath (the `train` and `gcp` extras).

Example:
  >>> from dateopt import metrics_io
  >>> rows = metrics_io.read_metrics("runs/mnist1d_lstm/baseline")  # doctest: +SKIP
  >>> steps, accuracy = metrics_io.metric_curve(rows, "eval/accuracy")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Iterator, Mapping, Sequence

from dateopt import extras


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
  """The rows a `MetricWriter` wrote, in order: a workdir's `metrics.jsonl`, or the file.

  Local paths and gs:// alike. The half-written last line of a killed run is
  skipped; NaN and infinities were written as null.

  Example:
    >>> rows = read_metrics("runs/mnist1d_lstm/baseline")  # doctest: +SKIP
    >>> [row["eval/accuracy"] for row in rows if "eval/accuracy" in row]  # doctest: +SKIP
  """
  path = _as_path(path)
  if not path.name.endswith(".jsonl"):
    path = path / "metrics.jsonl"
  return [row for _, row in parsed_rows(path)]


def parsed_rows(path: Any) -> Iterator[tuple[int, dict[str, Any]]]:
  """(step, row) of each line of `path` (a pathlib or epath path) that parses.

  The half-written last line of a killed run is skipped.
  """
  for line in path.read_text(encoding="utf-8").splitlines():
    try:
      row = json.loads(line)  # also reads the NaN literals of older files
      yield int(row["step"]), row
    except (ValueError, TypeError, KeyError):
      continue


def metric_curve(rows: Sequence[Mapping[str, float]], key: str, x: str = "step"
                 ) -> tuple[list[float], list[float]]:
  """(x values, values) of `key` over the rows with finite values of both.

  `x` is "step" (optimizer steps, as ints) or another metric of the same rows,
  e.g. "eval/tokens_seen" for an eval curve against the tokens trained on.

  Example:
    >>> metric_curve([{"step": 5, "eval/loss": 2.0, "eval/tokens_seen": 640}], "eval/loss",
    ...              x="eval/tokens_seen")
    ([640.0], [2.0])
  """
  def finite(row, name):
    return name in row and row[name] is not None and math.isfinite(float(row[name]))

  points = [(int(r[x]) if x == "step" else float(r[x]), float(r[key])) for r in rows
            if finite(r, key) and finite(r, x)]
  return [s for s, _ in points], [v for _, v in points]


def _as_path(path: str | os.PathLike):
  """A local path as pathlib's; a URL (gs://) as etils.epath's, which can open it."""
  text = os.fspath(path)
  if not text.strip():  # an unset $WORKDIR would read the current directory's file
    raise ValueError("read_metrics: the path is empty; give a workdir or its metrics.jsonl.")
  if "://" in text:
    return extras.require("etils.epath", extra="train").Path(text)
  return pathlib.Path(text)
