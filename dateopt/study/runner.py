"""The grid, run and resumed: `Study` appends each finished cell to `<outdir>/cells.jsonl`.

A cell whose strategy has no recipe at its batch (`cells.planning_refusal`) is
kept in `<outdir>/unplannable.jsonl` with the planner's reason instead.
A re-run skips the finished cells (resumable across runs), and studies
sharing an outdir split its cells (each cell is claimed with a workdir lock).

Example:
  >>> runner = Study("runs/scaling_study", {"lstm": configs.load("study_mnist1d_lstm")})
  >>> rows = runner.run(grid(["lstm"], multiples=(1, 4), seeds=(0,)))
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import statistics
from typing import Any, Iterator, Mapping, Sequence

import ml_collections
from tqdm.auto import tqdm

from dateopt import data, strict_json
from dateopt.study.cells import (ADAPTIVE_STRATEGIES, STRATEGIES, Cell, cell_config,
                                 filled_profile, planning_refusal, run_cell)
from dateopt.date._planner import PlanningError
from dateopt.train import workdir_lock
from dateopt.validation import check_choice

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
    self.unplannable_path = os.path.join(outdir, "unplannable.jsonl")
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

  def unplannable(self) -> list[dict[str, Any]]:
    """The cells whose strategy cannot plan a recipe: the cell's fields and `reason`."""
    if not os.path.exists(self.unplannable_path):
      return []
    with open(self.unplannable_path, encoding="utf-8") as f:
      by_key = {row["key"]: row for row in (json.loads(line) for line in f if line.strip())}
    return list(by_key.values())

  def forget(self, strategies: Sequence[str]) -> int:
    """Drops the finished rows of `strategies` (a backup stays in cells.jsonl.bak), and their
    refused cells, which a re-run then plans again; returns the finished rows dropped."""
    for strategy in strategies:
      check_choice("strategies", strategy, tuple(STRATEGIES))
    _drop_rows(self.unplannable_path, self.unplannable(), strategies)
    return _drop_rows(self.results_path, self.rows(), strategies)

  def run(self, cells: Sequence[Cell], *, progress: bool = True) -> list[dict[str, Any]]:
    """Runs the unfinished `cells` in order; returns every finished row."""
    unknown = sorted({c.workload for c in cells} - set(self.configs))
    if unknown:
      raise ValueError(f"workloads {unknown} have no config; known: {sorted(self.configs)}.")
    done = {row["key"] for row in self.rows() + self.unplannable()}
    todo = [cell for cell in cells if cell.key not in done]
    bar = tqdm(total=len(cells), initial=len(cells) - len(todo), unit="run",
               disable=not progress, dynamic_ncols=True)
    for cell in todo:
      with self._claim(cell) as claimed:
        if not claimed:
          bar.write(f"{cell.key}: skipped, another process is running it")
        elif cell.key not in {row["key"] for row in self.rows() + self.unplannable()}:
          # (another process has not finished or refused it meanwhile)
          bar.set_description(cell.key)
          config, reason = self._config_or_refusal(cell)
          if reason is not None:
            self._append({"key": cell.key, **dataclasses.asdict(cell), "reason": reason},
                         self.unplannable_path)
            bar.write(f"{cell.key}: not plannable: {reason}")
          else:
            row = run_cell(cell, config, self.workdir(cell))
            self._append(row)
            bar.write(_one_line(row))
      bar.update(1)
    bar.close()
    return self.rows()

  def _config_or_refusal(self, cell: Cell) -> tuple[ml_collections.ConfigDict | None,
                                                     str | None]:
    """The cell's config, or None and the planner's reason when its rule has no recipe."""
    if cell.strategy == "baseline":
      return self.config_for(cell), None
    try:
      config = self.config_for(cell)  # a field schedule's steps are planned here
    except PlanningError as error:
      return None, str(error)
    return config, planning_refusal(cell, config, self.num_train_examples(cell.workload))

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
      if same_seed and same_seed[0]["noise_scales"]:
        # The baseline's profile, which DATE's prediction reads at its batch; a reading
        # with |G|² ≤ 0 (inf) holds the one before, as the engine holds its gain there.
        noise = filled_profile(same_seed[0]["noise_scales"])
    if cell.strategy == "legw_date_steps":
      steps = [r["steps"] for r in rows
               if r["strategy"] == "adaptive" and r["multiple"] == cell.multiple
               and not r.get("setting", "") and not r.get("gave_up")]  # every rule on, finished
      date_steps = round(statistics.mean(steps)) if steps else None
    return cell_config(self.configs[cell.workload], cell,
                       num_train_examples=self.num_train_examples(cell.workload),
                       noise_scale=noise, date_steps=date_steps)

  def num_train_examples(self, workload: str) -> int:
    """The training examples of `workload`'s dataset (epochs ↔ steps)."""
    if workload not in self._train_example_counts:
      config = self.configs[workload]
      dataset = data.get_dataset(config.dataset, data_dir=config.data_dir,
                                 **config.dataset_kwargs.to_dict())
      self._train_example_counts[workload] = dataset.num_train_examples
    return self._train_example_counts[workload]

  def _append(self, row: dict[str, Any], path: str | None = None) -> None:
    os.makedirs(self.outdir, exist_ok=True)
    with open(path or self.results_path, "a", encoding="utf-8") as f:
      f.write(strict_json.line(row))
      f.flush()
      os.fsync(f.fileno())


def _one_line(row: Mapping[str, Any]) -> str:
  predicted = row.get("predicted_steps")
  quality = (f"validation loss {row['final_loss']:.4f}" if "final_loss" in row
             else f"{100 * row['final_accuracy']:.2f}%")
  return (f"{row['key']}: {quality} in {row['steps']:,} steps"
          + (f" (predicted {predicted:,})" if predicted and row["strategy"] == "adaptive" else "")
          + f", {row['wall_seconds']:.0f} s")


def _drop_rows(path: str, rows: Sequence[dict[str, Any]], strategies: Sequence[str]) -> int:
  """Rewrites the JSON lines at `path` without the `strategies`' rows, atomically (the old
  file stays as .bak); returns how many it dropped."""
  kept = [row for row in rows if row["strategy"] not in strategies]
  if len(kept) < len(rows):
    shutil.copy(path, path + ".bak")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.writelines(strict_json.line(row) for row in kept)
    os.replace(tmp, path)
  return len(rows) - len(kept)
