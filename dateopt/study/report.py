"""The study's results: summaries over seeds, the CSV, the markdown tables and the bars.

Example:
  >>> summary = summarize(runner.rows())
  >>> print(markdown_report(summary))
  >>> print(growth_report(runner.rows()))   # grown against fixed batches
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from typing import Any, Mapping, Sequence

from dateopt import date
from dateopt.train import config as config_lib, experiment, metrics, recipe_record
from dateopt.study.cells import (ADAPTIVE_STRATEGIES, BAR_TOLERANCE, CSV_COLUMNS, STRATEGIES,
                                 Cell, filled_profile, finite_median)
from dateopt.study.runner import Study
from dateopt.date import _planner as planner_lib
from dateopt.date import _progress as progress_lib

def steps_to_target(row: Mapping[str, Any], target: float) -> int | None:
  """The first evaluated step whose accuracy reached `target` (None: never)."""
  for step, accuracy in zip(row["eval_steps"], row["eval_accuracy"]):
    if accuracy is not None and accuracy >= target:
      return int(step)
  return None


def baseline_target(rows: Sequence[Mapping[str, Any]], workload: str,
                    tolerance: float = BAR_TOLERANCE) -> float:
  """The baseline's mean final accuracy less `tolerance` points: 'the baseline's accuracy'."""
  accuracies = [r["final_accuracy"] for r in rows
                if r["workload"] == workload and r["strategy"] == "baseline"]
  if not accuracies:
    raise ValueError(f"no finished baseline run of workload {workload!r}.")
  return statistics.mean(accuracies) - tolerance / 100


def _targets(rows: Sequence[Mapping[str, Any]], tolerance: float) -> dict[str, float]:
  """{workload: `baseline_target`} for every workload of `rows`."""
  return {w: baseline_target(rows, w, tolerance) for w in {r["workload"] for r in rows}}


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
  if not values:
    return math.nan, math.nan
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize(rows: Sequence[Mapping[str, Any]], tolerance: float = BAR_TOLERANCE
              ) -> list[dict[str, Any]]:
  """One entry per (workload, strategy, k): accuracy, steps and examples over seeds.

  The baseline's entry (k = 1) also stands for every strategy at k = 1, where
  they coincide. `steps_to_target` is the mean over the seeds that reached the
  target (the baseline's mean accuracy less `tolerance` points);
  `reached` counts them. A run the watch gave up is not summarized (the report lists it).
  """
  rows = [row for row in rows if not row.get("gave_up")]
  targets = _targets(rows, tolerance)
  groups: dict[tuple, list] = {}
  for row in rows:
    groups.setdefault((row["workload"], row["strategy"], row["multiple"]), []).append(row)
  out = []
  for (workload, strategy, multiple), members in groups.items():
    target = targets[workload]
    accuracy, accuracy_std = _mean_std([100 * r["final_accuracy"] for r in members])
    steps, steps_std = _mean_std([r["steps"] for r in members])
    reached = [s for s in (steps_to_target(r, target) for r in members) if s is not None]
    predicted = [r["predicted_steps"] for r in members if r.get("predicted_steps")]
    out.append({
        "workload": workload, "strategy": strategy, "multiple": multiple,
        "batch": members[0]["batch"], "base_batch": members[0]["base_batch"],
        "seeds": len(members), "accuracy": accuracy, "accuracy_std": accuracy_std,
        "best_accuracy": statistics.mean(100 * r["best_accuracy"] for r in members),
        "steps": steps, "steps_std": steps_std,
        "examples": statistics.mean(r["examples"] for r in members),
        "predicted_steps": statistics.mean(predicted) if predicted else None,
        "steps_to_target": statistics.mean(reached) if reached else None,
        "reached": len(reached), "target": 100 * target,
        "wall_seconds": statistics.mean(r["wall_seconds"] for r in members),
        "guard_skipped": sum(r["guard_skipped"] for r in members),
        "noise_scale_median": finite_median(
            v for r in members for v in r.get("noise_scales") or []),
        **_loss_summary(members),
    })
  return sorted(out, key=lambda e: (e["workload"], list(STRATEGIES).index(e["strategy"]),
                                    e["multiple"]))


def _loss_summary(members: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """A text workload's validation loss (mean, std, worst seed), bits per byte and tokens."""
  if any("final_loss" not in r for r in members):
    return {}
  loss, loss_std = _mean_std([r["final_loss"] for r in members])
  return {"loss": loss, "loss_std": loss_std, "worst_loss": max(r["final_loss"] for r in members),
          "bits_per_byte": statistics.mean(r["final_bits_per_byte"] for r in members),
          "tokens": statistics.mean(r["tokens"] for r in members)}


# A text workload's bar: DATE's validation loss within LOSS_TOLERANCE of the baseline's, in
# ≤ 1/8 of its steps; a grown batch also in ≤ 2.5x its tokens.
LOSS_TOLERANCE = 0.01
STEP_SHARE_BAR = 1 / 8
GROWN_TOKENS_BAR = 2.5


def language_model_report(summary: Sequence[Mapping[str, Any]]) -> str:
  """Per text workload: validation loss (nats, mean ± std over seeds), bits per byte, steps
  and tokens against the baseline's, per strategy and k, with DATE's cells against the bar."""
  sections = []
  for workload in sorted({e["workload"] for e in summary if "loss" in e}):
    entries = [e for e in summary if e["workload"] == workload and "loss" in e]
    baseline = next((e for e in entries if e["strategy"] == "baseline"), None)
    if baseline is None:
      continue
    lines = ["| strategy | batch (k) | seeds | validation loss (nats) | vs baseline | worst seed "
             "| bits per byte | steps | steps × baseline | tokens × baseline | bar |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for e in entries:
      lines.append(
          f"| {STRATEGIES[e['strategy']]} | {e['batch']:,} ({e['multiple']}x) | {e['seeds']} "
          f"| {e['loss']:.4f} ± {e['loss_std']:.4f} | {e['loss'] / baseline['loss'] - 1:+.2%} "
          f"| {e['worst_loss'] / baseline['loss'] - 1:+.2%} | {e['bits_per_byte']:.3f} "
          f"| {e['steps']:,.0f} | {e['steps'] / baseline['steps']:.3f} "
          f"| {e['tokens'] / baseline['tokens']:.2f} | {_loss_bar(e, baseline)} |")
    sections.append(
        f"#### {workload}\n\nFinal validation loss in nats per token (mean ± std over seeds); "
        f"'vs baseline' is the mean's relative change, 'worst seed' the highest seed's. "
        f"The bar for DATE's cells: the mean within {LOSS_TOLERANCE:.0%} of the baseline's, "
        f"≤ {STEP_SHARE_BAR:.3f} of its steps, and for a grown batch ≤ {GROWN_TOKENS_BAR}× "
        f"its tokens.\n\n" + "\n".join(lines))
  return "\n\n".join(sections)


def _loss_bar(entry: Mapping[str, Any], baseline: Mapping[str, Any]) -> str:
  """'met' / 'NOT met' for DATE's cells, '' for the others."""
  if entry["strategy"] not in ADAPTIVE_STRATEGIES:
    return ""
  met = (entry["loss"] <= baseline["loss"] * (1 + LOSS_TOLERANCE)
         and entry["steps"] <= STEP_SHARE_BAR * baseline["steps"])
  if entry["strategy"] == "adaptive_grow":
    met = met and entry["tokens"] <= GROWN_TOKENS_BAR * baseline["tokens"]
  return "met" if met else "NOT met"


def write_csv(rows: Sequence[Mapping[str, Any]], path: str,
              tolerance: float = BAR_TOLERANCE, *, columns: Sequence[str] = CSV_COLUMNS
              ) -> str:
  """Every run, one line each (`columns`, by default `CSV_COLUMNS`); returns `path`."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  targets = _targets(rows, tolerance)
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=list(columns))
    writer.writeheader()
    for row in sorted(rows, key=lambda r: (r["workload"], list(STRATEGIES).index(r["strategy"]),
                                           r["multiple"], r.get("setting", ""),
                                           r.get("budget", 1.0), r["seed"])):
      target = targets[row["workload"]]
      out = {column: row.get(column) for column in columns}
      out["steps_to_target"] = steps_to_target(row, target)
      writer.writerow(out)
  return path


def _cell_text(entry: Mapping[str, Any] | None) -> str:
  if entry is None:
    return ""
  spread = f" ± {entry['accuracy_std']:.2f}" if entry["seeds"] > 1 else ""
  return f"{entry['accuracy']:.2f}{spread} ({entry['steps']:,.0f})"


def markdown_report(summary: Sequence[Mapping[str, Any]],
                    tolerance: float = BAR_TOLERANCE) -> str:
  """Per workload: accuracy (mean ± std over seeds) and steps per batch x strategy,
  DATE's predicted vs actual steps, and the study's bar (`bar_check`), checked."""
  sections = []
  for workload in sorted({e["workload"] for e in summary}):
    entries = [e for e in summary if e["workload"] == workload]
    sections.append(f"#### {workload}\n\n{_accuracy_table(entries)}\n\n"
                    f"{_prediction_table(entries)}\n\n{_bar_lines(entries, tolerance)}")
  return "\n\n".join(sections)


def _accuracy_table(entries: Sequence[Mapping[str, Any]]) -> str:
  by_cell = {(e["strategy"], e["multiple"]): e for e in entries}
  baseline = by_cell.get(("baseline", 1))
  strategies = [s for s in STRATEGIES if s != "baseline"
                and any(e["strategy"] == s for e in entries)]
  multiples = sorted({e["multiple"] for e in entries})
  head = "| batch (k) | " + " | ".join(STRATEGIES[s] for s in strategies) + " |"
  lines = [head, "|---:|" + "---:|" * len(strategies)]
  for k in multiples:
    batch = next(e["batch"] for e in entries if e["multiple"] == k)
    cells = [_cell_text(baseline if k == 1 else by_cell.get((s, k))) for s in strategies]
    lines.append(f"| {batch:,} ({k}x) | " + " | ".join(cells) + " |")
  note = ("Final test accuracy, % (mean ± std over seeds), and (steps). At 1x every "
          "strategy is the baseline.")
  return note + "\n\n" + "\n".join(lines)


def _prediction_table(entries: Sequence[Mapping[str, Any]]) -> str:
  adaptive = [e for e in entries if e["strategy"] == "adaptive"]
  lines = ["| batch (k) | DATE steps (mean ± std) | predicted | error | steps to target "
           "| examples (× baseline) |", "|---:|---:|---:|---:|---:|---:|"]
  baseline = next((e for e in entries if e["strategy"] == "baseline"), None)
  for e in adaptive:
    predicted = e["predicted_steps"]
    error = f"{e['steps'] / predicted - 1:+.0%}" if predicted else ""
    reach = (f"{e['steps_to_target']:,.0f} ({e['reached']}/{e['seeds']})"
             if e["steps_to_target"] is not None else f"never (0/{e['seeds']})")
    ratio = f"{e['examples'] / baseline['examples']:.2f}" if baseline else ""
    lines.append(f"| {e['batch']:,} ({e['multiple']}x) | {e['steps']:,.0f} ± "
                 f"{e['steps_std']:,.0f} | {predicted or 0:,.0f} | {error} | {reach} "
                 f"| {ratio} |")
  return "\n".join(lines)


def bar_check(entries: Sequence[Mapping[str, Any]], tolerance: float = BAR_TOLERANCE
              ) -> dict[str, Any]:
  """The scaling study's bar for one workload's summary entries.

  DATE within `tolerance` points of the baseline's mean at every k; at the
  largest k in ≤ 1/10 of the baseline's steps (when that k is 64); predicted
  steps within 25% of the actual at every k.
  """
  baseline = next(e for e in entries if e["strategy"] == "baseline")
  adaptive = [e for e in entries if e["strategy"] == "adaptive"]
  accuracy_misses = [e["multiple"] for e in adaptive
                     if e["accuracy"] < baseline["accuracy"] - tolerance]
  prediction_misses = [e["multiple"] for e in adaptive if e["predicted_steps"]
                       and abs(e["steps"] / e["predicted_steps"] - 1) > 0.25]
  at_64 = next((e for e in adaptive if e["multiple"] == 64), None)
  return {"accuracy_misses": accuracy_misses, "prediction_misses": prediction_misses,
          "steps_ratio_64x": None if at_64 is None else at_64["steps"] / baseline["steps"]}


def progress_profile(metric_rows: Sequence[Mapping[str, Any]], base_steps: float,
                     quarters: int = 4) -> dict[str, list[float]]:
  """A run's median B_noise and train loss in each quarter of its progress.

  Progress is counted in baseline steps: `train/date/progress` for DATE, the
  step itself for the baseline. The law's prediction assumes that a large-batch
  run sees the baseline's noise scale at the same progress; this shows whether
  it does.

  Example:
    >>> rows = [{"step": s, "train/loss": 1.0 / s, "train/date/noise_scale": 10.0 * s}
    ...         for s in (1, 2, 3, 4)]
    >>> progress_profile(rows, base_steps=4)["noise_scale"]
    [10.0, 20.0, 30.0, 40.0]
  """
  noise: list[list[float]] = [[] for _ in range(quarters)]
  loss: list[list[float]] = [[] for _ in range(quarters)]
  for row in metric_rows:
    if "train/loss" not in row:
      continue
    progress = float(row.get("train/date/progress", row["step"]))
    quarter = min(quarters - 1, max(0, math.ceil(progress / base_steps * quarters) - 1))
    loss[quarter].append(float(row["train/loss"]))
    value = row.get("train/date/noise_scale")
    if value is not None and math.isfinite(float(value)):
      noise[quarter].append(float(value))
  median = lambda values: statistics.median(values) if values else math.nan
  return {"noise_scale": [median(v) for v in noise], "loss": [median(v) for v in loss]}


def read_as_largest(metric_rows: Sequence[Mapping[str, Any]], recipe: date.Recipe
                    ) -> list[Mapping[str, Any]]:
  """The rows of a DATE run with each B_noise as its largest batch reads it.

  A row logged at batch B (`train/batch_size`) is × (B_max/B)^α, the credit the
  engine gives rung B's readings (`progress_lib.credited_noise`, α the recipe's
  `noise_batch_exponent`); a fixed batch's rows stay as logged. A profile of
  these rows is one `date.predicted_budget` reads with
  `read_at_batch_size=recipe.batch_size`.

  Example:
    >>> base = date.Recipe(batch_size=32, num_examples=3200, num_epochs=1, learning_rate=0.1,
    ...                    optimizer="sgd")
    >>> grown = date.plan(base, 1024, "adaptive", grow_batch=True)
    >>> rows = [{"train/batch_size": 32, "train/date/noise_scale": 100.0}]
    >>> read_as_largest(rows, grown)[0]["train/date/noise_scale"]  # × 32^0.2
    200.0
  """
  out = []
  for row in metric_rows:
    value = row.get("train/date/noise_scale")
    if value is not None and "train/batch_size" in row:
      credit = progress_lib.batch_credit(float(row["train/batch_size"]), recipe.batch_size,
                                 recipe.engine["noise_batch_exponent"])
      row = dict(row, **{"train/date/noise_scale": float(value) * credit})
    out.append(row)
  return out


def profile_report(runner: Study, rows: Sequence[Mapping[str, Any]]) -> str:
  """Markdown: per workload, the `progress_profile` of the baseline and of DATE, fixed and
  grown, at each k (the median over seeds of each quarter's median), from the runs'
  `metrics.jsonl`.

  A grown run measures its own noise scale at its own batches: where its profile sits below
  the fixed run's, McCandlish's law gives it more steps (docs/results/growth_study.md).
  Runs whose workdir is gone (a copy of `cells.jsonl` alone) are left out.
  """
  sections = []
  for workload in sorted({r["workload"] for r in rows}):
    baselines = [r for r in rows if r["workload"] == workload and r["strategy"] == "baseline"]
    if not baselines:
      continue
    base_steps = statistics.mean(r["steps"] for r in baselines)
    groups: dict[tuple[int, int], list[dict[str, list[float]]]] = {}
    for row in rows:
      if row["workload"] != workload or row["strategy"] not in _PROFILED:
        continue
      path = os.path.join(runner.workdir(Cell(workload, row["strategy"], row["multiple"],
                                              row["seed"])), "metrics.jsonl")
      if os.path.exists(path):
        group = (row["multiple"], _PROFILED.index(row["strategy"]))
        groups.setdefault(group, []).append(
            progress_profile(metrics.read_metrics(path), base_steps))
    if groups:
      sections.append(f"#### {workload}: by quarter of progress (baseline steps)\n\n"
                      + _profile_table(groups))
  return "\n\n".join(sections)


# The strategies `profile_report` shows, in its order within a k; with their labels.
_PROFILED = ("baseline", "adaptive", "adaptive_grow")
_PROFILE_LABELS = ("baseline (1x)", "DATE {k}x", "DATE grown to {k}x")


def _profile_table(groups: Mapping[tuple[int, int], Sequence[Mapping[str, list[float]]]]
                   ) -> str:
  quarters = len(next(iter(groups.values()))[0]["loss"])
  names = [f"Q{q + 1}" for q in range(quarters)]
  lines = ["| run | " + " | ".join(f"B_noise {n}" for n in names) + " | "
           + " | ".join(f"loss {n}" for n in names) + " |",
           "|---|" + "---:|" * (2 * quarters)]
  for k, order in sorted(groups):
    profiles = groups[(k, order)]
    over_seeds = lambda key, q: finite_median(p[key][q] for p in profiles)
    label = _PROFILE_LABELS[order].format(k=k)
    lines.append(f"| {label}, {len(profiles)} seeds | "
                 + " | ".join(_number(over_seeds("noise_scale", q), ",.0f") for q in range(quarters))
                 + " | " + " | ".join(_number(over_seeds("loss", q), ".3f") for q in range(quarters))
                 + " |")
  return ("Median gradient noise scale B_noise (examples) and train loss in each quarter "
          "of the progress (the median over seeds).\n\n" + "\n".join(lines))


def _number(value: float, spec: str) -> str:
  return format(value, spec) if math.isfinite(value) else "–"


def _bar_lines(entries: Sequence[Mapping[str, Any]], tolerance: float) -> str:
  if not any(e["strategy"] == "adaptive" for e in entries):
    return ""
  bar = bar_check(entries, tolerance)
  baseline = next(e for e in entries if e["strategy"] == "baseline")
  lines = [f"Baseline: {baseline['accuracy']:.2f} ± {baseline['accuracy_std']:.2f}% in "
           f"{baseline['steps']:,.0f} steps ({baseline['seeds']} seeds); target for "
           f"'steps to target': {baseline['target']:.2f}%; its B_noise median "
           f"{baseline['noise_scale_median']:,.0f} examples."]
  misses = bar["accuracy_misses"]
  lines.append(f"- DATE within {tolerance:g} point of the baseline at every k: "
               + ("yes" if not misses else f"no, misses at k = {misses}"))
  if bar["steps_ratio_64x"] is not None:
    ratio = bar["steps_ratio_64x"]
    lines.append(f"- DATE's steps at 64x: {ratio:.3f} of the baseline's "
                 f"({'≤' if ratio <= 0.1 else '>'} 1/10)")
  misses = bar["prediction_misses"]
  lines.append("- predicted steps within 25% at every k: "
               + ("yes" if not misses else f"no, off at k = {misses}"))
  return "\n".join(lines)


def growth_report(rows: Sequence[Mapping[str, Any]], tolerance: float = BAR_TOLERANCE) -> str:
  """Grown batches against fixed ones at the same maximum k: steps, examples, accuracy.

  Per workload and k with both strategies: the means over seeds, the ratios
  grown/fixed, and the accuracy against the baseline's (the growth study's bar reads
  these at 64x: ≤ 1.3x the steps, ≤ 0.6x (LSTM) or 0.5x (ResNet) the examples,
  within `tolerance` points). "dominated" counts the grown runs (seeds) for
  which some fixed-batch run of the workload, at any k, took as few steps
  with fewer examples: the Pareto claim wants 0. The wall seconds (means) say
  what the trade is worth where a step's time follows its examples (a CPU).
  """
  lines = ["| workload | k | seeds | fixed steps | grown steps | steps ratio | fixed examples x B0·T0 "
           "| grown examples x B0·T0 | examples ratio | grown accuracy vs baseline | largest batch "
           "| dominated | fixed wall s | grown wall s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  mean = lambda members, key: statistics.mean(r[key] for r in members)
  for workload in sorted({r["workload"] for r in rows}):
    of = lambda strategy, k=None: [r for r in rows if r["workload"] == workload
                                   and r["strategy"] == strategy and k in (None, r["multiple"])]
    baselines = of("baseline")
    for k in sorted({r["multiple"] for r in of("adaptive_grow")}):
      fixed, grown = of("adaptive", k), of("adaptive_grow", k)
      if not fixed or not baselines:
        continue
      budget = baselines[0]["steps"] * baselines[0]["batch"]
      accuracy = 100 * (mean(grown, "final_accuracy") - mean(baselines, "final_accuracy"))
      lines.append(
          f"| {workload} | {k} | {len(grown)} | {mean(fixed, 'steps'):,.0f} "
          f"| {mean(grown, 'steps'):,.0f} | {mean(grown, 'steps') / mean(fixed, 'steps'):.2f} "
          f"| {mean(fixed, 'examples') / budget:.2f} | {mean(grown, 'examples') / budget:.2f} "
          f"| {mean(grown, 'examples') / mean(fixed, 'examples'):.2f} | {accuracy:+.2f} points "
          f"| {max(r.get('largest_batch', r['batch']) for r in grown):,} "
          f"| {sum(dominated(run, of('adaptive')) for run in grown)}/{len(grown)} "
          f"| {mean(fixed, 'wall_seconds'):,.0f} | {mean(grown, 'wall_seconds'):,.0f} |")
  return "\n".join(lines) if len(lines) > 2 else ""


# Points of the progress at which `law_report` reads a measured profile (the study's
# baselines log ~375; 100 keep a bin's median over a few logged values).
LAW_POINTS = 100


def law_report(runner: Study, rows: Sequence[Mapping[str, Any]]) -> str:
  """Markdown: McCandlish's law on the noise-scale profile each DATE strategy measured.

  Per workload and k with grown runs: the profile of the fixed runs and that of the grown
  runs (the median over seeds at `LAW_POINTS` points of the progress, from the runs'
  `metrics.jsonl`), each played out by `planner_lib.plan_predicted_budget` for the grown recipe
  and the fixed one (the runs' `recipe.json`), beside what the runs took. The law predicts
  a run from the profile it measures; a bar set on the fixed runs' profile is within a
  grown run's reach only if the grown run measures that profile (docs/results/growth_study.md).
  Runs whose workdir is gone are left out.
  """
  lines = ["| workload | k | profile measured by | its B_noise by quarter | law: grown "
           "| law: fixed | measured: steps, examples x B0·T0 |", "|---|---:|---|---|---|---|---|"]
  for workload in sorted({r["workload"] for r in rows}):
    baselines = [r for r in rows if r["workload"] == workload and r["strategy"] == "baseline"]
    if not baselines:
      continue
    base_steps = statistics.mean(r["steps"] for r in baselines)
    budget = baselines[0]["steps"] * baselines[0]["batch"]
    for k in sorted({r["multiple"] for r in rows if r["workload"] == workload
                     and r["strategy"] == "adaptive_grow"}):
      measured = {s: _measured_runs(runner, rows, workload, s, k, base_steps)
                  for s in ("adaptive", "adaptive_grow")}
      if not all(measured.values()):
        continue
      recipes = {s: runs[0][1] for s, runs in measured.items()}
      for strategy, runs in measured.items():
        profile = filled_profile([finite_median(p[i] for _, _, p in runs)
                                  for i in range(LAW_POINTS)])
        grown, fixed = (planner_lib.plan_predicted_budget(recipes[s], profile,
                                                   read_at_batch_size=recipes[s].batch_size)
                        for s in ("adaptive_grow", "adaptive"))
        quarters = [statistics.median(profile[q * LAW_POINTS // 4:(q + 1) * LAW_POINTS // 4])
                    for q in range(4)]
        steps = statistics.mean(row["steps"] for row, _, _ in runs)
        examples = statistics.mean(row["examples"] for row, _, _ in runs) / budget
        lines.append(
            f"| {workload} | {k} | {'grown' if strategy == 'adaptive_grow' else 'fixed'} runs "
            f"({len(runs)}) | {' / '.join(f'{v:,.0f}' for v in quarters)} "
            f"| {grown['steps']:,} steps, {grown['examples_vs_baseline']:.2f}x "
            f"| {fixed['steps']:,} steps, {fixed['examples_vs_baseline']:.2f}x "
            f"| {steps:,.0f}, {examples:.2f}x |")
  return "\n".join(lines) if len(lines) > 2 else ""


def prediction_report(runner: Study, rows: Sequence[Mapping[str, Any]]) -> str:
  """Markdown: DATE's prediction before training, against what its runs took.

  Per workload, k and DATE strategy: each run's planned recipe (its config, from
  `runner.config_for`) and the profile it was planned with (its baseline's logged
  B_noise, in `rows`), played out by `planner_lib.plan_predicted_budget` as the planner
  predicts before training; the means over seeds beside the runs'. It needs the
  rows and the workloads' configs only, not the runs' folders.
  """
  lines = ["| workload | k | strategy | predicted steps | measured steps | error "
           "| predicted examples x B0·T0 | measured examples x B0·T0 |",
           "|---|---:|---|---:|---:|---:|---:|---:|"]
  for workload in sorted({r["workload"] for r in rows} & set(runner.configs)):
    baselines = [r for r in rows if r["workload"] == workload and r["strategy"] == "baseline"]
    if not baselines:
      continue
    budget = baselines[0]["steps"] * baselines[0]["batch"]
    for k, strategy in sorted({(r["multiple"], r["strategy"]) for r in rows
                               if r["workload"] == workload
                               and r["strategy"] in ADAPTIVE_STRATEGIES}):
      runs = [r for r in rows if (r["workload"], r["strategy"], r["multiple"])
              == (workload, strategy, k)]
      laws = [_predicted_budget(runner, Cell(workload, strategy, k, r["seed"])) for r in runs]
      if None in laws:
        continue
      steps = statistics.mean(r["steps"] for r in runs)
      law_steps = statistics.mean(law["steps"] for law in laws)
      lines.append(
          f"| {workload} | {k} | {STRATEGIES[strategy]} | {law_steps:,.0f} | {steps:,.0f} "
          f"| {round(law_steps / steps - 1, 2) + 0.0:+.0%} "  # + 0.0: no "-0%"
          f"| {statistics.mean(law['examples'] for law in laws) / budget:.2f} "
          f"| {statistics.mean(r['examples'] for r in runs) / budget:.2f} |")
  return "\n".join(lines) if len(lines) > 2 else ""


def _predicted_budget(runner: Study, cell: Cell) -> dict[str, float] | None:
  """What `date.plan` predicts for `cell` before training; None without a baseline profile."""
  config = runner.config_for(cell)
  noise = config_lib.to_dict(config.plan).get("noise_scale")
  if not noise:
    return None
  _, recipe = experiment.plan_recipe(config, runner.num_train_examples(cell.workload))
  return planner_lib.plan_predicted_budget(recipe, noise)


def _measured_runs(runner: Study, rows: Sequence[Mapping[str, Any]], workload: str,
                   strategy: str, k: int, base_steps: float
                   ) -> list[tuple[Mapping[str, Any], date.Recipe, list[float]]]:
  """(row, planned recipe, noise profile at LAW_POINTS) of each run of a cell whose
  workdir holds its metrics and recipe."""
  runs = []
  for row in rows:
    if (row["workload"], row["strategy"], row["multiple"]) != (workload, strategy, k):
      continue
    run = read_run(runner.workdir(Cell(workload, strategy, k, row["seed"])))
    if run is not None:
      recipe, metric_rows = run
      profile = progress_profile(read_as_largest(metric_rows, recipe), base_steps,
                                 quarters=LAW_POINTS)["noise_scale"]
      runs.append((row, recipe, profile))
  return runs


def read_run(folder: str) -> tuple[date.Recipe, list[dict[str, Any]]] | None:
  """The planned recipe (`recipe.json`) and the logged rows (`metrics.jsonl`) of the trainer
  run in `folder`; None when either file is missing.

  Example:
    >>> read_run("/no/such/run") is None
    True
  """
  metrics_path, recipe_path = (os.path.join(folder, name)
                               for name in ("metrics.jsonl", "recipe.json"))
  if not (os.path.exists(metrics_path) and os.path.exists(recipe_path)):
    return None
  with open(recipe_path, encoding="utf-8") as f:
    recipe = recipe_record.stored_recipe(json.load(f)["planned"])
  return recipe, metrics.read_metrics(metrics_path)


def dominated(run: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> bool:
  """Whether one of `others` took at most `run`'s steps with fewer examples (Pareto).

  Example:
    >>> dominated({"steps": 900, "examples": 5e5}, [{"steps": 850, "examples": 4e5}])
    True
  """
  return any(o["steps"] <= run["steps"] and o["examples"] < run["examples"] for o in others)
