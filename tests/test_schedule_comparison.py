"""DATE against the field's batch schedules (dateopt.study.compare): grid, frontiers, report."""

import csv
import json
import math
import os

import pytest

from dateopt import configs
from dateopt.study import Cell, cell_config, compare
from dateopt.study import __main__ as study_main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "study_tiny_config.py")


def test_the_grid_sweeps_each_method_and_drops_a_first_batch_above_the_largest():
  cells = compare.comparison_grid(["lstm"], seeds=(0, 1, 2))
  keys = [c.key for c in cells]
  assert keys[:3] == [f"lstm/baseline/1x/seed{s}" for s in range(3)]
  assert keys[3:9] == [f"lstm/{m}/64x/seed{s}" for m in ("adaptive", "adaptive_grow")
                       for s in range(3)]
  assert "lstm/legw/64x/budget2x/seed0" in keys and "lstm/legw/64x/seed0" in keys
  swept = [c for c in cells if c.strategy in compare.SWEEPS]
  assert len(swept) == 3 + 4 * 9 and {c.seed for c in swept} == {0}
  assert "lstm/seesaw/64x/start16x/budget3x/seed0" in keys
  small = compare.comparison_grid(["lstm"], multiple=8, seeds=(0,))
  assert not [c for c in small if c.setting == "start16x"]
  assert len([c for c in small if c.strategy == "seesaw"]) == 2 * 3


def test_a_field_cell_plans_its_schedule_with_its_setting_and_budget():
  base = configs.load("study_mnist1d_lstm")
  cell = Cell("lstm", "linear_ramp", 64, 0, "ramp0.2", 2.0)
  config = cell_config(base, cell, num_train_examples=60_000)
  assert config.strategy == "linear_ramp" and config.batch_size == 2048
  assert config.plan.to_dict() == {"schedule_options": {"ramp_share": 0.2}, "budget": 2.0}
  legw = cell_config(base, Cell("lstm", "legw", 64, 0, "", 3.0), num_train_examples=60_000)
  assert legw.plan.to_dict() == {"budget": 3.0}
  assert legw.eval_every_steps == max(1, 3 * 7500 // 64 // 16)
  # --adam-scaling: every strategy's plan takes the Adam family's rules.
  args = study_main.parse_args(["--workload", "lstm", "--adam-scaling", "b2,eps"])
  scaled = study_main.workload_configs(args)["lstm"]
  for strategy in ("seesaw", "adaptive_grow", "legw"):
    config = cell_config(scaled, Cell("lstm", strategy, 64, 0, "start4x" * (strategy == "seesaw")),
                         num_train_examples=60_000)
    assert tuple(config.plan.adam_scaling) == ("b2", "eps")


def test_the_frontier_by_hand():
  assert compare.envelope([(3, 10), (1, 40), (2, 50), (2, 20), (4, 12)]) == [
      (1, 40), (2, 20), (3, 10)]
  frontier = [(100, 400), (400, 100)]
  assert compare.envelope_steps(frontier, 200) == pytest.approx(200.0)  # log-log: √(400·100)
  assert compare.envelope_steps(frontier, 99) is None  # no run reached the bar with so few
  assert compare.envelope_steps(frontier, 1000) == 100.0  # more examples: its last point


def _row(strategy, seed, steps, examples, accuracy, setting="", budget=1.0, multiple=64):
  key = Cell("lstm", strategy, multiple, seed, setting, budget).key
  return {"key": key, "workload": "lstm", "strategy": strategy, "multiple": multiple,
          "seed": seed, "setting": setting, "budget": budget, "steps": steps,
          "examples": examples, "final_accuracy": accuracy, "guard_skipped": 0}


def _rows():
  rows = [_row("baseline", s, 1000, 10_000, 0.98, multiple=1) for s in range(3)]
  rows += [_row("adaptive_grow", s, 100, 20_000 + 1000 * s, 0.975) for s in range(3)]
  # The ramp: two runs at the bar (the frontier (15k, 200), (30k, 110)) and one below it.
  rows += [_row("linear_ramp", 0, 200, 15_000, 0.972, "ramp0.05"),
           _row("linear_ramp", 0, 110, 30_000, 0.979, "ramp0.05", 2.0),
           _row("linear_ramp", 0, 60, 40_000, 0.90, "ramp0.2", 3.0)]
  # Seesaw: one run that takes fewer steps with fewer examples than a DATE grown run.
  rows += [_row("seesaw", 0, 90, 19_000, 0.976, "start16x")]
  return rows


def test_the_comparison_by_hand():
  rows = _rows()
  assert compare.quality_bar(rows, "lstm") == pytest.approx(0.97)
  entries = {e["method"]: e for e in compare.summarize_comparison(rows)}
  ramp = entries["linear_ramp"]
  assert ramp["at_bar"] == 2 and ramp["runs"] == 3 and ramp["setting"] == "ramp0.05, budget 2×"
  # DATE grown: 100 steps at 21,000 examples; the ramp's frontier there, log-log between
  # (15k, 200) and (30k, 110).
  expected = 200 * (110 / 200) ** (math.log(21 / 15) / math.log(2))  # 159.7 steps
  assert ramp["frontier_at_date"] == pytest.approx(expected)
  assert ramp["date_over_frontier"] == pytest.approx(100 / expected)
  seesaw = entries["seesaw"]
  assert seesaw["dominates_date"] == ["lstm/seesaw/64x/start16x/seed0"]  # all three seeds
  text = compare.comparison_report(list(entries.values()))
  assert "| linear ramp (Megatron-LM) | ramp0.05, budget 2× | 1 |" in text
  assert "not against Seesaw" in text and "Runs that dominate a DATE grown run" in text
  health = compare.health_report([dict(rows[0], peak_lr=0.008, loss_trend=0.42)])
  assert "| lstm/baseline/1x/seed0 | 1,000 | 10,000 | 98.00% | 0 | 0.008 | 0.42 |" in health
  # A run too short for a trend (its JSON null) and a row without its log read: "—".
  health = compare.health_report([dict(rows[0], peak_lr=0.008, loss_trend=None), rows[0]])
  assert health.count("| lstm/baseline/1x/seed0 | 1,000 | 10,000 | 98.00% | 0 |") == 2
  assert "| 0.008 | — |" in health and "| — | — |" in health
  # The other seeds of each method's best run at the bar: the ramp's budget-2 run (110
  # steps, the fewest at the bar), Seesaw's only run (which also dominates DATE grown).
  again = [c.key for c in compare.reseeded(rows)]
  assert again == ["lstm/linear_ramp/64x/ramp0.05/budget2x/seed1",
                   "lstm/linear_ramp/64x/ramp0.05/budget2x/seed2",
                   "lstm/seesaw/64x/start16x/seed1", "lstm/seesaw/64x/start16x/seed2"]
  # A run at the bar that dominates DATE grown is reseeded too, beside the best one.
  rows += [_row("linear_ramp", 0, 60, 40_000, 0.975, "ramp0.5", 3.0),  # the best now
           _row("linear_ramp", 0, 95, 15_000, 0.971, "ramp0.2")]  # dominates DATE grown
  again = [c.key for c in compare.reseeded(rows)]
  assert again[:4] == ["lstm/linear_ramp/64x/ramp0.5/budget3x/seed1",
                       "lstm/linear_ramp/64x/ramp0.5/budget3x/seed2",
                       "lstm/linear_ramp/64x/ramp0.2/seed1", "lstm/linear_ramp/64x/ramp0.2/seed2"]
  assert len(again) == 6


def test_the_verdict_needs_date_grown_at_the_bar_and_counts_only_the_largest_batch():
  rows = _rows() + [_row("adaptive_grow", 0, 10, 5_000, 0.99, multiple=8),
                    _row("linear_ramp", 0, 5, 5_000, 0.99, "ramp0.05", multiple=8)]
  entries = {e["method"]: e for e in compare.summarize_comparison(rows)}
  assert entries["adaptive_grow"]["steps"] == 100 and entries["linear_ramp"]["runs"] == 3
  missed = [dict(r, final_accuracy=0.5) if r["strategy"] == "adaptive_grow" else r
            for r in _rows()]
  text = compare.comparison_report(compare.summarize_comparison(missed))
  assert "DATE grown misses the quality bar (0 of its 3 runs at it)" in text
  alone = [r for r in _rows() if r["strategy"] in ("baseline", "adaptive_grow")]
  text = compare.comparison_report(compare.summarize_comparison(alone))
  assert "nothing to compare DATE grown with" in text


def test_the_frontier_figure_is_written(tmp_path):
  pytest.importorskip("matplotlib")
  from dateopt.study import figures
  path = figures.plot_schedule_frontiers(_rows(), str(tmp_path / "f.png"), bar=0.97,
                                         title="lstm: steps against examples")
  assert os.path.getsize(path) > 5000


@pytest.mark.slow
def test_a_small_comparison_runs_end_to_end_and_resumes(tmp_path):
  # At 2x only Seesaw's first setting fits (start 1x B0); 1 seed, 1 budget: 3 cells.
  argv = ["--compare", "--workload", "tiny", "--config", f"tiny={TINY}", "--quick",
          "--multiples", "2", "--seeds", "1", "--budgets", "1",
          "--methods", "adaptive_grow,seesaw", "--outdir", str(tmp_path), "--no-progress"]
  study_main.main(argv)
  rows = [json.loads(line) for line in (tmp_path / "cells.jsonl").read_text().splitlines()]
  assert sorted(r["key"] for r in rows) == [
      "tiny/adaptive_grow/2x/seed0", "tiny/baseline/1x/seed0", "tiny/seesaw/2x/start1x/seed0"]
  seesaw = next(r for r in rows if r["strategy"] == "seesaw")
  # The schedule halves half-way after its warmup: the batch doubles to 16 there, and the run
  # takes the steps the plan predicted (`BatchSchedule.steps_for`).
  assert seesaw["largest_batch"] == 16 and seesaw["steps"] == 226 == seesaw["predicted_steps"]
  assert seesaw["peak_lr"] > 0 and "loss_trend" in seesaw
  with open(tmp_path / "results.csv", encoding="utf-8") as f:
    assert {line["setting"] for line in csv.DictReader(f)} == {"", "start1x"}
  text = (tmp_path / "results.md").read_text()
  assert "#### tiny" in text and "Seesaw" in text and (tmp_path / "tiny_frontiers.png").exists()
  assert (tmp_path / "tiny_curves.png").exists()
  study_main.main(argv)  # every cell finished: nothing runs again
  assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 3
