"""Figures: LR schedules, training curves from `metrics.jsonl`, the scaling study.

matplotlib is the `plots` extra (`pip install dateopt[plots]`), imported only
inside the functions. Without a display (a TPU VM, CI) they draw on the Agg
backend; in a notebook, on the notebook's own (inline) backend.

Example:
  >>> from dateopt import date, plots
  >>> base = date.Recipe(batch_size=32, num_examples=8000, num_epochs=30,
  ...                    learning_rate=2e-3, optimizer="adam", warmup_epochs=0.25)
  >>> fig = plots.plot_lr_schedules(base, [32, 128, 512], path="lr_schedules.png")
  >>> fig = plots.plot_training_curves({"baseline": "runs/b", "DATE 16x": "runs/d"})
"""

from __future__ import annotations

import json
import math
import os
import sys
import statistics
from typing import Any, Mapping, Sequence

import numpy as np

from dateopt import extras


def read_metrics(path: str) -> list[dict[str, float]]:
  """The rows of a run's metrics, in order.

  Args:
    path: a workdir (its `metrics.jsonl` is read) or a `.jsonl` file itself.
  """
  path = os.fspath(path)
  if not path.endswith(".jsonl"):
    path = os.path.join(path, "metrics.jsonl")
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def metric_curve(rows: Sequence[Mapping[str, float]], key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of `key` over the rows that have a finite value of it."""
  points = [(int(r["step"]), float(r[key])) for r in rows
            if key in r and r[key] is not None and math.isfinite(float(r[key]))]
  return [s for s, _ in points], [v for _, v in points]


def plot_eval_curves(runs: Mapping[str, str], path: str, *, key: str = "eval/accuracy",
                     title: str | None = None, log_x: bool = True) -> str:
  """One curve of `key` against optimizer steps per run; saves a PNG at `path`.

  `plot_training_curves` with one panel, closed after saving (for scripts).

  Args:
    runs: {label: workdir} (each with a `metrics.jsonl`).
    path: the PNG to write (folders are created).
    key: the metric to plot.
    title: the figure title.
    log_x: steps on a log axis (runs whose lengths differ 10× stay readable).

  Returns:
    `path`.
  """
  fig = plot_training_curves(runs, keys=(key,), path=path, title=title, log_x=log_x)
  _pyplot().close(fig)
  return path


def _has_display() -> bool:
  """Whether figures can be shown: a notebook kernel, macOS/Windows, or an X/Wayland display."""
  return ("ipykernel" in sys.modules or sys.platform in ("darwin", "win32")
          or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")))


def _pyplot():
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
  from dateopt import date  # pylint: disable=g-import-not-at-top
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
  from dateopt import date  # pylint: disable=g-import-not-at-top
  if "adaptive" in strategies:
    raise ValueError("strategy 'adaptive' has no LR curve to plan: its LR follows the gain "
                     "measured while training; plot a run's train/learning_rate instead.")
  plt = _pyplot()
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
                         title: str | None = None, log_x: bool = False):
  """One panel per metric key against optimizer steps, one line per run.

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

  Returns:
    The matplotlib Figure (shown by a notebook; close it in a script).

  Example:
    >>> fig = plot_training_curves(["runs/baseline", "runs/date"], labels=["B=32", "DATE"])
  """
  paths, labels = _runs_and_labels(runs, labels)
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 3.6), dpi=110,
                           squeeze=False)
  rows = [read_metrics(p) for p in paths]
  for ax, key in zip(axes[0], keys):
    for run_rows, label in zip(rows, labels):
      steps, values = metric_curve(run_rows, key)
      ax.plot(steps, _in_percent(key, values), marker="o", markersize=2, linewidth=1.3,
              label=label)
    if log_x:
      ax.set_xscale("log")
    ax.set_xlabel("optimizer steps")
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


# --------------------------------------------------------------------------
# The batch-scaling study's figures (`dateopt.study.summarize` entries)
# --------------------------------------------------------------------------


def _save(fig, ax, path: str, title: str | None) -> str:
  lim = ax.dataLim
  if not (math.isfinite(lim.x0) and math.isfinite(lim.y0)):  # no point (no run got there)
    ax.set_xscale("linear")  # log axes without data fail to draw
    ax.set_yscale("linear")
    ax.text(0.5, 0.5, "no run to show", transform=ax.transAxes, ha="center", va="center")
  ax.grid(True, which="both", alpha=0.3)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=8)
  if title and len(fig.axes) > 1:
    fig.suptitle(title)
  elif title:
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


def _drawable_noise_scale(noise_scale: float) -> bool:
  """Whether the law can be drawn on log axes: a short run may measure no finite B_noise
  (inf while its |G|² estimate is <= 0), which makes the law's curves 0 or NaN."""
  return math.isfinite(noise_scale) and noise_scale > 0


def plot_accuracy_vs_batch(summary: Sequence[Mapping], path: str, *,
                           title: str | None = None) -> str:
  """Final accuracy (mean ± std over seeds) against batch size, one line per strategy.

  Two panels: every run on the left; on the right the same lines on an axis 3 points below
  to 1.5 above the baseline, where the comparison with it can be read.

  Example:
    >>> plot_accuracy_vs_batch(study.summarize(rows), "accuracy_vs_batch.png")
  """
  from dateopt.study import STRATEGIES  # pylint: disable=g-import-not-at-top
  plt = _pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), dpi=120)
  baseline = next((e for e in summary if e["strategy"] == "baseline"), None)
  for ax in axes:
    for strategy, entries in _by_strategy(summary, "accuracy").items():
      ax.errorbar([e["batch"] for e in entries], [e["accuracy"] for e in entries],
                  yerr=[e["accuracy_std"] for e in entries], marker="o", markersize=3.5,
                  capsize=2, linewidth=1.3, label=STRATEGIES[strategy])
    if baseline is not None:
      ax.axhspan(baseline["accuracy"] - 1.0, baseline["accuracy"], color="grey", alpha=0.15,
                 label="within 1 point of the baseline")
    _batch_axis(ax, summary)
    ax.set_ylabel("final test accuracy (%)")
  axes[0].set_title("every run", fontsize=9)
  if baseline is not None:
    axes[1].set_ylim(baseline["accuracy"] - 3.0, baseline["accuracy"] + 1.5)
    axes[1].set_title("near the baseline (runs below 3 points under it leave the axis)",
                      fontsize=9)
  axes[1].grid(True, which="both", alpha=0.3)  # the legend is the left panel's
  return _save(fig, axes[0], path, title)


def plot_steps_to_target(summary: Sequence[Mapping], path: str, *, noise_scale: float,
                         title: str | None = None) -> str:
  """Steps to the target (the baseline's mean accuracy less 1 point, `study.baseline_target`)
  against batch, with the noise-scale law drawn on it.

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
  if (baseline is not None and baseline["steps_to_target"] is not None
      and _drawable_noise_scale(noise_scale)):
    b0, s0 = baseline["base_batch"], baseline["steps_to_target"]
    batches = sorted({e["batch"] for e in summary})
    grid = [b0 * 2 ** (i / 8) for i in range(int(8 * math.log2(max(batches) / b0)) + 1)]
    ax.plot(grid, [law_steps(s0, noise_scale, b0, b) for b in grid], "k--", linewidth=1.1,
            label=f"law: 1 + B_noise/B (B_noise = {noise_scale:,.0f})")
    ax.plot(grid, [s0 * b0 / b for b in grid], "k:", linewidth=1.0, label="perfect scaling")
  ax.set_yscale("log")
  _batch_axis(ax, summary)
  ax.set_ylabel("steps to the baseline's accuracy − 1 point")
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
  if entries and _drawable_noise_scale(noise_scale):
    b0, s0 = entries[0]["batch"], entries[0]["steps_to_target"]
    s_min = s0 / (1 + noise_scale / b0)
    batches = [b0 * 2 ** (i / 8) for i in range(8 * 12 + 1)]
    ax.plot([s_min * (b + noise_scale) for b in batches],
            [s_min * (1 + noise_scale / b) for b in batches], "k--", linewidth=1.1,
            label=f"law (B_noise = {noise_scale:,.0f})")
  if entries:
    ax.set_xlim(min(examples) / 2, max(examples) * 2)
    ax.set_ylim(min(steps) / 2, max(steps) * 2)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("examples processed to the target")
  ax.set_ylabel("steps to the target")
  return _save(fig, ax, path, title)


def plot_growth_pareto(rows: Sequence[Mapping], path: str, *, title: str | None = None) -> str:
  """Steps against examples of every DATE run: fixed batches and grown ones (the Pareto picture).

  One marker per run (seeds apart), labelled with its batch multiple (the
  maximum, for a grown run); the fixed-batch runs' means are joined into
  their frontier. A grown run below and left of it takes as few steps for
  fewer examples than any fixed batch.

  Example:
    >>> plot_growth_pareto(study_rows, "pareto.png")
  """
  from dateopt.study import STRATEGIES  # pylint: disable=g-import-not-at-top
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.4), dpi=120)
  for strategy, marker in (("adaptive", "o"), ("adaptive_grow", "^")):
    runs = sorted((r for r in rows if r["strategy"] == strategy), key=lambda r: r["multiple"])
    if not runs:
      continue
    points = ax.scatter([r["examples"] for r in runs], [r["steps"] for r in runs], marker=marker,
                        s=28, label=f"{STRATEGIES[strategy]} (each seed)")
    for r in runs:
      ax.annotate(f"{r['multiple']}x", (r["examples"], r["steps"]), textcoords="offset points",
                  xytext=(4, 3), fontsize=7)
    if strategy == "adaptive":  # the frontier: the fixed batches' means, in batch order
      multiples = sorted({r["multiple"] for r in runs})
      mean = lambda k, key: statistics.mean(r[key] for r in runs if r["multiple"] == k)
      ax.plot([mean(k, "examples") for k in multiples], [mean(k, "steps") for k in multiples],
              "--", color=points.get_facecolor()[0], linewidth=1.1,
              label="fixed-batch frontier (means)")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("training examples processed (run to its end)")
  ax.set_ylabel("optimizer steps (run to its end)")
  return _save(fig, ax, path, title)
