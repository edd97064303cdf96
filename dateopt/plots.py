"""Figures: LR schedules and training curves from `metrics.jsonl` (the study's: `study.figures`).

matplotlib is the `plots` extra (`pip install dateopt[plots]`): importing this
module without it fails in one line naming the extra. pyplot is imported inside
the functions, when a figure is drawn: without a display (a TPU VM, CI) they
draw on the Agg backend; in a notebook, on the notebook's own (inline) backend.

Example:
  >>> from dateopt import date, plots
  >>> base = date.Recipe(batch_size=32, num_examples=8000, num_epochs=30,
  ...                    learning_rate=2e-3, optimizer="adam", warmup_epochs=0.25)
  >>> fig = plots.plot_lr_schedules(base, [32, 128, 512], path="lr_schedules.png")
  >>> fig = plots.plot_training_curves({"baseline": "runs/b", "DATE 16x": "runs/d"})
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Sequence

import numpy as np

from dateopt import date, extras, metrics_io
from dateopt.metrics_io import metric_curve  # part of this module's API too

extras.require_extra("dateopt.plots", extra="plots", modules=extras.PLOTS_MODULES)


def plot_eval_curves(runs: Mapping[str, str], path: str, *, key: str = "eval/accuracy",
                     title: str | None = None, log_x: bool = True,
                     x: Sequence[str] = ("step",)) -> str:
  """One curve of `key` per run, one panel per x axis; saves a PNG at `path`.

  `plot_training_curves`, closed after saving (for scripts).

  Args:
    runs: {label: workdir} (each with a `metrics.jsonl`).
    path: the PNG to write (folders are created).
    key: the metric to plot.
    title: the figure title.
    log_x: x on a log axis (runs whose lengths differ 10× stay readable).
    x: the x axes, one panel each: "step", or a metric such as "eval/tokens_seen".

  Returns:
    `path`.
  """
  fig = plot_training_curves(runs, keys=(key,) * len(x), path=path, title=title, log_x=log_x,
                             x=x)
  pyplot().close(fig)
  return path


def _has_display() -> bool:
  """Whether figures can be shown: a notebook kernel, macOS/Windows, or an X/Wayland display."""
  return ("ipykernel" in sys.modules or sys.platform in ("darwin", "win32")
          or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")))


def pyplot():
  """matplotlib.pyplot, on the Agg backend when nothing could show a figure anyway."""
  matplotlib = extras.require("matplotlib", extra="plots")
  # A backend chosen already (MPLBACKEND, a notebook's inline one, pyplot imported by the
  # caller) is kept: forcing Agg there would stop a notebook from showing the figures.
  chosen = "MPLBACKEND" in os.environ or "matplotlib.pyplot" in sys.modules
  if not chosen and not _has_display():
    matplotlib.use("Agg")  # files only: a headless TPU VM or CI
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _in_percent(key: str, values: Sequence[float]) -> list[float]:
  """Accuracies are drawn in %, every other metric as it is."""
  return [100 * v for v in values] if "accuracy" in key else list(values)


def _axis_label(key: str) -> str:
  return f"{key} (%)" if "accuracy" in key else key


# --------------------------------------------------------------------------
# LR schedules of the static strategies, and training curves (notebooks)
# --------------------------------------------------------------------------

# Panel titles: what each static strategy does to the baseline's LR curve.
_STRATEGY_TITLES = {
    "legw": "LEGW: peak × √k, warmup × k epochs",
    "linear": "linear: peak × k, Goyal warmup",
    "sqrt": "sqrt: peak × √k, same warmup",
    "none": "none: the batch alone",
}


def schedule_curve(recipe: Any, max_points: int = 400) -> tuple[np.ndarray, np.ndarray]:
  """(epochs, LR) of a static recipe's schedule at up to `max_points` steps.

  The steps are spread evenly over the run, plus the end of the warmup (the
  peak), and the LRs are those `dateopt.date.build_schedule` gives there.

  Example:
    >>> epochs, lrs = schedule_curve(date.plan(base, 512))
  """
  total = recipe.total_steps
  steps = np.linspace(0, total, num=min(total + 1, max_points)).round().astype(np.int64)
  steps = np.union1d(steps, [recipe.warmup_steps])
  lrs = np.asarray(date.build_schedule(recipe)(steps), dtype=np.float64)
  return steps / recipe.steps_per_epoch, lrs


def plot_lr_schedules(baseline: Any, batch_sizes: Sequence[int],
                      strategies: Sequence[str] = ("legw", "linear", "sqrt"), *,
                      path: str | None = None, title: str | None = None,
                      plan_kwargs: Mapping[str, Any] | None = None, max_points: int = 400):
  """LR against epochs as DATE plans it, one panel per strategy, one line per batch size.

  Each line is `date.build_schedule(date.plan(baseline, batch, strategy))`: what a
  run at that batch would follow. Each panel has its own logarithmic LR axis, so every
  curve can be read; the epochs axis is shared.

  Args:
    baseline: the tuned small-batch `dateopt.date.Recipe`.
    batch_sizes: the batches to plan for (the baseline's own gives its curve).
    strategies: static `date.plan` strategies ("legw", "linear", "sqrt", "none");
      "adaptive" has no fixed curve (its LR follows the measured gain).
    path: also save the figure as a PNG there (folders are created).
    title: the figure's title.
    plan_kwargs: more keyword arguments of `date.plan` (e.g. `linear_warmup_epochs`).
    max_points: steps sampled per curve.

  Returns:
    The matplotlib Figure (shown by a notebook; close it in a script).

  Example:
    >>> base = date.Recipe(batch_size=32, num_examples=8000, num_epochs=30,
    ...                    learning_rate=2e-3, optimizer="adam", warmup_epochs=0.25)
    >>> fig = plot_lr_schedules(base, [32, 128, 512, 2048], path="lr.png")
  """
  if "adaptive" in strategies:
    raise ValueError("strategy 'adaptive' has no LR curve to plan: its LR follows the gain "
                     "measured while training; plot a run's train/learning_rate instead.")
  plt = pyplot()
  fig, axes = plt.subplots(1, len(strategies), figsize=(4.4 * len(strategies), 3.8), dpi=110,
                           sharex=True, sharey=False, squeeze=False)
  colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, len(batch_sizes)))
  for ax, strategy in zip(axes[0], strategies):
    peaks = []
    for batch, color in zip(batch_sizes, colors):
      recipe = date.plan(baseline, batch, strategy, **dict(plan_kwargs or {}))
      epochs, lrs = schedule_curve(recipe, max_points)
      k = batch / baseline.batch_size
      ax.plot(epochs, lrs, color=color, linewidth=1.4, label=f"batch {batch:,} ({k:g}x)")
      peaks.append(float(np.max(lrs)))
    # A log axis: peaks 64x apart all readable; the warmup's start and the decay's end at
    # ~0 leave it below 1/100 of the smallest peak.
    ax.set_yscale("log")
    ax.set_ylim(min(peaks) / 100, max(peaks) * 2)
    ax.set_title(_STRATEGY_TITLES.get(strategy, strategy), fontsize=9)
    ax.set_xlabel("epochs")
    ax.set_ylabel("learning rate (log scale)")
    ax.grid(True, which="both", alpha=0.3)
  axes[0][-1].legend(fontsize=8)
  return _finish(fig, path, title)


def plot_training_curves(runs: Sequence[str] | Mapping[str, str] | str,
                         keys: Sequence[str] = ("train/loss", "eval/accuracy"),
                         labels: Sequence[str] | None = None, *, path: str | None = None,
                         title: str | None = None, log_x: bool = False,
                         x: Sequence[str] | str = "step"):
  """One panel per metric key against optimizer steps (or `x`), one line per run.

  Rows whose value is missing, null or non-finite are left out (`metric_curve`);
  accuracies are drawn in %.

  Args:
    runs: workdirs or `metrics.jsonl` paths (one, a list, or {label: path}).
    keys: the metrics to draw, as `metrics.jsonl` names them.
    labels: one legend label per run (default: the mapping's keys, else each
      workdir's name).
    path: also save the figure as a PNG there.
    title: the figure's title.
    log_x: steps on a log axis (runs whose lengths differ 10x stay readable).
    x: the x axis of every panel, or one per panel: "step", or a metric of
      the same rows ("eval/tokens_seen": an LM's eval curve against tokens).

  Returns:
    The matplotlib Figure (shown by a notebook; close it in a script).

  Example:
    >>> fig = plot_training_curves(["runs/baseline", "runs/date"], labels=["B=32", "DATE"])
    >>> fig = plot_training_curves("runs/lm", keys=("eval/loss", "eval/loss"),
    ...                            x=("step", "eval/tokens_seen"))
  """
  paths, labels = _runs_and_labels(runs, labels)
  x_axes = [x] * len(keys) if isinstance(x, str) else list(x)
  if len(x_axes) != len(keys):
    raise ValueError(f"x: {len(x_axes)} x axes for {len(keys)} keys; give one, or one per key.")
  plt = pyplot()
  fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 3.6), dpi=110,
                           squeeze=False)
  rows = [metrics_io.read_metrics(p) for p in paths]
  for ax, key, x_key in zip(axes[0], keys, x_axes):
    for run_rows, label in zip(rows, labels):
      steps, values = metric_curve(run_rows, key, x=x_key)
      ax.plot(steps, _in_percent(key, values), marker="o", markersize=2, linewidth=1.3,
              label=label)
    if log_x:
      ax.set_xscale("log")
    ax.set_xlabel("optimizer steps" if x_key == "step" else x_key)
    ax.set_ylabel(_axis_label(key))
    ax.grid(True, which="both", alpha=0.3)
  axes[0][-1].legend(fontsize=8)
  return _finish(fig, path, title)


def _runs_and_labels(runs, labels) -> tuple[list[str], list[str]]:
  """(paths, labels) from one path, a list of paths, or {label: path}."""
  if isinstance(runs, (str, os.PathLike)):
    runs = [runs]
  if isinstance(runs, Mapping):
    labels, runs = list(runs) if labels is None else labels, list(runs.values())
  runs = [os.fspath(r) for r in runs]
  if labels is None:
    labels = [os.path.basename(os.path.dirname(r) if r.endswith(".jsonl") else r.rstrip("/"))
              for r in runs]
  if len(labels) != len(runs):
    raise ValueError(f"{len(labels)} labels for {len(runs)} runs.")
  return runs, list(labels)


def _finish(fig, path: str | None, title: str | None):
  """Title, layout, and the PNG at `path` if given; the figure itself, left open."""
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
  return fig
