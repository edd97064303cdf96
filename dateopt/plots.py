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


# --------------------------------------------------------------------------
# The batch-scaling study's figures (`dateopt.study.summarize` entries)
# --------------------------------------------------------------------------

def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")  # files only: works on a headless TPU VM or CI
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _save(fig, ax, path: str, title: str | None) -> str:
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  if title:
    ax.set_title(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path)
  _pyplot().close(fig)
  return path


def _batch_axis(ax, summary: Sequence[Mapping]) -> None:
  """A log-2 batch axis ticked at the study's batch sizes, written out."""
  batches = sorted({e["batch"] for e in summary})
  ax.set_xscale("log", base=2)
  ax.set_xticks(batches, [f"{b:,}" for b in batches])
  ax.minorticks_off()
  ax.set_xlabel("batch size")


def _by_strategy(summary: Sequence[Mapping], key: str) -> dict[str, list[Mapping]]:
  """{strategy: entries sorted by batch, the baseline's k = 1 entry first}; `key` must be set."""
  from dateopt.study import STRATEGIES  # pylint: disable=g-import-not-at-top
  baseline = [e for e in summary if e["strategy"] == "baseline"]
  out = {}
  for strategy in STRATEGIES:
    entries = baseline + sorted((e for e in summary if e["strategy"] == strategy
                                 and strategy != "baseline"), key=lambda e: e["batch"])
    entries = [e for e in entries if e.get(key) is not None]
    if strategy != "baseline" and len(entries) > len(baseline):
      out[strategy] = entries
  return out


def plot_accuracy_vs_batch(summary: Sequence[Mapping], path: str, *,
                           title: str | None = None) -> str:
  """Final accuracy (mean ± std over seeds) against batch size, one line per strategy.

  Example:
    >>> plot_accuracy_vs_batch(study.summarize(rows), "accuracy_vs_batch.png")
  """
  from dateopt.study import STRATEGIES  # pylint: disable=g-import-not-at-top
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.4), dpi=120)
  for strategy, entries in _by_strategy(summary, "accuracy").items():
    ax.errorbar([e["batch"] for e in entries], [e["accuracy"] for e in entries],
                yerr=[e["accuracy_std"] for e in entries], marker="o", markersize=3.5,
                capsize=2, linewidth=1.3, label=STRATEGIES[strategy])
  baseline = next((e for e in summary if e["strategy"] == "baseline"), None)
  if baseline is not None:
    ax.axhspan(baseline["accuracy"] - 1.0, baseline["accuracy"], color="grey", alpha=0.15,
               label="within 1 point of the baseline")
  _batch_axis(ax, summary)
  ax.set_ylabel("final test accuracy (%)")
  return _save(fig, ax, path, title)


def plot_steps_to_target(summary: Sequence[Mapping], path: str, *, noise_scale: float,
                         title: str | None = None) -> str:
  """Steps to the baseline's accuracy against batch, with the noise-scale law drawn on it.

  The law (McCandlish et al. 2018) is anchored at the baseline's steps:
  S(B) = S(B0)·(1 + B_noise/B)/(1 + B_noise/B0); perfect scaling is S(B0)·B0/B.

  Example:
    >>> plot_steps_to_target(summary, "steps_to_target.png", noise_scale=900.0)
  """
  from dateopt.study import STRATEGIES, law_steps  # pylint: disable=g-import-not-at-top
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.4), dpi=120)
  for strategy, entries in _by_strategy(summary, "steps_to_target").items():
    ax.plot([e["batch"] for e in entries], [e["steps_to_target"] for e in entries],
            marker="o", markersize=3.5, linewidth=1.3, label=STRATEGIES[strategy])
  baseline = next((e for e in summary if e["strategy"] == "baseline"), None)
  if baseline is not None and baseline["steps_to_target"] is not None:
    b0, s0 = baseline["base_batch"], baseline["steps_to_target"]
    batches = sorted({e["batch"] for e in summary})
    grid = [b0 * 2 ** (i / 8) for i in range(int(8 * math.log2(max(batches) / b0)) + 1)]
    ax.plot(grid, [law_steps(s0, noise_scale, b0, b) for b in grid], "k--", linewidth=1.1,
            label=f"law: 1 + B_noise/B (B_noise = {noise_scale:,.0f})")
    ax.plot(grid, [s0 * b0 / b for b in grid], "k:", linewidth=1.0, label="perfect scaling")
  ax.set_yscale("log")
  _batch_axis(ax, summary)
  ax.set_ylabel("steps to the baseline's accuracy")
  return _save(fig, ax, path, title)


def plot_steps_vs_examples(summary: Sequence[Mapping], path: str, *, noise_scale: float,
                           strategy: str = "adaptive", title: str | None = None) -> str:
  """The steps/examples trade-off to the target (McCandlish et al. 2018), one point per batch.

  With S_min and E_min = S_min·B_noise from the baseline's point, the law's
  curve is (S/S_min − 1)(E/E_min − 1) = 1, i.e. S = S_min(1 + B_noise/B),
  E = S·B.

  Example:
    >>> plot_steps_vs_examples(summary, "tradeoff.png", noise_scale=900.0)
  """
  from dateopt.study import STRATEGIES  # pylint: disable=g-import-not-at-top
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.4), dpi=120)
  entries = _by_strategy(summary, "steps_to_target").get(strategy, [])
  steps = [e["steps_to_target"] for e in entries]
  examples = [e["steps_to_target"] * e["batch"] for e in entries]
  ax.plot(examples, steps, marker="o", linewidth=1.3, label=STRATEGIES[strategy])
  for e, x, y in zip(entries, examples, steps):
    ax.annotate(f"{e['batch']:,}", (x, y), textcoords="offset points", xytext=(4, 4),
                fontsize=7)
  if entries:
    b0, s0 = entries[0]["batch"], entries[0]["steps_to_target"]
    s_min = s0 / (1 + noise_scale / b0)
    batches = [b0 * 2 ** (i / 8) for i in range(8 * 12 + 1)]
    ax.plot([s_min * (b + noise_scale) for b in batches],
            [s_min * (1 + noise_scale / b) for b in batches], "k--", linewidth=1.1,
            label=f"law (B_noise = {noise_scale:,.0f})")
    ax.set_xlim(min(examples) / 2, max(examples) * 2)
    ax.set_ylim(min(steps) / 2, max(steps) * 2)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("examples processed to the target")
  ax.set_ylabel("steps to the target")
  return _save(fig, ax, path, title)
