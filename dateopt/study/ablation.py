"""What each of DATE's engine rules buys: each switched off in turn, DATE fixed and grown.

Every rule of `dateopt.date._progress.ENGINE_RULES` runs off (a cell with the setting
"off:<rule>", `config.engine_rules_off`) on DATE's 64× fixed and grown cells, 3 seeds
each, against the same cells with every rule on, which the comparison
(`dateopt.study.compare`) runs too, so one outdir holds both and the baselines are shared.
Each rule's row says what switching it off changed, as 3-seed means: steps and examples
(relative to every rule on, on the same seeds), quality (accuracy, or validation loss on a
language model), the runs at the comparison's quality bar, and the runs the watch called
diverged at least once (with every rule on, the study's runs are healthy: there, false
alarms). A fixed batch runs no rule that only a ladder has (`LADDER_RULES`).

Example:
  >>> cells = ablation_grid(["lstm"], rules=("rising_hold", "early_climb"), seeds=(0,))
  >>> [c.key for c in cells]  # doctest: +NORMALIZE_WHITESPACE
  ['lstm/baseline/1x/seed0', 'lstm/adaptive/64x/seed0', 'lstm/adaptive_grow/64x/seed0',
   'lstm/adaptive/64x/off:rising_hold/seed0', 'lstm/adaptive_grow/64x/off:rising_hold/seed0',
   'lstm/adaptive_grow/64x/off:early_climb/seed0']
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from dateopt.date._progress import ENGINE_RULES, LADDER_RULES
from dateopt.study.cells import ABLATION_PREFIX, STRATEGIES, Cell, is_ablation
from dateopt.study.compare import DATE_METHODS, quality, quality_bar



def ablation_grid(workloads: Sequence[str], *, rules: Sequence[str] = ENGINE_RULES,
                  multiple: int = 64, seeds: Sequence[int] = (0, 1, 2),
                  methods: Sequence[str] = DATE_METHODS) -> list[Cell]:
  """The cells in run order: baselines, DATE with every rule on, then each rule off; on the
  DATE `methods` given (fixed "adaptive", grown "adaptive_grow", or both)."""
  unknown = sorted(set(rules) - set(ENGINE_RULES))
  if unknown:
    raise ValueError(f"rules: unknown {unknown}; allowed: {', '.join(ENGINE_RULES)}.")
  wrong = sorted(set(methods) - set(DATE_METHODS))
  if wrong or not methods:
    raise ValueError(f"methods: {wrong or 'none'} given; allowed: a non-empty subset of "
                     f"{', '.join(DATE_METHODS)}.")
  cells = []
  for workload in workloads:
    cells += [Cell(workload, "baseline", 1, seed) for seed in seeds]
    for setting in ("",) + tuple(ABLATION_PREFIX + rule for rule in rules):
      ran = [m for m in methods if m == "adaptive_grow"
             or setting[len(ABLATION_PREFIX):] not in LADDER_RULES]
      cells += [Cell(workload, method, multiple, seed, setting)
                for method in ran for seed in seeds]
  return cells


def summarize_ablation(rows: Sequence[Mapping[str, Any]], multiple: int = 64
                       ) -> list[dict[str, Any]]:
  """One entry per (workload, DATE method, rule off), "" for every rule on: 3-seed means,
  and steps and examples relative to every rule on."""
  entries = []
  for workload in sorted({r["workload"] for r in rows if is_ablation(r)}):
    bar = quality_bar(rows, workload)
    for method in DATE_METHODS:
      runs = [r for r in rows if r["workload"] == workload and r["strategy"] == method
              and r["multiple"] == multiple]
      settings = sorted({r.get("setting", "") for r in runs})
      for setting in settings:
        mine = [r for r in runs if r.get("setting", "") == setting]
        seeds = {r["seed"] for r in mine}  # the reference on the same seeds
        reference = _means([r for r in runs if not r.get("setting", "") and r["seed"] in seeds],
                           bar)
        means = _means(mine, bar)
        relative = {f"{k}_vs_all_on": means[k] / reference[k] if reference else None
                    for k in ("steps", "examples")}
        entries.append({"workload": workload, "method": method, "label": STRATEGIES[method],
                        "rule": setting[len(ABLATION_PREFIX):], **means, **relative})
  return entries


def _means(runs: Sequence[Mapping[str, Any]], bar: float) -> dict[str, Any]:
  """The runs' mean steps, examples and quality, with how many were at the bar or diverged."""
  if not runs:
    return {}
  finished = [quality(r) for r in runs if not r.get("gave_up")]
  return {"seeds": len(runs), "steps": statistics.mean(r["steps"] for r in runs),
          "examples": statistics.mean(r["examples"] for r in runs),
          # Over the runs that finished (a given-up run's is −∞): `gave_up` counts the others.
          "quality": statistics.mean(finished) if finished else math.nan,
          "gave_up": len(runs) - len(finished),
          "is_loss": "final_loss" in runs[0],
          "at_bar": sum(quality(r) >= bar for r in runs),
          # None: runs logged before the watch's divergences were (unknown, not 0).
          "diverged": (sum(int(r["divergences"]) > 0 for r in runs)
                       if all("divergences" in r for r in runs) else None)}


def ablation_report(entries: Sequence[Mapping[str, Any]]) -> str:
  """The ablation's markdown: per workload and DATE method, one row per rule switched off."""
  parts = []
  for workload, method in dict.fromkeys((e["workload"], e["method"]) for e in entries):
    rows = [e for e in entries if e["workload"] == workload and e["method"] == method]
    what = "validation loss (nats)" if rows[0]["is_loss"] else "accuracy %"
    lines = [f"#### {workload}: {rows[0]['label']}", "",
             f"| rule off | seeds | steps | × all on | examples × all on | {what} | "
             f"runs at the bar | runs the watch called diverged | runs it gave up |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in sorted(rows, key=lambda e: (e["rule"] != "", e["rule"])):
      value = f"{-e['quality']:.4f}" if e["is_loss"] else f"{100 * e['quality']:.2f}"
      ratio = lambda key: "—" if e[key] is None else f"{e[key]:.2f}"
      diverged = "—" if e["diverged"] is None else f"{e['diverged']}/{e['seeds']}"
      lines.append(f"| {e['rule'] or '(every rule on)'} | {e['seeds']} | {e['steps']:,.0f} | "
                   f"{ratio('steps_vs_all_on')} | {ratio('examples_vs_all_on')} | {value} | "
                   f"{e['at_bar']}/{e['seeds']} | {diverged} | {e['gave_up']}/{e['seeds']} |")
    parts.append("\n".join(lines))
  return "\n\n".join(parts)
