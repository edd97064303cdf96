"""Figures from a run's `metrics.jsonl` (matplotlib: `pip install dateopt[plots]`).

Example:
  >>> from dateopt import plots
  >>> plots.plot_eval_curves({"baseline": "runs/b", "DATE 16x": "runs/d"}, "curves.png")
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping, Sequence


def read_metrics(workdir: str) -> list[dict[str, float]]:
  """The rows of `workdir/metrics.jsonl`, in order."""
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def metric_curve(rows: Sequence[Mapping[str, float]], key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of `key` over the rows that have a finite value of it."""
  points = [(int(r["step"]), float(r[key])) for r in rows
            if key in r and r[key] is not None and math.isfinite(float(r[key]))]
  return [s for s, _ in points], [v for _, v in points]


def plot_eval_curves(runs: Mapping[str, str], path: str, *, key: str = "eval/accuracy",
                     title: str | None = None, log_x: bool = True) -> str:
  """One curve of `key` against optimizer steps per run; saves a PNG at `path`.

  Args:
    runs: {label: workdir} (each with a `metrics.jsonl`).
    path: the PNG to write (folders are created).
    key: the metric to plot.
    title: the figure title.
    log_x: steps on a log axis (runs whose lengths differ 10× stay readable).

  Returns:
    `path`.
  """
  import matplotlib
  matplotlib.use("Agg")  # files only: works on a headless TPU VM or CI
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
  for label, workdir in runs.items():
    steps, values = metric_curve(read_metrics(workdir), key)
    ax.plot(steps, [100 * v for v in values] if "accuracy" in key else values,
            marker="o", markersize=2.5, linewidth=1.4, label=label)
  if log_x:
    ax.set_xscale("log")
  ax.set_xlabel("optimizer steps")
  ax.set_ylabel(f"{key} (%)" if "accuracy" in key else key)
  ax.grid(True, which="both", alpha=0.3)
  ax.legend()
  if title:
    ax.set_title(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path)
  plt.close(fig)
  return path
