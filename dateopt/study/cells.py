"""The study's grid: its cells, each cell's config, and one cell's run.

Every run starts from ONE baseline recipe, tuned once at batch B0 and then
frozen; each cell (workload x batch B0·k x strategy x seed) only changes what
its strategy changes (see `dateopt.study`). DATE's adaptive cells predict
their steps from the baseline's measured noise scale.

Example:
  >>> cells = grid(["lstm"], multiples=(1, 4), seeds=(0,))
  >>> [c.key for c in cells][:2]
  ['lstm/baseline/1x/seed0', 'lstm/adaptive/4x/seed0']
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import time
from typing import Any, Iterable, Mapping, Sequence

import ml_collections

from dateopt import train
from dateopt.metrics_io import metric_curve, read_metrics
from dateopt.epochs import epochs_to_steps
from dateopt.validation import check_choice, check_range, check_type
from dateopt.date import _noise as noise_lib
from dateopt.date import _planner as planner_lib

MULTIPLES = (1, 2, 4, 8, 16, 32, 64)

# Study strategy -> its label, in run order: the baselines first (DATE predicts
# from their noise scale), DATE before LEGW at DATE's steps (which needs them).
STRATEGIES: dict[str, str] = {
    "baseline": "baseline (B0)",
    "adaptive": "DATE adaptive",
    "adaptive_grow": "DATE adaptive, batch grown",
    "legw": "static LEGW",
    "linear": "linear + Goyal warmup",
    "sqrt": "sqrt, no LEGW warmup",
    "none": "no scaling",
    "legw_date_steps": "static LEGW at DATE's steps",
    # The field's batch schedules (`dateopt.date._batch_schedules`), asked for by name or by
    # the comparison grid (`dateopt.study.compare`).
    "linear_ramp": "linear ramp (Megatron-LM)",
    "doubling": "doubling, √ LR (OLMo-core)",
    "seesaw": "Seesaw",
    "batch_for_decay": "batch for decay (Smith et al.)",
}
FIELD_SCHEDULES = ("linear_ramp", "doubling", "seesaw", "batch_for_decay")
STATIC_RULES = ("legw", "linear", "sqrt", "none")
# The recorded grid; the grown batch (adaptive_grow) and the field's schedules are asked for
# by name (--strategies, --compare).
DEFAULT_STRATEGIES = tuple(s for s in STRATEGIES
                           if s != "adaptive_grow" and s not in FIELD_SCHEDULES)
# DATE's strategies: every seed runs, and the baseline's noise scale predicts their steps.
ADAPTIVE_STRATEGIES = ("adaptive", "adaptive_grow")

# Goyal et al. 2017 warm up for 5 of ImageNet's 90 epochs; a shorter run keeps that share.
GOYAL_WARMUP_SHARE = 5 / 90

EVALS_PER_RUN = 16  # eval points per run: the steps to a target accuracy, at ~6% resolution
BAR_TOLERANCE = 1.0  # accuracy points: "the baseline's accuracy" (the study's accuracy bar)

CSV_COLUMNS = ("workload", "batch", "multiple", "strategy", "seed", "steps", "examples",
               "epochs", "predicted_steps", "final_accuracy", "best_accuracy",
               "steps_to_target", "wall_seconds", "guard_skipped", "guard_lr_multiplier",
               "final_loss", "final_bits_per_byte", "tokens")  # the last three: text only



@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the grid: a workload, a strategy, a batch multiple k and a seed; for a
  strategy with free parameters, its `setting` ("ramp0.2": the ramp over 20% of the
  examples; "start16x": the first batch 16 × B0) and `budget` (examples × the baseline's);
  for DATE's strategies, the setting "off:<rule>" switches that engine rule off (an
  ablation, `dateopt.study.ablation`)."""

  workload: str
  strategy: str
  multiple: int
  seed: int
  setting: str = ""
  budget: float = 1.0

  @property
  def key(self) -> str:
    setting = f"/{self.setting}" if self.setting else ""
    budget = f"/budget{self.budget:g}x" if self.budget != 1.0 else ""
    return f"{self.workload}/{self.strategy}/{self.multiple}x{setting}{budget}/seed{self.seed}"


ABLATION_PREFIX = "off:"  # a DATE cell's setting: the engine rule it switches off


def is_ablation(row: Mapping[str, Any]) -> bool:
  """Whether a finished run is an ablation's: a DATE cell with an engine rule switched off."""
  return str(row.get("setting", "")).startswith(ABLATION_PREFIX)


def rules_off(setting: str) -> str:
  """A DATE cell's setting as `config.engine_rules_off`: "off:a+b" -> "a,b"; "" -> "".

  Example:
    >>> rules_off("off:early_climb+rising_hold"), rules_off("")
    ('early_climb,rising_hold', '')
  """
  if not setting:
    return ""
  if not setting.startswith(ABLATION_PREFIX):
    raise ValueError(f"setting={setting!r}: a DATE cell's setting is "
                     f"'{ABLATION_PREFIX}<rule>[+<rule>]' or empty.")
  return setting[len(ABLATION_PREFIX):].replace("+", ",")


def setting_options(setting: str, base_batch_size: int) -> dict[str, Any]:
  """A cell's `setting` as `date.plan`'s `schedule_options`.

  Example:
    >>> setting_options("ramp0.2", 32), setting_options("start16x", 32)
    ({'ramp_share': 0.2}, {'start_batch': 512})
  """
  if not setting:
    return {}
  if setting.startswith("ramp"):
    return {"ramp_share": float(setting[len("ramp"):])}
  if setting.startswith("start") and setting.endswith("x"):
    return {"start_batch": base_batch_size * int(setting[len("start"):-1])}
  raise ValueError(f"setting={setting!r}: expected 'ramp<share>' or 'start<k>x'.")


def grid(workloads: Sequence[str], *, multiples: Sequence[int] = MULTIPLES,
         seeds: Sequence[int] = (0, 1, 2), static_seeds: Sequence[int] = (0,),
         strategies: Sequence[str] = DEFAULT_STRATEGIES) -> list[Cell]:
  """The study's cells in run order.

  The baseline runs at k = 1 with `seeds`, DATE adaptive at every k > 1 with
  `seeds`, and the static rules and LEGW at DATE's steps at every k > 1 with
  `static_seeds` (at k = 1 every strategy is the baseline).

  Example:
    >>> len(grid(["lstm"]))   # 3 baselines + 6 x (3 DATE + 4 static + 1)
    51
  """
  for strategy in strategies:
    check_choice("strategies", strategy, tuple(STRATEGIES))
  for k in multiples:
    check_type("multiples", k, int, what="positive ints")
    check_range("multiples", k, low=1)
  cells = []
  for workload in workloads:
    for strategy in (s for s in STRATEGIES if s in strategies):
      if strategy == "baseline":
        cells += [Cell(workload, strategy, 1, seed) for seed in seeds]
        continue
      run_seeds = seeds if strategy in ADAPTIVE_STRATEGIES else static_seeds
      cells += [Cell(workload, strategy, k, seed)
                for k in sorted(set(multiples)) if k > 1 for seed in run_seeds]
  return cells


def measured_noise_scales(metric_rows: Sequence[Mapping[str, Any]]) -> list[float]:
  """The B_noise values a run logged (`train/date/noise_scale`), one per log step.

  `metrics.jsonl` writes non-finite values as null. The noise scale is NaN
  only before its first measurement (left out here) and +inf once measured
  when the signal estimate is <= 0, so a null after the first finite value is
  read as inf (the largest gain).
  """
  values = []
  for row in metric_rows:
    if "train/date/noise_scale" not in row:
      continue
    value = row["train/date/noise_scale"]
    if value is None or math.isnan(float(value)):
      if values:  # measured before: the signal estimate was <= 0
        values.append(math.inf)
      continue
    values.append(float(value))
  return values


def filled_profile(profile: Sequence[float]) -> list[float]:
  """A profile with no gaps: a point without a finite value takes the last one before it (the
  first one, at the start), and values below one example are read as one (the law's floor).

  Example:
    >>> filled_profile([math.nan, 40.0, math.nan, 0.5])
    [40.0, 40.0, 40.0, 1.0]
  """
  finite = [v for v in profile if math.isfinite(v)]
  filled, last = [], finite[0] if finite else 1.0
  for value in profile:
    last = value if math.isfinite(value) else last
    filled.append(max(last, 1.0))
  return filled


def finite_median(values: Iterable[float]) -> float:
  finite = [v for v in values if math.isfinite(v)]
  return statistics.median(finite) if finite else math.nan


def effective_noise_scale(values: Sequence[float], base_batch_size: int,
                          batch_size: int) -> float:
  """The one B_noise whose gain is the baseline trajectory's harmonic-mean gain at `batch_size`.

  The adaptive run's steps are Σ 1/r over the baseline's steps, so with the
  baseline's noise scale B_i logged at equal intervals the law predicts
  T0 · mean(1/r(B_i)); this returns the B with r(B) = 1/mean(1/r(B_i)), for
  `date.plan(..., noise_scale=B)` to predict from.

  Example:
    >>> round(effective_noise_scale([500.0, 500.0], 32, 512))
    500
  """
  gains = [noise_lib.adascale_gain(max(v, 0.0), base_batch_size, batch_size) for v in values]
  if not gains:
    return math.nan
  gain = len(gains) / sum(1.0 / g for g in gains)
  if gain >= batch_size / base_batch_size:
    return math.inf
  # r = (1 + B/b0)/(1 + B/b)  ⇔  B = (r − 1)/(1/b0 − r/b)
  return (gain - 1.0) / (1.0 / base_batch_size - gain / batch_size)


def cell_config(base: ml_collections.ConfigDict, cell: Cell, *,
                num_train_examples: int, noise_scale: Sequence[float] | None = None,
                date_steps: int | None = None) -> ml_collections.ConfigDict:
  """The trainer config of `cell`: the frozen baseline, changed only by its strategy.

  Args:
    base: the workload's config (its `baseline` is the tuned recipe).
    cell: the run.
    num_train_examples: the dataset's training examples (epochs ↔ steps).
    noise_scale: DATE's strategies: the baseline's B_noise profile (its logged
      values), which the predicted steps come from.
    date_steps: "legw_date_steps": the steps to train for.
  """
  config = ml_collections.ConfigDict(base.to_dict())
  config.seed = cell.seed
  config.progress_bar = False  # the grid has its own bar
  config.checkpoint_every_steps = -1  # a finished cell is the unit of resumption
  base_batch = int(config.baseline.batch_size)
  base_steps = epochs_to_steps(float(config.baseline.num_epochs), num_train_examples, base_batch)
  if cell.strategy == "baseline" and cell.setting:
    raise ValueError(f"{cell.key}: the baseline takes no setting.")
  if cell.strategy == "baseline":
    config.batch_size = None
    expected_steps = base_steps
  else:
    config.batch_size = base_batch * cell.multiple
    expected_steps = base_steps / cell.multiple
    config.strategy = {"legw_date_steps": "legw",
                       "adaptive_grow": "adaptive"}.get(cell.strategy, cell.strategy)
    # DATE's cells keep the config's own `plan` options (e.g. noise_of); the static
    # strategies take none of them.
    plan = config.plan.to_dict() if cell.strategy in ADAPTIVE_STRATEGIES else {}
    if cell.strategy == "adaptive_grow":
      plan["grow_batch"] = True
    if cell.strategy == "linear":
      plan["linear_warmup_epochs"] = GOYAL_WARMUP_SHARE * float(config.baseline.num_epochs)
    if cell.strategy in ADAPTIVE_STRATEGIES and noise_scale:
      plan["noise_scale"] = [float(v) for v in noise_scale]
    if cell.strategy == "legw_date_steps":
      if date_steps is None:
        raise ValueError(f"{cell.key}: LEGW at DATE's steps needs DATE's runs at "
                         f"{cell.multiple}x first.")
      config.baseline = dict(config.baseline.to_dict(),
                             num_epochs=date_steps * config.batch_size / num_train_examples)
      expected_steps = date_steps
    if cell.strategy in FIELD_SCHEDULES:
      plan["schedule_options"] = setting_options(cell.setting, base_batch)
    elif cell.strategy in ADAPTIVE_STRATEGIES:
      config.engine_rules_off = rules_off(cell.setting)
    elif cell.setting:
      raise ValueError(f"{cell.key}: strategy {cell.strategy!r} takes no setting.")
    if "adam_scaling" in config.plan:  # the Adam family's rules, for every strategy's plan
      plan["adam_scaling"] = tuple(config.plan.adam_scaling)
    if cell.budget != 1.0:
      plan["budget"] = cell.budget
    config.plan = plan
    if cell.strategy in FIELD_SCHEDULES or cell.budget != 1.0:  # the steps the plan fixes
      _, recipe = train.plan_recipe(config, num_train_examples)
      expected_steps = planner_lib.plan_predicted_steps(recipe, None)
    if "noise_scale" in plan:  # DATE's steps, as its plan predicts them
      _, recipe = train.plan_recipe(config, num_train_examples)
      expected_steps = planner_lib.plan_predicted_steps(recipe, plan["noise_scale"])
  config.eval_every_steps = max(1, int(expected_steps) // EVALS_PER_RUN)
  return config


def planning_refusal(cell: Cell, config: ml_collections.ConfigDict,
                     num_train_examples: int) -> str | None:
  """Why `cell`'s strategy cannot plan its recipe (the planner's error), or None.

  A published rule can have no recipe at a batch: LEGW's warmup of k·w0 epochs
  is longer than a run of E epochs once k·w0 ≥ E (You et al., SC'19, §3). Such a
  cell is a result of the rule (`PlanningError`), kept with its reason, not a
  crash of the grid; any other error is the config's, and is raised.
  """
  if cell.strategy == "baseline":
    return None
  try:
    train.plan_recipe(config, num_train_examples)
  except planner_lib.PlanningError as error:
    return str(error)
  return None


def run_cell(cell: Cell, config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains `cell` from scratch in `workdir`; returns its row (with its eval curve). A run
  that DATE's watch gives up is a result of the cell, not a crash of the grid: its row says
  so (`gave_up_row`)."""
  shutil.rmtree(workdir, ignore_errors=True)  # an unfinished cell starts again
  start = time.perf_counter()
  try:
    result = train.train_and_evaluate(config, workdir)
  except train.DivergedError as stop:
    return gave_up_row(cell, workdir, reason=str(stop), seconds=time.perf_counter() - start)
  seconds = time.perf_counter() - start
  recipe, metrics = result.recipe, result.train_metrics
  row = {
      **_row_from_metrics(cell, read_metrics(workdir), seconds),
      "batch": recipe.batch_size, "base_batch": result.baseline.batch_size,
      "num_examples": recipe.num_examples, "steps": result.steps, "examples": result.examples,
      "largest_batch": result.largest_batch_size,
      "epochs": result.examples / recipe.num_examples,
      "predicted_steps": result.predicted_steps,
      "final_accuracy": float(result.eval_metrics["accuracy"]),
      "guard_skipped": int(metrics.get("guard/num_skipped", 0)),
      "guard_lr_multiplier": float(metrics.get("guard/lr_multiplier", 1.0)),
  }
  if result.tokens is not None:  # a text workload: its final validation loss and tokens
    row.update(final_loss=float(result.eval_metrics["loss"]),
               final_bits_per_byte=float(result.eval_metrics.get("bits_per_byte", math.nan)),
               tokens=result.tokens)
  return row


def gave_up_row(cell: Cell, workdir: str, *, reason: str, seconds: float) -> dict[str, Any]:
  """The row of a run the watch gave up: its last logged step and examples, its last
  evaluation (which may fall inside the divergence), `gave_up` and the reason. It never counts
  at a quality bar (`compare.quality`), and the reports list it apart from their tables."""
  metric_rows = read_metrics(workdir)
  with open(os.path.join(workdir, "recipe.json"), encoding="utf-8") as f:
    recipe = json.load(f)
  planned = recipe["planned"]
  row = _row_from_metrics(cell, metric_rows, seconds)
  trained = [r for r in metric_rows if "train/loss" in r]
  last = trained[-1] if trained else {}
  examples = int(last.get("train/examples_seen", 0))
  row.update(
      batch=planned["batch_size"], base_batch=recipe["baseline"]["batch_size"],
      num_examples=planned["num_examples"], steps=int(last.get("step", 0)), examples=examples,
      largest_batch=int(max((r.get("train/batch_size", 0) for r in trained), default=0)),
      epochs=examples / planned["num_examples"], predicted_steps=None,
      final_accuracy=row["eval_accuracy"][-1] if row["eval_accuracy"] else math.nan,
      guard_skipped=int(last.get("train/guard/num_skipped", 0)),
      guard_lr_multiplier=float(last.get("train/guard/lr_multiplier", 1.0)),
      gave_up=True, stopped=(reason.splitlines() or ["(no reason given)"])[0])
  if "eval_loss" in row:  # a text workload: its last validation loss, and the tokens seen
    _, eval_bits = metric_curve(metric_rows, "eval/bits_per_byte")
    row.update(final_loss=row["eval_loss"][-1] if row["eval_loss"] else math.nan,
               final_bits_per_byte=eval_bits[-1] if eval_bits else math.nan,
               tokens=int(last.get("train/tokens_seen", 0)))
  return row


def _row_from_metrics(cell: Cell, metric_rows: Sequence[Mapping[str, Any]],
                      seconds: float) -> dict[str, Any]:
  """The fields of a cell's row that its metrics log holds, however the run ended: the eval
  curve and its best point, the noise scales measured, the run's health, and for a text
  workload (one that logs `train/tokens_seen`) the validation loss curve against the tokens
  seen at each of its points."""
  eval_steps, eval_accuracy = metric_curve(metric_rows, "eval/accuracy")
  noise = measured_noise_scales(metric_rows)
  row = {"key": cell.key, **dataclasses.asdict(cell), "wall_seconds": seconds,
         "best_accuracy": max(eval_accuracy, default=math.nan),
         "noise_scale_median": finite_median(noise), **run_health(metric_rows),
         "noise_scales": noise if cell.strategy == "baseline" else [],
         "eval_steps": eval_steps, "eval_accuracy": eval_accuracy}
  if any("train/tokens_seen" in r for r in metric_rows):
    _, row["eval_loss"] = metric_curve(metric_rows, "eval/loss")
    row["eval_tokens"], _ = metric_curve(metric_rows, "eval/loss", x="eval/tokens_seen")
  return row


def run_health(metric_rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """What a run's metrics say of its health: the peak LR it applied, its mean logged
  training loss over the last quarter of the run ÷ that over the third (`loss_trend`: ≤ 1
  still falling or flat at the end; above 1, it rose again), and for DATE's engine the
  divergences its watch declared (`divergences`, 0 on a healthy run).

  Example:
    >>> run_health([{"train/learning_rate": 0.1, "train/loss": v} for v in (4, 3, 2, 1)])
    {'peak_lr': 0.1, 'loss_trend': 0.5}
  """
  health = _lr_and_trend(metric_rows)
  divergences = [r["train/date/divergences"] for r in metric_rows
                 if r.get("train/date/divergences") is not None]
  if divergences:
    health["divergences"] = int(max(divergences))
  return health


def _lr_and_trend(metric_rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  lrs = [r["train/learning_rate"] for r in metric_rows
         if r.get("train/learning_rate") is not None]
  losses = [r["train/loss"] for r in metric_rows if r.get("train/loss") is not None]
  quarter = len(losses) // 4
  trend = (statistics.mean(losses[-quarter:]) / statistics.mean(losses[-2 * quarter:-quarter])
           if quarter else math.nan)
  return {"peak_lr": max(lrs, default=math.nan), "loss_trend": trend}
