"""DATE's adaptive engine, step by step: what each step showed it and what it decided
(`engine.jsonl`), and the check that its code, re-run on those readings, decides the same
(`replay_run`).

An adaptive run writes one row a step to `workdir/engine.jsonl`: the step's
`Observation` (squared gradient norms and their batches, loss, the guard's LR
share, whether the gradient and the update were finite) and the engine's
decisions after it (`dateopt.date._progress.DECISIONS`: phase, gain, progress,
next batch, ...). A non-finite float is written as the string "nan", "inf" or
"-inf", so a replay reads back the exact value. A resumed run keeps the rows up
to its checkpoint, as `metrics.jsonl` does.

Example:
  >>> from dateopt import train
  >>> report = train.replay_run("runs/lm_grown")   # a finished or killed adaptive run
  >>> report.exact, report.steps, report.first_mismatch
  (True, 405, None)
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import sys
from typing import Any, Mapping, Sequence

import numpy as np

from dateopt import metrics_io
from dateopt.date import _builder as builder_lib
from dateopt.date import _progress as progress_lib
from dateopt.date._engine_config import EngineConfig
from dateopt.train import metrics as metrics_lib
from dateopt.train import parallel, recipe_record, workdirs

ENGINE_FILE = "engine.jsonl"
PREFIX = "engine/"  # the step's metrics that go to ENGINE_FILE, not to metrics.jsonl


def engine_metrics(adaptive: progress_lib.AdaptiveState) -> dict[str, Any]:
  """What `engine.jsonl` records of a step, from the engine's state after it (arrays)."""
  decided = {"phase": adaptive.phase, "gain": adaptive.gain, "progress": adaptive.progress,
             "batch_size": adaptive.batch_size, "count": adaptive.count,
             "diverged_steps": adaptive.watch.diverged_steps,
             "gave_up": adaptive.watch.gave_up}
  return {PREFIX + name: value
          for name, value in {**adaptive.observation._asdict(), **decided}.items()}


def _json_value(value: np.ndarray) -> Any:
  """A recorded value as exact JSON: ints and bools as such, a float's non-finite value as a
  string (float32 values are exact as JSON's float64)."""
  if value.dtype == np.bool_:
    return bool(value)
  if np.issubdtype(value.dtype, np.integer):
    return int(value)
  number = float(value)
  return number if math.isfinite(number) else str(number)


class EngineLog:
  """`engine.jsonl`'s writer: a row for each step the engine took or skipped.

  `record(step, metrics)` keeps the step's `engine_metrics` on the device, with no wait for
  the step; every `WRITE_EVERY` steps, and at `flush()` (the trainer calls it after each
  checkpoint) and `close()`, the kept rows come to the host and are written. A step the
  trainer computed after the run was done (its count is -1) is dropped. Only the lead
  process writes, as with `metrics.jsonl`.
  """

  WRITE_EVERY = 100

  def __init__(self, workdir: str | os.PathLike, *, enabled: bool, start_step: int = 0):
    self._jsonl = (metrics_lib.JsonlWriter(workdir, start_step=start_step, filename=ENGINE_FILE)
                   if enabled else None)
    self._kept: list[tuple[int, dict[str, Any]]] = []

  def record(self, step: int, metrics: Mapping[str, Any]) -> None:
    if self._jsonl is None:
      return
    row = {k[len(PREFIX):]: v for k, v in metrics.items() if k.startswith(PREFIX)}
    if row:
      self._kept.append((step, row))
    if len(self._kept) >= self.WRITE_EVERY:
      self._write()

  def _write(self) -> None:
    kept, self._kept = parallel.to_host(self._kept), []
    for step, row in kept:
      if int(row["count"]) >= 0:
        self._jsonl.write_row(step, {k: _json_value(np.asarray(v)) for k, v in row.items()})

  def flush(self) -> None:
    if self._jsonl is not None:
      self._write()
      self._jsonl.flush()

  def close(self) -> None:
    if self._jsonl is not None:
      self._write()
      self._jsonl.close()


@dataclasses.dataclass(frozen=True)
class ReplayReport:
  """`replay_run`'s answer: the steps replayed, whether every decision came out the same,
  and where the first did not (`(step, {decision: (recorded, replayed)})`); the readings,
  schedule and settings it replayed (what a replay with a rule off needs)."""
  steps: int
  exact: bool
  first_mismatch: tuple[int, dict[str, tuple[Any, Any]]] | None
  replayed: list[dict[str, Any]]
  rows: list[dict[str, Any]]
  schedule: Any
  settings: dict[str, Any]


def replay_run(workdir: str | os.PathLike) -> ReplayReport:
  """Re-runs DATE's engine on an adaptive run's recorded readings (`engine.jsonl`) with the
  settings in its `recipe.json`, and compares each step's decisions with the recorded ones.

  `dateopt-replay WORKDIR` prints the answer. Raises
  FileNotFoundError naming the file when the workdir has no adaptive run's records.
  """
  root = workdirs.as_path(workdir)
  stored = json.loads((root / recipe_record.RECIPE_FILE).read_text())
  if stored.get("engine") is None:
    raise FileNotFoundError(f"{root / recipe_record.RECIPE_FILE} records no adaptive engine "
                            f"(a static or scheduled run, or one written before the engine "
                            f"settings were recorded): nothing to replay.")
  rows = _engine_rows(root)
  _check_rows(rows, root / ENGINE_FILE)
  schedule, settings = _recorded_engine(stored)
  replayed = progress_lib.replay(rows, schedule, **settings)
  first = next(((int(row["step"]), diff) for row, again in zip(rows, replayed)
                if (diff := _differences(row, again))), None)
  return ReplayReport(len(rows), first is None, first, replayed, rows, schedule, settings)


def _recorded_engine(stored: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
  """The baseline's schedule and `adaptive`'s settings a `recipe.json` records.

  A record from before `date.EngineConfig` held the EMA decays and the patience as
  settings of their own; the config they came from is read back from them.
  """
  schedule = builder_lib.build_schedule(recipe_record.stored_recipe(stored["planned"]))
  settings = dict(stored["engine"], rules_off=tuple(stored["engine"]["rules_off"]))
  if "noise_decay" in settings:
    every = int((stored.get("run") or {}).get("measure_every_steps", 1))
    settings = _settings_before_the_config(settings, every)
  return schedule, settings


def _settings_before_the_config(settings: Mapping[str, Any], every: int) -> dict[str, Any]:
  """Old settings as `config`, `measure_every_steps` and `watch`: `noise_decay`
  (1 − 1/h)^every, `signal_decay` (1 − 3/h)^every, or one horizon (None, or the noise decay:
  "signal_horizon" off), `divergence_patience` h or None (no watch), `step_price`,
  `noise_batch_exponent`; settings no `EngineConfig` gives raise ValueError naming them."""
  old = dict(settings)
  noise_decay, signal_decay = old.pop("noise_decay"), old.pop("signal_decay")
  patience = old.pop("divergence_patience")
  horizon = round(1 / (1 - noise_decay ** (1 / every))) if 0 < noise_decay < 1 else 0
  if horizon < 3:
    raise ValueError(f"recorded noise_decay={noise_decay} is no EngineConfig's (a horizon of "
                     f"at least 3 steps): this engine cannot replay the run.")
  config = EngineConfig(horizon=horizon, step_price=old.pop("step_price"),
                        noise_batch_exponent=old.pop("noise_batch_exponent"))
  decays = config.decays(every)
  one_horizon = signal_decay is None or signal_decay == noise_decay
  if noise_decay != decays[0] or not (one_horizon or signal_decay == decays[1]) or (
      patience not in (None, config.patience)):
    raise ValueError(f"recorded noise_decay={noise_decay}, signal_decay={signal_decay} and "
                     f"divergence_patience={patience} are no EngineConfig's (horizon {horizon}: "
                     f"{decays[0]:g}, {decays[1]:g} and {config.patience}): this engine cannot "
                     f"replay the run.")
  rules_off = tuple(old.pop("rules_off")) + (("signal_horizon",) if one_horizon else ())
  return dict(old, config=config.to_dict(), measure_every_steps=every,
              watch=patience is not None, rules_off=rules_off)


#: What a replay with a rule off is compared on: a rule acts where one of these first differs.
ACTION = progress_lib.DECISIONS + ("learning_rate",)


@dataclasses.dataclass(frozen=True)
class RuleAction:
  """Where switching `rule` off first changes what the engine did on a run (`rules_that_act`):
  `step` (None: at no step, the rule never acted) and, there, each of `ACTION` that differs
  as (as run, with the rule off)."""
  rule: str
  step: int | None
  changed: dict[str, tuple[Any, Any]]


def rules_that_act(workdir: str | os.PathLike,
                   rules: Sequence[str] = progress_lib.ENGINE_RULES, *,
                   report: ReplayReport | None = None) -> list[RuleAction]:
  """Each rule of `rules` switched off in a replay of an adaptive run's readings: the first
  step at which the engine would have decided otherwise, or None where it never would.

  A rule that never acts on a run buys nothing on it, exactly: with it off, every step
  decides the same, so the model sees the same LR and batch and shows the same readings.
  Where a rule acts, the replay says where, not what it bought (the readings after that step
  would have differed): that takes a run with the rule off (`python -m dateopt.study
  --ablate`). The run's own replay must be exact first (`replay_run`), else ValueError.
  `dateopt-replay WORKDIR --rules` prints the answer. `report`: the run's `replay_run`, where
  the caller has it already.

  Example:
    >>> [a.step for a in rules_that_act("runs/lm_grown", ("rising_hold", "early_climb"))]
    [None, 20]
  """
  root = workdirs.as_path(workdir)
  report = report or replay_run(root)
  if not report.exact:
    step, differing = report.first_mismatch
    raise ValueError(f"{root}: the run's own replay differs at step {step} ({differing}): "
                     f"this engine is not the one that ran it, so no rule can be judged on it.")
  return first_actions(report.rows, report.schedule, rules, as_run=report.replayed,
                       **report.settings)


def first_actions(observations: Sequence[Mapping[str, Any]], base_schedule, rules: Sequence[str],
                  *, as_run: Sequence[Mapping[str, Any]] | None = None, **settings
                  ) -> list[RuleAction]:
  """`rules_that_act` on a run's `observations` (`date.replay`'s input) and the `settings` it
  ran with: each rule off in turn, against the replay as run (`as_run`, replayed if None).
  A rule that only a growing batch has (`LADDER_RULES`) is left out on a fixed batch, a rule
  the run already had off too."""
  as_run = as_run or progress_lib.replay(observations, base_schedule, **settings)
  had_off = tuple(settings.get("rules_off", ()))
  actions = []
  for rule in rules:
    progress_lib.check_rules_off((rule,))
    if rule in had_off or (rule in progress_lib.LADDER_RULES and not settings.get("batch_sizes")):
      continue  # static: the run had no such rule
    off = progress_lib.replay(observations, base_schedule,
                              **dict(settings, rules_off=had_off + (rule,)))
    actions.append(_first_action(rule, as_run, off))
  return actions


def rule_lines(actions: Sequence[RuleAction]) -> str:
  """`rules_that_act`'s answer, a line a rule: where it first acts, or that it never does."""
  def line(action):
    if action.step is None:
      return f"{action.rule:24} never acts: off, every step decides the same"
    changed = ", ".join(f"{name} {_short(a)} → {_short(b)}"
                        for name, (a, b) in action.changed.items())
    return f"{action.rule:24} acts from step {action.step}: {changed}"
  return "\n".join(map(line, actions))


def _short(value: Any) -> str:
  return f"{value:.4g}" if isinstance(value, float) else str(value)


def _first_action(rule: str, as_run: Sequence[Mapping[str, Any]],
                  rule_off: Sequence[Mapping[str, Any]]) -> RuleAction:
  """Where `rule_off`'s decisions first differ from `as_run`'s (NaN equals NaN)."""
  same = lambda a, b: a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
  for step, (a, b) in enumerate(zip(as_run, rule_off), start=1):
    changed = {name: (a[name], b[name]) for name in ACTION if not same(a[name], b[name])}
    if changed:
      return RuleAction(rule, step, changed)
  return RuleAction(rule, None, {})


def _engine_rows(root) -> list[dict[str, Any]]:
  """`engine.jsonl`'s rows, or those of a kept `engine.jsonl.gz` (tests/data/engine_runs)."""
  path, packed = root / ENGINE_FILE, root / (ENGINE_FILE + ".gz")
  if not path.exists() and packed.exists():
    with gzip.open(packed, "rt", encoding="utf-8") as f:
      return [json.loads(line) for line in f if line.strip()]
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist: the run recorded no engine steps.")
  return [row for _, row in metrics_io.parsed_rows(path)]


def _check_rows(rows: Sequence[Mapping[str, Any]], path) -> None:
  """The rows start at the run's first step and miss none: a replay needs every step the
  engine read from its start (not a run resumed from a copied checkpoint, whose first rows
  are elsewhere)."""
  steps = [int(row["step"]) for row in rows]
  if not steps:
    raise ValueError(f"{path} has no rows: nothing to replay.")
  if steps[0] != 1 or steps != list(range(1, len(steps) + 1)):
    gap = next(s for s, expected in zip(steps, range(1, len(steps) + 1)) if s != expected)
    raise ValueError(f"{path}: its rows must be every step from 1, and step {gap} comes "
                     f"where step {steps.index(gap) + 1} should: a replay needs every step "
                     f"the engine read (a run resumed from another workdir's checkpoint "
                     f"lacks the first ones).")


def _differences(recorded: Mapping[str, Any], replayed: Mapping[str, Any]
                 ) -> dict[str, tuple[Any, Any]]:
  """The decisions whose replayed value is not the recorded one, bit for bit."""
  def same(a, b):
    a = float(a) if isinstance(a, str) else a
    return a == b or (isinstance(b, float) and math.isnan(b) and math.isnan(float(a)))
  return {name: (recorded[name], replayed[name]) for name in progress_lib.DECISIONS
          if not same(recorded[name], replayed[name] if name != "phase"
                      else progress_lib.PHASES.index(replayed[name]))}


def rung_table(replayed: Sequence[Mapping[str, Any]]) -> str:
  """The engine's steps grouped by the batch each had, as a Markdown table: where each rung
  began, its steps, the progress it covered, and the gain, LR and phases it went through.

  `replayed` is `replay_run(...).replayed` (or `date.replay`'s list), whose "step_batch" is
  the batch each step had.
  """
  lines = ["| batch | from step | steps | progress (baseline steps) | gain | LR | phases |",
           "|---:|---:|---:|---|---|---|---|"]
  batch, group = None, []

  def flush():
    if group:
      first, last = group[0], group[-1]
      gains = [d["gain"] for _, d in group]
      lrs = [d["learning_rate"] for _, d in group]
      phases = ", ".join(dict.fromkeys(d["phase"] for _, d in group))
      lines.append(f"| {batch:,} | {first[0]} | {len(group)} | {first[1]['progress']:,.0f} → "
                   f"{last[1]['progress']:,.0f} | {min(gains):.3g} – {max(gains):.3g} "
                   f"| {min(lrs):.3g} – {max(lrs):.3g} | {phases} |")

  for step, decided in enumerate(replayed, start=1):
    if decided["step_batch"] != batch:
      flush()
      batch, group = decided["step_batch"], []
    group.append((step, decided))
  flush()
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  """`dateopt-replay WORKDIR [--rungs] [--rules [RULE,...]]`: `replay_run`'s answer in a line
  (status 0 when exact, else 1), with `--rungs` the table of what the engine did at each batch
  (`rung_table`), with `--rules` where each engine rule first acts (`rules_that_act`)."""
  parser = argparse.ArgumentParser(
      prog="dateopt-replay", description="Re-runs DATE's engine on an adaptive run's recorded "
      "readings and compares its decisions with the recorded ones.")
  parser.add_argument("workdir")
  parser.add_argument("--rungs", action="store_true",
                      help="also print the gain, LR, progress and phases at each batch")
  parser.add_argument("--rules", nargs="?", const="all", metavar="RULE,...",
                      help="also replay with each engine rule (default: all) off in turn and "
                      "print the first step it changes, or that it never acts on this run")
  args = parser.parse_args(argv)
  try:
    report = replay_run(args.workdir)
    rules = (progress_lib.ENGINE_RULES if args.rules == "all"
             else tuple(r for r in (args.rules or "").split(",") if r))
    actions = (rules_that_act(args.workdir, rules, report=report)
               if args.rules and report.exact else None)
  except (OSError, ValueError) as error:  # no such workdir, no adaptive run, a partial log
    print(f"dateopt-replay: error: {error}", file=sys.stderr)
    return 2
  if actions is not None:
    print(rule_lines(actions) + "\n")
  if args.rungs:
    print(rung_table(report.replayed) + "\n")
  if report.exact:
    print(f"{report.steps} steps replayed: every decision (phase, gain, progress, batch) "
          f"the same, bit for bit.")
    return 0
  step, diff = report.first_mismatch
  print(f"{report.steps} steps replayed; the first decision that differs is at step {step}: "
        + ", ".join(f"{k} recorded {a} replayed {b}" for k, (a, b) in diff.items()))
  return 1
