"""The study's figures, from `summarize` entries or `cells.jsonl` rows.

Accuracy against batch, steps to the target with McCandlish et al.'s law
drawn on it, the steps/examples trade-off, and the growing batch's Pareto
picture. Needs the `plots` extra (matplotlib).

Example:
  >>> plot_accuracy_vs_batch(summarize(rows), "lstm_accuracy.png")
  >>> plot_growth_pareto(rows, "pareto.png")
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Mapping, Sequence

from dateopt.date._noise import law_steps
from dateopt.plots import pyplot
from dateopt.study.cells import STRATEGIES

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
  pyplot().close(fig)
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
  plt = pyplot()
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


def plot_loss_vs_batch(summary: Sequence[Mapping], path: str, *,
                       title: str | None = None) -> str:
  """A language model's final validation loss (nats, mean ± std over seeds) against batch
  size, one line per strategy, with the band within 1% of the baseline's loss.

  Example:
    >>> plot_loss_vs_batch(study.summarize(rows), "lm_loss.png")
  """
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=120)
  for strategy, entries in _by_strategy(summary, "loss").items():
    ax.errorbar([e["batch"] for e in entries], [e["loss"] for e in entries],
                yerr=[e["loss_std"] for e in entries], marker="o", markersize=3.5, capsize=2,
                linewidth=1.3, label=STRATEGIES[strategy])
  baseline = next((e for e in summary if e["strategy"] == "baseline" and "loss" in e), None)
  if baseline is not None:
    ax.axhline(baseline["loss"] * 1.01, color="grey", linestyle=":",
               label="1% above the baseline's loss (the bar: at or below)")
  _batch_axis(ax, summary)
  ax.set_ylabel("final validation loss (nats per byte)")
  return _save(fig, ax, path, title)


def plot_loss_curves(rows: Sequence[Mapping], path: str, *, seed: int = 0,
                     title: str | None = None) -> str:
  """A language model's validation loss against optimizer steps (left) and tokens seen
  (right): the baseline and each DATE cell of one seed, so that steps saved and tokens paid
  read off the same curves.

  Example:
    >>> plot_loss_curves(rows, "lm_curves.png")
  """
  plt = pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), dpi=120)
  shown = sorted((r for r in rows if r["seed"] == seed and r.get("eval_loss")
                  and r["strategy"] in ("baseline", "adaptive", "adaptive_grow")
                  and not r.get("setting")),
                 key=lambda r: (list(STRATEGIES).index(r["strategy"]), r["multiple"]))
  for row in shown:
    points = [(s, v) for s, v in zip(row["eval_steps"], row["eval_loss"]) if v is not None]
    if not points:
      continue
    steps, losses = zip(*points)
    label = (STRATEGIES[row["strategy"]] if row["strategy"] == "baseline"
             else f"{STRATEGIES[row['strategy']]}, {row['multiple']}x")
    style = dict(linestyle="--" if row["strategy"] == "adaptive" else "-", linewidth=1.2,
                 marker=".", markersize=3)
    axes[0].plot(steps, losses, label=label, **style)
    tokens = _tokens_at_evals(row)
    if tokens is not None:
      axes[1].plot(tokens, losses, label=label, **style)
  # The first evaluations of a large batch sit far above the rest: the axis shows from the
  # lowest loss to a quarter above the baseline's first.
  baseline = [v for r in shown if r["strategy"] == "baseline" for v in r["eval_loss"][:1]]
  lowest = min((v for r in shown for v in r["eval_loss"] if v is not None), default=None)
  for ax, xlabel in zip(axes, ("optimizer step", "tokens seen")):
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation loss (nats per byte)")
    ax.grid(True, which="both", alpha=0.3)
    if baseline and lowest is not None:
      ax.set_ylim(0.95 * lowest, 1.25 * baseline[0])
  axes[1].legend(fontsize=7)
  return _save(fig, axes[0], path, title)


def _tokens_at_evals(row: Mapping) -> list[float] | None:
  """The tokens a run had seen at each evaluation: as recorded (`eval_tokens`), or, for a
  batch that never changed, its steps × its tokens a step; None for a grown run's row
  recorded without them."""
  recorded = row.get("eval_tokens")
  if recorded and len(recorded) == len(row["eval_loss"]):
    return recorded
  if row["largest_batch"] != row["batch"] or row["strategy"] == "adaptive_grow":
    return None
  tokens_a_step = row["tokens"] / row["steps"]
  return [s * tokens_a_step for s, v in zip(row["eval_steps"], row["eval_loss"]) if v is not None]


def plot_steps_to_target(summary: Sequence[Mapping], path: str, *, noise_scale: float,
                         title: str | None = None) -> str:
  """Steps to the target (the baseline's mean accuracy less 1 point, `study.baseline_target`)
  against batch, with the noise-scale law drawn on it.

  The law (McCandlish et al. 2018) is anchored at the baseline's steps:
  S(B) = S(B0)·(1 + B_noise/B)/(1 + B_noise/B0); perfect scaling is S(B0)·B0/B.

  Example:
    >>> plot_steps_to_target(summary, "steps_to_target.png", noise_scale=900.0)
  """
  plt = pyplot()
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
    law = [law_steps(s0, noise_scale, base_batch_size=b0, batch_size=b) for b in grid]
    ax.plot(grid, law, "k--", linewidth=1.1,
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
  plt = pyplot()
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
    batches = [b0 * 2 ** (i / 8) for i in range(8 * 12 + 1)]
    law = [law_steps(s0, noise_scale, base_batch_size=b0, batch_size=b) for b in batches]
    ax.plot([s * b for s, b in zip(law, batches)], law, "k--", linewidth=1.1,
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
  plt = pyplot()
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


def plot_schedule_frontiers(rows: Sequence[Mapping], path: str, *, bar: float,
                            title: str | None = None) -> str:
  """Steps against examples of every method in the batch-schedule comparison, one workload.

  Each run is a marker (filled: at the quality `bar`, `dateopt.study.compare.quality`;
  hollow: below it, shown, not dropped); each method's runs at the bar are joined into
  its lower envelope. DATE grown's runs are the large markers.

  Example:
    >>> plot_schedule_frontiers(rows, "lstm_frontiers.png", bar=0.982)
  """
  from dateopt.study.compare import METHODS, envelope, quality  # the comparison's rules

  plt = pyplot()
  fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
  markers = dict(zip(("baseline",) + METHODS, "s^ovDPX*h"))
  for method in ("baseline",) + METHODS:
    runs = [r for r in rows if r["strategy"] == method]
    if not runs:
      continue
    passing = [r for r in runs if quality(r) >= bar]
    color = ax.plot([], [])[0].get_color()  # the next colour of the cycle, for both marks
    size = 70 if method == "adaptive_grow" else 30
    ax.scatter([r["examples"] for r in passing], [r["steps"] for r in passing],
               marker=markers[method], s=size, color=color, label=STRATEGIES[method])
    failing = [r for r in runs if quality(r) < bar]
    ax.scatter([r["examples"] for r in failing], [r["steps"] for r in failing],
               marker=markers[method], s=size, facecolors="none", edgecolors=color)
    frontier = envelope([(r["examples"], r["steps"]) for r in passing])
    if len(frontier) > 1:
      ax.plot(*zip(*frontier), "-", color=color, linewidth=1.0, alpha=0.8)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("training examples processed (run to its end)")
  ax.set_ylabel("optimizer steps (run to its end)")
  ax.scatter([], [], marker="s", facecolors="none", edgecolors="gray",
             label="hollow marks: below the quality bar")
  return _save(fig, ax, path, title)


def plot_best_run_curves(rows: Sequence[Mapping], best_keys: Sequence[str], path: str, *,
                         title: str | None = None) -> str:
  """The evaluation curve (accuracy, or validation loss for a language model) of each
  method's best run against its steps: a run that ran hot or stalled shows here.

  Example:
    >>> plot_best_run_curves(rows, ["lstm/seesaw/64x/start16x/seed0"], "curves.png")
  """
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
  for row in (r for r in rows if r["key"] in best_keys):
    values = row.get("eval_loss") if "final_loss" in row else row["eval_accuracy"]
    points = [(s, v) for s, v in zip(row["eval_steps"], values or []) if v is not None]
    if points:
      ax.plot(*zip(*points), marker=".", linewidth=1.0,
              label=f"{STRATEGIES[row['strategy']]}: {row['key'].split('/', 2)[2]}")
  ax.set_xscale("log")
  ax.set_xlabel("optimizer step")
  is_loss = any("final_loss" in r for r in rows)
  ax.set_ylabel("validation loss (nats)" if is_loss else "evaluation accuracy")
  if not is_loss:
    ax.set_ylim(bottom=max(0.0, min((v for r in rows if r["key"] in best_keys
                                     for v in r["eval_accuracy"] if v is not None),
                                    default=0.0)))
  return _save(fig, ax, path, title)
