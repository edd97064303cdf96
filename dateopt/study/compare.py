"""DATE against the field's batch schedules: one grid, each method's frontier, one table.

Every method gets the same largest batch (B0·64 by default) and, where it has
free parameters, the same small sweep: 3 settings of its main one and budgets
of 1×, 2× and 3× the baseline's examples, 1 seed each; the best run of each
method (the fewest steps among those at the baseline's quality) then runs 2
more seeds. DATE (fixed and grown) chooses its own budget and runs 3 seeds.

  * static LEGW at 64x: the budget is its free parameter;
  * "linear_ramp": the ramp's share of the examples, 5%, 20%, 50% (from B_max/8
    in increments of B_max/8, the LR B_max's);
  * "doubling": the share of the examples over which it doubles up to B_max,
    5%, 20%, 50% (from B0, LR × √2 a doubling);
  * "seesaw", "batch_for_decay": the first batch, 1, 4 or 16 × B0 (α = 1/2).

A method's frontier is the lower envelope of its runs at the baseline's
quality (final accuracy within 1 point of the baseline's mean; on a language
model, validation loss within 1% of it) in steps against examples, read between
two runs by log-log interpolation. The comparison's question: does DATE grown
take fewer steps than each method's frontier at DATE's examples?

Example:
  >>> cells = comparison_grid(["lstm"], seeds=(0,))
  >>> len(cells), cells[-1].key
  (42, 'lstm/batch_for_decay/64x/start16x/budget3x/seed0')
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from dateopt.study.cells import BAR_TOLERANCE, STRATEGIES, Cell, is_ablation, setting_options

#: Each method with free parameters: its main parameter's settings (`Cell.setting`).
SWEEPS: dict[str, tuple[str, ...]] = {
    "legw": ("",),
    "linear_ramp": ("ramp0.05", "ramp0.2", "ramp0.5"),
    "doubling": ("ramp0.05", "ramp0.2", "ramp0.5"),
    "seesaw": ("start1x", "start4x", "start16x"),
    "batch_for_decay": ("start1x", "start4x", "start16x"),
}
BUDGETS = (1.0, 2.0, 3.0)
#: DATE's methods: no free parameter, every seed runs.
DATE_METHODS = ("adaptive", "adaptive_grow")
METHODS = DATE_METHODS + tuple(SWEEPS)
LOSS_TOLERANCE = 0.01  # a language model's bar: validation loss within 1% of the baseline's
STEP_RATIO_BAR = 0.9  # DATE grown's steps over every other method's frontier at its examples


def comparison_grid(workloads: Sequence[str], *, multiple: int = 64,
                    seeds: Sequence[int] = (0, 1, 2), budgets: Sequence[float] = BUDGETS,
                    methods: Sequence[str] = METHODS) -> list[Cell]:
  """The comparison's cells in run order: baselines, DATE, then each method's sweep (seed
  `seeds[0]`); `reseeded` adds the other seeds of each method's best run."""
  cells = []
  for workload in workloads:
    cells += [Cell(workload, "baseline", 1, seed) for seed in seeds]
    cells += [Cell(workload, m, multiple, seed) for m in DATE_METHODS if m in methods
              for seed in seeds]
    for method in (m for m in SWEEPS if m in methods):
      cells += [Cell(workload, method, multiple, seeds[0], setting, float(budget))
                for setting in SWEEPS[method] if _fits(setting, multiple)
                for budget in budgets]
  return cells


def _fits(setting: str, multiple: int) -> bool:
  """Whether a first batch of `setting` ("start16x") is within the largest batch."""
  return setting_options(setting, 1).get("start_batch", 1) <= multiple


def quality(row: Mapping[str, Any]) -> float:
  """The run's quality: final accuracy, or (a language model) minus its validation loss; −∞
  for a run the watch gave up (`cells.gave_up_row`), which is never at a bar."""
  if row.get("gave_up"):
    return -math.inf
  return -row["final_loss"] if "final_loss" in row else row["final_accuracy"]


def quality_bar(rows: Sequence[Mapping[str, Any]], workload: str) -> float:
  """The lowest `quality` counted on a frontier: the baseline's mean accuracy less 1 point, or
  its mean validation loss plus 1%."""
  baselines = [r for r in rows if r["workload"] == workload and r["strategy"] == "baseline"]
  if not baselines:
    raise ValueError(f"no finished baseline run of workload {workload!r}.")
  if "final_loss" in baselines[0]:
    return -statistics.mean(r["final_loss"] for r in baselines) * (1 + LOSS_TOLERANCE)
  return statistics.mean(r["final_accuracy"] for r in baselines) - BAR_TOLERANCE / 100


def reseeded(rows: Sequence[Mapping[str, Any]], seeds: Sequence[int] = (1, 2)) -> list[Cell]:
  """The other seeds of each swept method's best run (`best_run`), and of any of its runs
  that takes no more steps than a DATE grown run with fewer examples (does it hold on other
  seeds?), per workload. An ablation's runs (`dateopt.study.ablation`) are left out."""
  rows = [r for r in rows if not is_ablation(r)]
  cells = []
  for workload in sorted({r["workload"] for r in rows}):
    grown = [r for r in rows if r["workload"] == workload and r["strategy"] == "adaptive_grow"]
    bar = quality_bar(rows, workload) if grown else math.inf
    for method in SWEEPS:
      best = best_run(rows, workload, method)
      chosen = [best] if best is not None else []
      chosen += [r for r in rows if r["workload"] == workload and r["strategy"] == method
                 and quality(r) >= bar and r is not best
                 and any(r["steps"] <= g["steps"] and r["examples"] < g["examples"]
                         for g in grown)]
      for run in chosen:
        cells += [Cell(workload, method, run["multiple"], seed, run.get("setting", ""),
                       float(run.get("budget", 1.0))) for seed in seeds
                  if seed != run["seed"]]
  return list(dict.fromkeys(cells))


def best_run(rows: Sequence[Mapping[str, Any]], workload: str, method: str
             ) -> Mapping[str, Any] | None:
  """A method's first-seed run with the fewest steps at the quality bar; with none there,
  its best in quality."""
  runs = [r for r in rows if r["workload"] == workload and r["strategy"] == method]
  if not runs:
    return None
  first = min(r["seed"] for r in runs)
  runs = [r for r in runs if r["seed"] == first]
  bar = quality_bar(rows, workload)
  passing = [r for r in runs if quality(r) >= bar]
  if passing:
    return min(passing, key=lambda r: (r["steps"], r["examples"]))
  return max(runs, key=quality)


def envelope(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
  """The lower envelope of (examples, steps) points: those that no point with fewer or as
  many examples beats in steps, by increasing examples.

  Example:
    >>> envelope([(3, 10), (1, 40), (2, 50), (2, 20)])
    [(1, 40), (2, 20), (3, 10)]
  """
  frontier: list[tuple[float, float]] = []
  for examples, steps in sorted(points):
    if not frontier or steps < frontier[-1][1]:
      if frontier and frontier[-1][0] == examples:
        frontier.pop()
      frontier.append((examples, steps))
  return frontier


def envelope_steps(frontier: Sequence[tuple[float, float]], examples: float) -> float | None:
  """The frontier's steps at `examples`: log-log between its two neighbours, its last
  point's beyond it; None below its first (no run reached the quality with so few).

  Example:
    >>> round(envelope_steps([(100, 400), (400, 100)], 200), 6)
    200.0
  """
  if not frontier or examples < frontier[0][0]:
    return None
  for (e0, s0), (e1, s1) in zip(frontier, frontier[1:]):
    if e0 <= examples <= e1:
      share = math.log(examples / e0) / math.log(e1 / e0)
      return math.exp(math.log(s0) + share * math.log(s1 / s0))
  return float(frontier[-1][1])


def method_points(rows: Sequence[Mapping[str, Any]], workload: str, method: str, *,
                  bar: float) -> list[tuple[float, float]]:
  """(examples, steps) of a method's runs at the quality bar, every seed."""
  return [(r["examples"], r["steps"]) for r in rows
          if r["workload"] == workload and r["strategy"] == method and quality(r) >= bar]


def summarize_comparison(rows: Sequence[Mapping[str, Any]], multiple: int = 64
                         ) -> list[dict[str, Any]]:
  """One entry per (workload, method): its best run and 3-seed means, its runs at the bar,
  and DATE grown's steps over its frontier at DATE grown's mean examples. Only the
  baselines and the runs at `multiple` count, and no ablation's (`dateopt.study.ablation`)."""
  rows = [r for r in rows if r["multiple"] in (1, multiple) and not is_ablation(r)
          and not r.get("gave_up")]  # listed apart by the report
  entries = []
  for workload in sorted({r["workload"] for r in rows}):
    bar = quality_bar(rows, workload)
    base = [r for r in rows if r["workload"] == workload and r["strategy"] == "baseline"]
    base_examples = statistics.mean(r["examples"] for r in base)
    grown = [r for r in rows if r["workload"] == workload and r["strategy"] == "adaptive_grow"]
    date_examples = statistics.mean(r["examples"] for r in grown) if grown else math.nan
    date_steps = statistics.mean(r["steps"] for r in grown) if grown else math.nan
    for method in ("baseline",) + METHODS:
      runs = [r for r in rows if r["workload"] == workload and r["strategy"] == method]
      if not runs:
        continue
      best = runs if method in DATE_METHODS + ("baseline",) else _seeds_of(
          runs, best_run(rows, workload, method))
      frontier = envelope(method_points(rows, workload, method, bar=bar))
      at_date = envelope_steps(frontier, date_examples) if grown else None
      entries.append({
          "workload": workload, "method": method, "label": STRATEGIES[method],
          "runs": len(runs), "at_bar": sum(quality(r) >= bar for r in runs),
          "setting": _setting_text(best[0]), "seeds": len(best),
          "steps": statistics.mean(r["steps"] for r in best),
          "examples_x": statistics.mean(r["examples"] for r in best) / base_examples,
          "quality": statistics.mean(quality(r) for r in best),
          "quality_sd": statistics.stdev([quality(r) for r in best]) if len(best) > 1 else 0.0,
          "is_loss": "final_loss" in runs[0], "bar": bar,
          "frontier_at_date": at_date,
          "date_over_frontier": (date_steps / at_date) if at_date else None,
          "dominates_date": sorted({r["key"] for r in runs for g in grown
                                    if quality(r) >= bar and r["steps"] <= g["steps"]
                                    and r["examples"] < g["examples"]}),
          "skips": sum(int(r.get("guard_skipped", 0)) for r in runs),
      })
  return entries


def _seeds_of(runs: Sequence[Mapping[str, Any]], best: Mapping[str, Any] | None
              ) -> list[Mapping[str, Any]]:
  """Every seed's run of `best`'s setting and budget."""
  if best is None:
    return list(runs)
  same = [r for r in runs if r.get("setting", "") == best.get("setting", "")
          and r.get("budget", 1.0) == best.get("budget", 1.0)]
  return same


def _setting_text(row: Mapping[str, Any]) -> str:
  parts = [row.get("setting", "")] + (
      [f"budget {row['budget']:g}×"] if row.get("budget", 1.0) != 1.0 else [])
  return ", ".join(p for p in parts if p) or "—"


def comparison_report(entries: Sequence[Mapping[str, Any]]) -> str:
  """The comparison's markdown: per workload, each method's best run and its frontier
  against DATE grown, and the bar's verdict."""
  parts = []
  for workload in sorted({e["workload"] for e in entries}):
    rows = [e for e in entries if e["workload"] == workload]
    is_loss = rows[0]["is_loss"]
    what = "validation loss (nats)" if is_loss else "accuracy %"
    lines = [f"#### {workload}", "",
             f"| method | best setting | seeds | steps | examples × | {what} | runs at the bar "
             f"| DATE grown ÷ frontier at DATE's examples | guard skips |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for e in rows:
      value = -e["quality"] if is_loss else 100 * e["quality"]
      spread = e["quality_sd"] if is_loss else 100 * e["quality_sd"]
      ratio = ("—" if e["method"] in ("baseline", "adaptive_grow")
               else "no run at the bar with ≤ DATE's examples" if e["date_over_frontier"] is None
               else f"{e['date_over_frontier']:.2f} (of {e['frontier_at_date']:,.0f})")
      digits = 4 if is_loss else 2
      lines.append(f"| {e['label']} | {e['setting']} | {e['seeds']} | {e['steps']:,.0f} | "
                   f"{e['examples_x']:.2f} | {value:.{digits}f} ± {spread:.{digits}f} | "
                   f"{e['at_bar']}/{e['runs']} | {ratio} | {e['skips']} |")
    lines.append("")
    lines.append(_verdict(rows))
    parts.append("\n".join(lines))
  return "\n\n".join(parts)


def _verdict(rows: Sequence[Mapping[str, Any]]) -> str:
  """Whether DATE grown holds the bar on this workload, and where it does not."""
  grown = next((e for e in rows if e["method"] == "adaptive_grow"), None)
  if grown is None:
    return "DATE grown has no finished run here."
  if grown["at_bar"] < grown["runs"]:
    return (f"DATE grown misses the quality bar ({grown['at_bar']} of its {grown['runs']} runs "
            f"at it): no comparison of steps holds.")
  others = [e for e in rows if e["method"] not in ("baseline", "adaptive_grow")]
  if not others:
    return "No other method has finished runs here: nothing to compare DATE grown with."
  compared = [e for e in others if e["date_over_frontier"] is not None]
  beaten = [e["label"] for e in compared if e["date_over_frontier"] > STEP_RATIO_BAR]
  dominating = sorted({key for e in others for key in e["dominates_date"]})
  unreached = [e["label"] for e in others if e["date_over_frontier"] is None]
  text = (f"DATE grown takes at most {STEP_RATIO_BAR} × every other method's frontier at its "
          f"examples: {'yes' if not beaten else 'no, not against ' + ', '.join(beaten)}"
          + (f" (no run of {', '.join(unreached)} reaches the bar with as few examples)"
             if unreached else "") + ". ")
  text += ("No run of another method dominates a DATE grown run." if not dominating else
           f"Runs that dominate a DATE grown run: {', '.join(dominating)}.")
  return text


def health_report(rows: Sequence[Mapping[str, Any]]) -> str:
  """One line per run: its guard skips, the peak LR it applied and its training loss's
  trend at the end (`dateopt.study.cells.run_health`)."""
  lines = ["| run | steps | examples | quality | guard skips | peak LR applied | "
           "train loss, last quarter ÷ third |", "|---|---:|---:|---:|---:|---:|---:|"]
  for row in sorted(rows, key=lambda r: r["key"]):
    value = (f"{row['final_loss']:.4f} nats" if "final_loss" in row
             else f"{100 * row['final_accuracy']:.2f}%")
    lines.append(f"| {row['key']} | {row['steps']:,} | {row['examples']:,} | {value} | "
                 f"{row.get('guard_skipped', 0)} | {_known(row.get('peak_lr'), '.4g')} | "
                 f"{_known(row.get('loss_trend'), '.2f')} |")
  return "\n".join(lines)


def _known(value: float | None, spec: str) -> str:
  """`value` formatted, or "—" where the run's log does not say (too few logged losses for
  a trend, or a row from before its workdir's metrics were read)."""
  if value is None or math.isnan(value):
    return "—"
  return format(value, spec)
