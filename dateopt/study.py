"""The batch-scaling study: DATE against the static scaling rules, from 1x to 64x.

Every run starts from ONE baseline recipe, tuned once at batch B0 and then
frozen; each cell of the grid (workload x batch B0·k x strategy x seed) only
changes what its strategy changes:

  * "baseline": the recipe as it is, at B0;
  * "adaptive": DATE's dynamic mode (`dateopt.date.adaptive`): the baseline's
    schedule walked at the gain measured from the gradient noise scale; the
    run chooses its own budget (You et al. SC'19; AdaScale, Johnson et al. 2020);
  * "legw", "linear", "sqrt", "none": the static rules at equal epochs (the
    paper's protocol): LEGW (peak x √k, warmup epochs x k), linear scaling with
    Goyal et al.'s warmup (5 of 90 epochs, kept as that share of a shorter
    run), √k without LEGW's warmup, and the batch alone;
  * "legw_date_steps": static LEGW trained for the steps DATE chose at that
    batch (the mean over DATE's seeds), so that "more steps" and "an adaptive
    LR" are told apart.

Results are appended to `<outdir>/cells.jsonl` as each run finishes, so a
re-run skips the finished cells (resumable across sessions). `summarize`,
`markdown_report` and `write_csv` turn the rows into the study's tables, and
`dateopt.plots` draws its figures. `scripts/scaling_study.py` is the command.

Example:
  >>> from dateopt import study
  >>> configs = {"lstm": study.load_config("configs/study_mnist1d_lstm.py")}
  >>> runner = study.Study("runs/scaling_study", configs)
  >>> rows = runner.run(study.grid(["lstm"], multiples=(1, 4), seeds=(0,)))
  >>> print(study.markdown_report(study.summarize(rows)))
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import statistics
import time
from typing import Any, Iterable, Iterator, Mapping, Sequence

import ml_collections

from dateopt import configs, strict_json
from dateopt.epochs import epochs_to_steps
from dateopt.validation import check_choice, check_range, check_type

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
}
STATIC_RULES = ("legw", "linear", "sqrt", "none")
# The recorded grid; the grown batch (issue 18) is asked for by name (--strategies).
DEFAULT_STRATEGIES = tuple(s for s in STRATEGIES if s != "adaptive_grow")
# DATE's strategies: every seed runs, and the baseline's noise scale predicts their steps.
ADAPTIVE_STRATEGIES = ("adaptive", "adaptive_grow")

# Goyal et al. 2017 warm up for 5 of ImageNet's 90 epochs; a shorter run keeps that share.
GOYAL_WARMUP_SHARE = 5 / 90

EVALS_PER_RUN = 16  # eval points per run: the steps to a target accuracy, at ~6% resolution
BAR_TOLERANCE = 1.0  # accuracy points: "the baseline's accuracy" (issue 9's bar)

CSV_COLUMNS = ("workload", "batch", "multiple", "strategy", "seed", "steps", "examples",
               "epochs", "predicted_steps", "final_accuracy", "best_accuracy",
               "steps_to_target", "wall_seconds", "guard_skipped", "guard_lr_multiplier")


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the grid: a workload, a strategy, a batch multiple k and a seed."""

  workload: str
  strategy: str
  multiple: int
  seed: int

  @property
  def key(self) -> str:
    return f"{self.workload}/{self.strategy}/{self.multiple}x/seed{self.seed}"


def load_config(path: str) -> ml_collections.ConfigDict:
  """`get_config()` of a config file: a path, or a packaged config's name (`configs.resolve`)."""
  path = configs.resolve(path)
  spec = importlib.util.spec_from_file_location("dateopt_study_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


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
    check_type("multiples", k, int, "positive ints")
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


# --------------------------------------------------------------------------
# The baseline's noise scale, and what DATE predicts from it
# --------------------------------------------------------------------------

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
  from dateopt import date  # pylint: disable=g-import-not-at-top  (jax only when used)
  gains = [date.adascale_gain(max(v, 0.0), base_batch_size, batch_size) for v in values]
  if not gains:
    return math.nan
  gain = len(gains) / sum(1.0 / g for g in gains)
  if gain >= batch_size / base_batch_size:
    return math.inf
  # r = (1 + B/b0)/(1 + B/b)  ⇔  B = (r − 1)/(1/b0 − r/b)
  return (gain - 1.0) / (1.0 / base_batch_size - gain / batch_size)


def law_steps(steps_at_base: float, noise_scale: float, base_batch_size: int,
              batch_size: float) -> float:
  """McCandlish et al. 2018: steps to a target ∝ 1 + B_noise/B, anchored at the baseline.

  Example:
    >>> law_steps(1000, 100.0, 10, 1000)   # 1000 · (1 + 0.1) / (1 + 10)
    100.0
  """
  return steps_at_base * (1 + noise_scale / batch_size) / (1 + noise_scale / base_batch_size)


# --------------------------------------------------------------------------
# One cell
# --------------------------------------------------------------------------

def cell_config(base: ml_collections.ConfigDict, cell: Cell, *,
                num_train_examples: int, noise_scale: float | None = None,
                date_steps: int | None = None) -> ml_collections.ConfigDict:
  """The trainer config of `cell`: the frozen baseline, changed only by its strategy.

  Args:
    base: the workload's config (its `baseline` is the tuned recipe).
    cell: the run.
    num_train_examples: the dataset's training examples (epochs ↔ steps).
    noise_scale: "adaptive": the B_noise its predicted steps come from;
      "adaptive_grow": the baseline's B_noise profile (its logged values).
    date_steps: "legw_date_steps": the steps to train for.
  """
  config = ml_collections.ConfigDict(base.to_dict())
  config.seed = cell.seed
  config.progress_bar = False  # the grid has its own bar
  config.checkpoint_every_steps = -1  # a finished cell is the unit of resumption
  base_batch = int(config.baseline.batch_size)
  base_steps = epochs_to_steps(float(config.baseline.num_epochs), num_train_examples, base_batch)
  if cell.strategy == "baseline":
    config.batch_size = None
    expected_steps = base_steps
  else:
    config.batch_size = base_batch * cell.multiple
    expected_steps = base_steps / cell.multiple
    config.strategy = {"legw_date_steps": "legw",
                       "adaptive_grow": "adaptive"}.get(cell.strategy, cell.strategy)
    plan = {"grow_batch": True} if cell.strategy == "adaptive_grow" else {}
    if cell.strategy == "linear":
      plan["linear_warmup_epochs"] = GOYAL_WARMUP_SHARE * float(config.baseline.num_epochs)
    if cell.strategy == "adaptive" and noise_scale is not None and math.isfinite(noise_scale):
      plan["noise_scale"] = float(noise_scale)
      from dateopt import date  # pylint: disable=g-import-not-at-top
      expected_steps = date.predicted_steps(noise_scale, base_batch, config.batch_size,
                                            base_steps, 0)
    if cell.strategy == "adaptive_grow" and noise_scale:
      plan["noise_scale"] = [float(v) for v in noise_scale]
      from dateopt import date  # pylint: disable=g-import-not-at-top
      expected_steps = date.predicted_budget(
          plan["noise_scale"], base_batch_size=base_batch, base_steps=base_steps,
          batch_sizes=date.batch_ladder(base_batch, config.batch_size))["steps"]
    if cell.strategy == "legw_date_steps":
      if date_steps is None:
        raise ValueError(f"{cell.key}: LEGW at DATE's steps needs DATE's runs at "
                         f"{cell.multiple}x first.")
      config.baseline = dict(config.baseline.to_dict(),
                             num_epochs=date_steps * config.batch_size / num_train_examples)
      expected_steps = date_steps
    config.plan = plan
  config.eval_every_steps = max(1, int(expected_steps) // EVALS_PER_RUN)
  return config


def run_cell(cell: Cell, config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains `cell` from scratch in `workdir`; returns its row (with its eval curve)."""
  from dateopt import plots, train  # pylint: disable=g-import-not-at-top

  shutil.rmtree(workdir, ignore_errors=True)  # an unfinished cell starts again
  start = time.perf_counter()
  result = train.train_and_evaluate(config, workdir)
  seconds = time.perf_counter() - start
  metric_rows = plots.read_metrics(workdir)
  eval_steps, eval_accuracy = plots.metric_curve(metric_rows, "eval/accuracy")
  noise = measured_noise_scales(metric_rows)
  recipe, metrics = result.recipe, result.train_metrics
  return {
      "key": cell.key, **dataclasses.asdict(cell), "batch": recipe.batch_size,
      "base_batch": result.baseline.batch_size, "num_examples": recipe.num_examples,
      "steps": result.steps, "examples": result.examples,
      "largest_batch": result.largest_batch_size,
      "epochs": result.examples / recipe.num_examples,
      "predicted_steps": result.predicted_steps,
      "final_accuracy": float(result.eval_metrics["accuracy"]),
      "best_accuracy": max(eval_accuracy, default=math.nan),
      "wall_seconds": seconds,
      "guard_skipped": int(metrics.get("guard/num_skipped", 0)),
      "guard_lr_multiplier": float(metrics.get("guard/lr_multiplier", 1.0)),
      "noise_scale_median": finite_median(noise),
      "noise_scales": noise if cell.strategy == "baseline" else [],
      "eval_steps": eval_steps, "eval_accuracy": eval_accuracy,
  }


# --------------------------------------------------------------------------
# The grid, resumable
# --------------------------------------------------------------------------

class Study:
  """Runs cells of the grid into `outdir`, skipping the ones already finished.

  Args:
    outdir: `cells.jsonl` (one row per finished run) and `runs/<cell>/` (each
      run's workdir: recipe and metrics).
    configs: {workload name: its config, the frozen baseline recipe included}.
  """

  def __init__(self, outdir: str, configs: Mapping[str, ml_collections.ConfigDict]):
    self.outdir = outdir
    self.configs = dict(configs)
    self.results_path = os.path.join(outdir, "cells.jsonl")
    self._train_example_counts: dict[str, int] = {}

  def rows(self) -> list[dict[str, Any]]:
    """The finished cells' rows (the last row of a key wins)."""
    if not os.path.exists(self.results_path):
      return []
    by_key = {}
    with open(self.results_path, encoding="utf-8") as f:
      for line in f:
        if line.strip():
          row = json.loads(line)
          # Strict JSON stores inf (a noise scale whose signal estimate was ≤ 0) as null.
          row["noise_scales"] = [math.inf if v is None else v for v in row["noise_scales"]]
          by_key[row["key"]] = row
    return list(by_key.values())

  def forget(self, strategies: Sequence[str]) -> int:
    """Drops the finished rows of `strategies` (a backup stays in cells.jsonl.bak)."""
    for strategy in strategies:
      check_choice("strategies", strategy, tuple(STRATEGIES))
    rows = self.rows()
    kept = [row for row in rows if row["strategy"] not in strategies]
    if len(kept) < len(rows):
      shutil.copy(self.results_path, self.results_path + ".bak")
      tmp = self.results_path + ".tmp"
      with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(strict_json.line(row) for row in kept)
      os.replace(tmp, self.results_path)
    return len(rows) - len(kept)

  def run(self, cells: Sequence[Cell], *, progress: bool = True) -> list[dict[str, Any]]:
    """Runs the unfinished `cells` in order; returns every finished row."""
    unknown = sorted({c.workload for c in cells} - set(self.configs))
    if unknown:
      raise ValueError(f"workloads {unknown} have no config; known: {sorted(self.configs)}.")
    done = {row["key"] for row in self.rows()}
    todo = [cell for cell in cells if cell.key not in done]
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm(total=len(cells), initial=len(cells) - len(todo), unit="run",
               disable=not progress, dynamic_ncols=True)
    for cell in todo:
      with self._claim(cell) as claimed:
        if not claimed:
          bar.write(f"{cell.key}: skipped, another process is running it")
        elif cell.key not in {row["key"] for row in self.rows()}:  # not finished meanwhile
          bar.set_description(cell.key)
          row = run_cell(cell, self.config_for(cell), self.workdir(cell))
          self._append(row)
          bar.write(_one_line(row))
      bar.update(1)
    bar.close()
    return self.rows()

  def workdir(self, cell: Cell) -> str:
    """The cell's run folder: its recipe, metrics and TensorBoard events."""
    return os.path.join(self.outdir, "runs", cell.key.replace("/", "_"))

  @contextlib.contextmanager
  def _claim(self, cell: Cell) -> Iterator[bool]:
    """Holds the cell for this process; yields False when a live process has it.

    Studies sharing an outdir then split its cells: `run_cell` wipes the
    workdir it starts in, which must never be another process's live run. A
    claim left by a killed process is cleared (see `workdir_lock`).
    """
    from dateopt.train import workdir_lock  # pylint: disable=g-import-not-at-top
    claim_dir = os.path.join(self.outdir, "claims", cell.key.replace("/", "_"))
    os.makedirs(claim_dir, exist_ok=True)
    try:
      claim = workdir_lock.acquire(claim_dir)
    except workdir_lock.WorkdirInUseError:
      yield False
      return
    try:
      yield True
    finally:
      workdir_lock.release(claim)

  def config_for(self, cell: Cell) -> ml_collections.ConfigDict:
    """The cell's config, with the baseline's noise scale and DATE's steps it depends on."""
    rows = [r for r in self.rows() if r["workload"] == cell.workload]
    noise = date_steps = None
    if cell.strategy in ADAPTIVE_STRATEGIES:
      baselines = [r for r in rows if r["strategy"] == "baseline"]
      same_seed = [r for r in baselines if r["seed"] == cell.seed] or baselines
      if same_seed and cell.strategy == "adaptive_grow":
        noise = [max(v, 1.0) for v in same_seed[0]["noise_scales"]] or None  # the profile
      elif same_seed:
        row = same_seed[0]
        noise = effective_noise_scale(row["noise_scales"], row["base_batch"],
                                      row["base_batch"] * cell.multiple)
    if cell.strategy == "legw_date_steps":
      steps = [r["steps"] for r in rows
               if r["strategy"] == "adaptive" and r["multiple"] == cell.multiple]
      date_steps = round(statistics.mean(steps)) if steps else None
    return cell_config(self.configs[cell.workload], cell,
                       num_train_examples=self.num_train_examples(cell.workload),
                       noise_scale=noise, date_steps=date_steps)

  def num_train_examples(self, workload: str) -> int:
    """The training examples of `workload`'s dataset (epochs ↔ steps)."""
    if workload not in self._train_example_counts:
      from dateopt import data  # pylint: disable=g-import-not-at-top
      config = self.configs[workload]
      dataset = data.get_dataset(config.dataset, data_dir=config.data_dir,
                                 **config.dataset_kwargs.to_dict())
      self._train_example_counts[workload] = dataset.num_train_examples
    return self._train_example_counts[workload]

  def _append(self, row: dict[str, Any]) -> None:
    os.makedirs(self.outdir, exist_ok=True)
    with open(self.results_path, "a", encoding="utf-8") as f:
      f.write(strict_json.line(row))
      f.flush()
      os.fsync(f.fileno())


def _one_line(row: Mapping[str, Any]) -> str:
  predicted = row.get("predicted_steps")
  return (f"{row['key']}: {100 * row['final_accuracy']:.2f}% in {row['steps']:,} steps"
          + (f" (predicted {predicted:,})" if predicted and row["strategy"] == "adaptive" else "")
          + f", {row['wall_seconds']:.0f} s")


# --------------------------------------------------------------------------
# Summaries: tables, CSV, the bar
# --------------------------------------------------------------------------

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
  `reached` counts them.
  """
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
    })
  return sorted(out, key=lambda e: (e["workload"], list(STRATEGIES).index(e["strategy"]),
                                    e["multiple"]))


def write_csv(rows: Sequence[Mapping[str, Any]], path: str,
              tolerance: float = BAR_TOLERANCE) -> str:
  """Every run, one line each (`CSV_COLUMNS`); returns `path`."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  targets = _targets(rows, tolerance)
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    for row in sorted(rows, key=lambda r: (r["workload"], list(STRATEGIES).index(r["strategy"]),
                                           r["multiple"], r["seed"])):
      target = targets[row["workload"]]
      out = {column: row.get(column) for column in CSV_COLUMNS}
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
  DATE's predicted vs actual steps, and the issue's bar, checked."""
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
  """Issue 9's bar for one workload's summary entries.

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


# --------------------------------------------------------------------------
# Where the law's prediction goes wrong: the runs' trajectories by progress
# --------------------------------------------------------------------------

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


def profile_report(runner: "Study", rows: Sequence[Mapping[str, Any]]) -> str:
  """Markdown: per workload, the baseline's and DATE's `progress_profile` at each k
  (the median over seeds of each quarter's median), from the runs' `metrics.jsonl`.

  Runs whose workdir is gone (a copy of `cells.jsonl` alone) are left out.
  """
  from dateopt import plots  # pylint: disable=g-import-not-at-top
  sections = []
  for workload in sorted({r["workload"] for r in rows}):
    baselines = [r for r in rows if r["workload"] == workload and r["strategy"] == "baseline"]
    if not baselines:
      continue
    base_steps = statistics.mean(r["steps"] for r in baselines)
    groups: dict[int, list[dict[str, list[float]]]] = {}
    for row in rows:
      if row["workload"] != workload or row["strategy"] not in ("baseline", "adaptive"):
        continue
      path = os.path.join(runner.workdir(Cell(workload, row["strategy"], row["multiple"],
                                              row["seed"])), "metrics.jsonl")
      if os.path.exists(path):
        groups.setdefault(row["multiple"], []).append(
            progress_profile(plots.read_metrics(path), base_steps))
    if groups:
      sections.append(f"#### {workload}: by quarter of progress (baseline steps)\n\n"
                      + _profile_table(groups))
  return "\n\n".join(sections)


def _profile_table(groups: Mapping[int, Sequence[Mapping[str, list[float]]]]) -> str:
  quarters = len(next(iter(groups.values()))[0]["loss"])
  names = [f"Q{q + 1}" for q in range(quarters)]
  lines = ["| run | " + " | ".join(f"B_noise {n}" for n in names) + " | "
           + " | ".join(f"loss {n}" for n in names) + " |",
           "|---|" + "---:|" * (2 * quarters)]
  for k in sorted(groups):
    profiles = groups[k]
    over_seeds = lambda key, q: finite_median(p[key][q] for p in profiles)
    label = "baseline (1x)" if k == 1 else f"DATE {k}x"
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
  grown/fixed, and the accuracy against the baseline's (issue 18's bar reads
  these at 64x: ≤ 1.3x the steps, ≤ 0.6x (LSTM) or 0.5x (ResNet) the examples,
  within `tolerance` points). "dominated" counts the grown runs (seeds) for
  which some fixed-batch run of the workload, at any k, took as few steps
  with fewer examples: the Pareto claim wants 0.
  """
  lines = ["| workload | k | seeds | fixed steps | grown steps | steps ratio | fixed examples x B0·T0 "
           "| grown examples x B0·T0 | examples ratio | grown accuracy vs baseline | largest batch "
           "| dominated |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
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
          f"| {sum(dominated(run, of('adaptive')) for run in grown)}/{len(grown)} |")
  return "\n".join(lines) if len(lines) > 2 else ""


def dominated(run: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> bool:
  """Whether one of `others` took at most `run`'s steps with fewer examples (Pareto).

  Example:
    >>> dominated({"steps": 900, "examples": 5e5}, [{"steps": 850, "examples": 4e5}])
    True
  """
  return any(o["steps"] <= run["steps"] and o["examples"] < run["examples"] for o in others)

