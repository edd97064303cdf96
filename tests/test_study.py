"""The batch-scaling study (dateopt.study, python -m dateopt.study): grid, configs, tables, --quick."""

import csv
import doctest
import json
import math
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from dateopt import configs, date, study
from dateopt.study import __main__ as study_main
from dateopt.train import experiment
from dateopt.date import _noise as noise_lib
from dateopt.date import _planner as planner_lib

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "study_tiny_config.py")


def test_grid_has_the_study_cells_in_dependency_order():
  cells = study.grid(["lstm"])
  # 3 baselines; 6 batches x (3 DATE seeds + 4 static rules + LEGW at DATE's steps).
  assert len(cells) == 3 + 6 * (3 + 4 + 1)
  assert len({c.key for c in cells}) == len(cells)
  order = [c.strategy for c in cells]
  assert order[:3] == ["baseline"] * 3 and order[3] == "adaptive"
  assert order.index("legw_date_steps") > max(i for i, s in enumerate(order) if s == "adaptive")
  assert {c.multiple for c in cells if c.strategy == "legw"} == {2, 4, 8, 16, 32, 64}
  assert {c.seed for c in cells if c.strategy == "none"} == {0}
  with pytest.raises(ValueError, match="strategies"):
    study.grid(["lstm"], strategies=["baseline", "lars"])
  with pytest.raises(ValueError, match="multiples"):
    study.grid(["lstm"], multiples=(0, 2))


def _planned(config, n=1600):
  return experiment.plan_recipe(config, n)


def test_cell_configs_change_only_what_the_strategy_changes():
  base = configs.load(TINY)  # batch 8, 2 epochs of 1,600 train examples: 400 steps
  n = 1600

  baseline = study.cell_config(base, study.Cell("t", "baseline", 1, 2), num_train_examples=n)
  assert baseline.batch_size is None and baseline.seed == 2
  assert baseline.checkpoint_every_steps == -1 and not baseline.progress_bar
  assert baseline.baseline.to_dict() == base.baseline.to_dict()

  legw = study.cell_config(base, study.Cell("t", "legw", 4, 0), num_train_examples=n)
  _, recipe = _planned(legw, n)
  assert recipe.batch_size == 32 and recipe.total_steps == 100  # equal epochs
  assert recipe.learning_rate == pytest.approx(1e-2 * 2)  # √4

  linear = study.cell_config(base, study.Cell("t", "linear", 4, 0), num_train_examples=n)
  _, recipe = _planned(linear, n)
  assert recipe.learning_rate == pytest.approx(1e-2 * 4)
  assert recipe.warmup_epochs == pytest.approx(2 * 5 / 90)  # Goyal's share of the epochs

  dated = study.cell_config(base, study.Cell("t", "legw_date_steps", 4, 0),
                            num_train_examples=n, date_steps=137)
  _, recipe = _planned(dated, n)
  assert recipe.total_steps == 137 and recipe.learning_rate == pytest.approx(2e-2)
  assert recipe.warmup_epochs == pytest.approx(4 * 0.02)  # LEGW's, unchanged by the length
  with pytest.raises(ValueError, match="DATE's runs"):
    study.cell_config(base, study.Cell("t", "legw_date_steps", 4, 0), num_train_examples=n)

  adaptive = study.cell_config(base, study.Cell("t", "adaptive", 4, 1), num_train_examples=n,
                               noise_scale=[50.0])
  _, recipe = _planned(adaptive, n)
  assert recipe.adaptive and recipe.base_batch_size == 8
  assert list(adaptive.plan.noise_scale) == [50.0]
  assert planner_lib.plan_predicted_steps(recipe, 50.0) == noise_lib.predicted_steps(  # read × 4^0.2 at 32
      50.0 * 4 ** 0.2, base_batch_size=8, batch_size=32, base_steps=400,
      warmup_steps=recipe.warmup_steps)


def test_effective_noise_scale_and_the_law_by_hand():
  # A constant noise scale is its own effective value.
  assert study.effective_noise_scale([500.0] * 3, 32, 512) == pytest.approx(500.0)
  values = [500.0, math.inf, 100.0, 40.0]
  gains = [noise_lib.adascale_gain(v, 32, 512) for v in values]
  harmonic = len(gains) / sum(1 / g for g in gains)
  assert noise_lib.adascale_gain(study.effective_noise_scale(values, 32, 512), 32, 512) == (
      pytest.approx(harmonic, rel=1e-9))
  # S(B) = S0 (1 + Bn/B)/(1 + Bn/B0): 1000 (1 + 100/1000)/(1 + 100/10) = 100.
  assert noise_lib.law_steps(1000, 100.0, base_batch_size=10, batch_size=1000) == pytest.approx(100.0)
  assert noise_lib.law_steps(1000, 100.0, base_batch_size=10, batch_size=10) == pytest.approx(1000.0)


def _row(strategy, k, seed, accuracy, steps, curve, noise=()):
  return {"key": f"w/{strategy}/{k}x/seed{seed}", "workload": "w", "strategy": strategy,
          "multiple": k, "seed": seed, "batch": 32 * k, "base_batch": 32, "steps": steps,
          "examples": steps * 32 * k, "predicted_steps": 110 if strategy == "adaptive" else steps,
          "final_accuracy": accuracy, "best_accuracy": max(a for _, a in curve),
          "wall_seconds": 1.0, "guard_skipped": 0, "guard_lr_multiplier": 1.0,
          "noise_scales": list(noise), "eval_steps": [s for s, _ in curve],
          "eval_accuracy": [a for _, a in curve]}


def _rows():
  return [
      _row("baseline", 1, 0, 0.96, 1000, [(500, 0.90), (1000, 0.96)], [200.0, 400.0]),
      _row("baseline", 1, 1, 0.98, 1000, [(500, 0.95), (1000, 0.98)], [300.0]),
      _row("adaptive", 64, 0, 0.97, 90, [(30, 0.80), (60, 0.965), (90, 0.97)]),
      _row("adaptive", 64, 1, 0.95, 130, [(65, 0.90), (130, 0.95)]),
      _row("none", 64, 0, 0.50, 16, [(16, 0.50)]),
  ]


def test_summary_tables_and_bar_by_hand(tmp_path):
  rows = _rows()
  # Target: mean baseline accuracy 0.97 less 1 point = 0.96.
  assert study.baseline_target(rows, "w") == pytest.approx(0.96)
  assert study.steps_to_target(rows[2], 0.96) == 60
  assert study.steps_to_target(rows[3], 0.96) is None
  summary = {(e["strategy"], e["multiple"]): e for e in study.summarize(rows)}
  base, dyn = summary[("baseline", 1)], summary[("adaptive", 64)]
  assert base["accuracy"] == pytest.approx(97.0) and base["accuracy_std"] == pytest.approx(
      math.sqrt(2) * 1.0)  # stdev of (96, 98)
  assert base["steps_to_target"] == 1000 and base["noise_scale_median"] == 300.0
  assert dyn["accuracy"] == pytest.approx(96.0) and dyn["steps"] == 110
  assert dyn["steps_to_target"] == 60 and dyn["reached"] == 1
  assert summary[("none", 64)]["steps_to_target"] is None

  bar = study.bar_check(list(summary.values()))
  assert bar == {"accuracy_misses": [], "prediction_misses": [], "steps_ratio_64x": 0.11}
  text = study.markdown_report(list(summary.values()))
  assert "| 2,048 (64x) | 96.00 ± 1.41 (110) |" in text
  assert "0.110 of the baseline's (> 1/10)" in text
  assert "within 1 point of the baseline at every k: yes" in text

  path = study.write_csv(rows, str(tmp_path / "r.csv"))
  with open(path, encoding="utf-8") as f:
    lines = list(csv.DictReader(f))
  assert [line["strategy"] for line in lines] == ["baseline", "baseline", "adaptive",
                                                   "adaptive", "none"]
  assert lines[2]["steps_to_target"] == "60" and lines[3]["steps_to_target"] == ""


def _lm_row(strategy, k, seed, loss, steps, grows=False):
  row = _row(strategy, k, seed, 0.5, steps, [(steps, 0.5)])
  tokens_per_step = 32 * k * 128 // (4 if grows else 1)  # a grown run's mean batch: k/4
  return dict(row, final_loss=loss, final_bits_per_byte=loss / math.log(2),
              tokens=steps * tokens_per_step, eval_loss=[loss])


def test_language_model_report_by_hand():
  rows = [_lm_row("baseline", 1, 0, 2.00, 1000), _lm_row("baseline", 1, 1, 2.02, 1000),
          _lm_row("adaptive", 16, 0, 2.015, 120), _lm_row("adaptive", 16, 1, 2.025, 120),
          _lm_row("adaptive_grow", 64, 0, 2.00, 100, grows=True),
          _lm_row("legw", 16, 0, 2.30, 63)]
  summary = {(e["strategy"], e["multiple"]): e for e in study.summarize(rows)}
  fixed = summary[("adaptive", 16)]
  assert fixed["loss"] == pytest.approx(2.02) and fixed["worst_loss"] == 2.025
  assert fixed["tokens"] == 120 * 32 * 16 * 128
  text = study.language_model_report(list(summary.values()))
  # Baseline 2.01 nats in 1,000 steps. Fixed 16x: 2.02 (+0.50%) in 120 steps (0.120 <= 1/8),
  # 1.92x the tokens: met. Grown: 2.00 (-0.50%) in 100 steps at 100 * 16 / 1000 = 1.60x the
  # tokens: met. LEGW has no bar.
  assert ("| DATE adaptive | 512 (16x) | 2 | 2.0200 ± 0.0071 | +0.50% | +0.75% | 2.914 | 120 "
          "| 0.120 | 1.92 | met |") in text
  assert "| DATE adaptive, batch grown | 2,048 (64x) | 1 | 2.0000 ± 0.0000 | -0.50% " in text
  assert text.splitlines()[-2].endswith("| 1.60 | met |")
  assert text.splitlines()[-1].endswith("| 0.063 | 1.01 |  |")
  # Over the loss bar by a hair: NOT met.
  rows[2], rows[3] = _lm_row("adaptive", 16, 0, 2.031, 120), _lm_row("adaptive", 16, 1, 2.031, 120)
  text = study.language_model_report(study.summarize(rows))
  assert "| +1.04% | +1.04% | 2.930 | 120 | 0.120 | 1.92 | NOT met |" in text
  # A classifier's rows have no loss: no section.
  assert study.language_model_report(study.summarize(_rows())) == ""


def test_growth_report_by_hand():
  rows = _rows()[:2] + [
      _row("adaptive", 16, 0, 0.97, 200, [(200, 0.97)]),     # 200 steps, 102,400 examples
      _row("adaptive", 64, 0, 0.97, 100, [(100, 0.97)]),     # 100 steps, 204,800 examples
      dict(_row("adaptive_grow", 64, 0, 0.965, 120, [(120, 0.965)]), examples=80_000,
           largest_batch=1024, wall_seconds=2.0),          # below both fixed runs
      dict(_row("adaptive_grow", 64, 1, 0.965, 210, [(210, 0.965)]), examples=150_000,
           largest_batch=2048, wall_seconds=5.0),          # 16x took fewer steps, fewer examples
  ]
  rows[3]["wall_seconds"] = 9.0  # fixed 64x
  text = study.growth_report(rows)
  # Baseline: 1000 steps x 32, 97%. Fixed 64x: 100 steps, 6.40x. Grown: 165 steps, 115,000
  # examples = 3.59x (0.56 of fixed), 96.5%; wall seconds 9 (fixed) and (2 + 5)/2 = 3.5,
  # printed to the second (round half to even: 4).
  assert ("| w | 64 | 2 | 100 | 165 | 1.65 | 6.40 | 3.59 | 0.56 | -0.50 points | 2,048 | 1/2 "
          "| 9 | 4 |" in text)
  assert not study.dominated(rows[4], [rows[2], rows[3]])
  assert study.dominated(rows[5], [rows[2], rows[3]])


def test_law_report_plays_each_strategy_s_measured_profile(tmp_path):
  """Fixed runs that read B_noise 100 throughout and grown runs that read 400: the law on each
  profile, for both recipes, against the closed form (fixed) and the engine's rule played out
  (grown); a run without its workdir is left out."""
  runner = study.Study(str(tmp_path), {})
  base = date.Recipe(batch_size=32, num_examples=32_000, num_epochs=1, learning_rate=0.1,
                     optimizer="sgd", warmup_epochs=0.1)
  rows = [dict(_row("baseline", 1, 0, 0.97, 1000, [(1000, 0.97)]))]
  for strategy, seed, noise, steps in (("adaptive", 0, 100.0, 300), ("adaptive", 1, 100.0, 310),
                                       ("adaptive_grow", 0, 400.0, 500),
                                       ("adaptive_grow", 1, 400.0, 520)):
    rows.append(_row(strategy, 16, seed, 0.97, steps, [(steps, 0.97)]))
    folder = runner.workdir(study.Cell("w", strategy, 16, seed))
    os.makedirs(folder)
    recipe = date.plan(base, 512, "adaptive", grow_batch=strategy == "adaptive_grow")
    with open(os.path.join(folder, "recipe.json"), "w") as f:
      json.dump({"planned": recipe.to_dict()}, f)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
      for step in range(1, 201):  # progress 5 baseline steps a step: the whole profile
        # The grown runs read their first half at batch 128, credited × 4^0.2 to 512's.
        batch = 128 if strategy == "adaptive_grow" and step <= 100 else 512
        f.write(json.dumps({"step": step, "train/loss": 1.0, "train/date/progress": 5.0 * step,
                            "train/date/noise_scale": noise, "train/batch_size": batch}) + "\n")
  rows.append(_row("adaptive_grow", 16, 2, 0.97, 999, [(999, 0.97)]))  # no workdir
  lines = [line for line in study.law_report(runner, rows).splitlines() if "| w |" in line]
  ladder = date.batch_ladder(32, 512)
  early = 400.0 * 4 ** date.EngineConfig().noise_batch_exponent
  for line, profile, measured in zip(lines, ([100.0] * 100, [early] * 50 + [400.0] * 50),
                                     ("305, 4.88x", "510, 8.16x")):
    grown = date.predicted_budget(profile, base_batch_size=32, batch_sizes=ladder,
                                  base_steps=1000, warmup_steps=100, read_at_batch_size=512)
    fixed = date.predicted_budget(profile, base_batch_size=32, batch_sizes=(512,),
                                  base_steps=1000, warmup_steps=100, read_at_batch_size=512)
    quarters = " / ".join(f"{v:,.0f}" for v in (profile[0], profile[25], profile[50], profile[99]))
    assert line == (f"| w | 16 | {'fixed' if profile[0] == 100.0 else 'grown'} runs (2) "
                    f"| {quarters} | {grown['steps']:,} steps, {grown['examples_vs_baseline']:.2f}x "
                    f"| {fixed['steps']:,} steps, {fixed['examples_vs_baseline']:.2f}x "
                    f"| {measured} |")
  assert len(lines) == 2
  # The fixed runs' profile, read at their own batch, plays as logged: the closed form.
  closed_form = noise_lib.predicted_steps(100.0, base_batch_size=32, batch_size=512, base_steps=1000,
                                     warmup_steps=100)
  assert lines[0].split(" | ")[5].startswith(f"{closed_form:,} steps")


def test_prediction_report_plays_the_baseline_s_profile_for_each_cell(tmp_path):
  """Baselines that logged B_noise 100 throughout: each DATE 4x cell is predicted from its
  seed's baseline profile, read × 4^0.2 at batch 32, which for a fixed batch is the closed
  form; the report needs the rows and the config only."""
  runner = study.Study(str(tmp_path), {"t": configs.load(TINY)})  # batch 8, 400 steps
  rows = [dict(_row("baseline", 1, seed, 0.97, 400, [(400, 0.97)], [100.0] * 20),
               workload="t", batch=8, base_batch=8, examples=3200) for seed in (0, 1)]
  rows += [dict(_row("adaptive", 4, seed, 0.97, steps, [(steps, 0.97)]), workload="t",
                batch=32, base_batch=8, examples=32 * steps) for seed, steps in ((0, 140), (1, 160))]
  for row in rows:
    runner._append(row)
  lines = [line for line in study.prediction_report(runner, runner.rows()).splitlines()
           if "| t |" in line]
  _, recipe = _planned(runner.config_for(study.Cell("t", "adaptive", 4, 0)))
  predicted = noise_lib.predicted_steps(100.0 * 4 ** 0.2, base_batch_size=8, batch_size=32,
                                   base_steps=400, warmup_steps=recipe.warmup_steps)
  assert lines == [f"| t | 4 | DATE adaptive | {predicted:,} | 150 | {predicted / 150 - 1:+.0%} "
                   f"| {predicted * 32 / 3200:.2f} | 1.50 |"]


def test_a_cell_plans_from_its_baseline_s_profile_with_inf_readings_held(tmp_path):
  """A baseline that logged 100 with every other reading inf (|G|² ≤ 0): the engine holds its
  gain there, so the plan reads 100 throughout: the closed form at 100 × 4^0.2, which also
  sets the cell's eval cadence."""
  runner = study.Study(str(tmp_path), {"t": configs.load(TINY)})
  noise = [100.0, math.inf] * 10
  runner._append(dict(_row("baseline", 1, 0, 0.97, 400, [(400, 0.97)], noise), workload="t",
                      batch=8, base_batch=8, examples=3200))
  config = runner.config_for(study.Cell("t", "adaptive", 4, 0))
  assert config.plan.noise_scale == [100.0] * 20
  _, recipe = _planned(config)
  predicted = noise_lib.predicted_steps(100.0 * 4 ** 0.2, base_batch_size=8, batch_size=32,
                                   base_steps=400, warmup_steps=recipe.warmup_steps)
  assert config.eval_every_steps == predicted // study.cells.EVALS_PER_RUN


def test_filled_profile_by_hand():
  assert study.filled_profile([math.nan, 40.0, math.inf, 0.5, 7.0]) == [40.0, 40.0, 40.0, 1.0,
                                                                          7.0]
  assert study.filled_profile([math.nan]) == [1.0]


def test_price_frontier_plays_a_run_s_readings_at_each_price(tmp_path):
  """A grown run that read B_noise 400 throughout: scripts/price_frontier.py's play-out at
  prices 0.5 and 4 is the engine's rule on that constant, called directly, and the higher
  price buys fewer steps for more examples."""
  frontier = _load_script("price_frontier")
  base = date.Recipe(batch_size=32, num_examples=32_000, num_epochs=1, learning_rate=0.1,
                     optimizer="sgd", warmup_epochs=0.1)
  recipe = date.plan(base, 512, "adaptive", grow_batch=True)
  with open(tmp_path / "recipe.json", "w") as f:
    json.dump({"planned": recipe.to_dict()}, f)
  with open(tmp_path / "metrics.jsonl", "w") as f:
    for step in range(1, 201):
      f.write(json.dumps({"step": step, "train/loss": 1.0, "train/date/progress": 5.0 * step,
                          "train/date/noise_scale": 400.0}) + "\n")
    f.write(json.dumps({"step": 200, "run/steps": 200, "run/examples_vs_baseline": 2.5}) + "\n")
  result = frontier.run_frontier(str(tmp_path), [0.5, 4.0])
  assert (result["steps"], result["examples_vs_baseline"], result["price"]) == (200, 2.5, 1.0)
  for price in (0.5, 4.0):
    assert result["law"][price] == date.predicted_budget(
        400.0, base_batch_size=32, batch_sizes=date.batch_ladder(32, 512), base_steps=1000,
        warmup_steps=100, config=date.EngineConfig(step_price=price), read_at_batch_size=512)
  cheap, dear = result["law"][0.5], result["law"][4.0]
  assert dear["steps"] < cheap["steps"] and dear["examples"] > cheap["examples"]
  table = frontier.markdown([result], [0.5, 4.0]).splitlines()
  assert table[2].startswith(f"| {tmp_path} | 1 | 200, 2.50x | {cheap['steps']:,}, ")


def test_price_frontier_matches_a_run_s_loss_to_the_baseline_s_progress(tmp_path):
  """The baseline's loss falls 0.001 a step (logged every 10 steps) and the run's falls 0.001
  per 2 baseline steps of credited progress: at credited progress 400 the run's loss is
  2 − 0.2 = 1.8, which the baseline reached at step 200 (ratio 0.5). A median over 5 rows of
  a straight line is the centre row, so smoothing moves nothing but the ends (3 rows there)."""
  frontier = _load_script("price_frontier")
  recipe = {"planned": date.Recipe(batch_size=32, num_examples=32_000, num_epochs=1,
                                   learning_rate=0.1, optimizer="sgd").to_dict()}

  def write(name, rows):
    os.makedirs(tmp_path / name)
    with open(tmp_path / name / "recipe.json", "w") as f:
      json.dump(recipe, f)
    with open(tmp_path / name / "metrics.jsonl", "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)

  write("base", [{"step": s, "train/loss": 2 - 0.001 * s} for s in range(10, 1001, 10)])
  write("run", [{"step": s, "train/loss": 2 - 0.0005 * 4 * s, "train/date/progress": 4.0 * s,
                 "train/batch_size": 128} for s in range(5, 201, 5)])
  matched = frontier.loss_matched(str(tmp_path / "run"), str(tmp_path / "base"), [400, 2000])
  tau, loss, reached, batch = matched[0]
  assert (tau, batch, reached) == (400.0, 128, 200.0) and loss == pytest.approx(1.8)
  # Past its end: the run's last row (τ 800), whose window holds its last three rows
  # (1.62, 1.61, 1.60): median 1.61, the baseline's at step 390.
  assert matched[1][0] == 800.0 and matched[1][1] == pytest.approx(1.61)
  assert matched[1][2] == pytest.approx(390.0)
  table = frontier.loss_matched_markdown([str(tmp_path / "run")], str(tmp_path / "base"), [400])
  assert table.splitlines()[2].endswith("| 1.800@128 → 200 (0.50x) |")


def _load_script(name, folder="scripts"):
  """`folder`/`name`.py as a module: scripts/ holds the tools, research/ the one-off probes."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(__file__), os.pardir, folder, f"{name}.py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_critical_batch_measures_both_noise_scales_of_a_known_quadratic():
  """ℓ(w; x) = ½ Σ_j h_j (w_j − x_j)², x ~ N(μ, diag c): per-example gradients H(w − x), so
  Σ = HCH and G = H(w − μ). By hand: B_simple = Σh²c / Σh²d² = 19 / 2.41 = 7.88 and
  B_crit = Σh³c / Σh³d² = 67.5 / 3.765 = 17.93 (d = w − μ); the script's estimates from eight
  batches of 256 groups of 8 land within 10% (4% and 6% off), and a docstring checks H = I
  (the two agree)."""
  critical = _load_script("critical_batch", "research")
  h, c = np.array([4.0, 2.0, 1.0, 0.5]), np.array([1.0, 0.25, 1.0, 4.0])
  mu, w = np.zeros(4), np.array([0.1, 0.5, 1.0, 1.0])
  loss = lambda p, b: 0.5 * jnp.mean(jnp.sum(jnp.asarray(h, jnp.float32) * (p - b["x"]) ** 2, -1))
  rng = np.random.default_rng(0)
  batches = [{"x": jnp.asarray(mu + np.sqrt(c) * rng.normal(size=(2048, 4)), jnp.float32)}
             for _ in range(8)]
  scales = critical.noise_scales(loss, jnp.asarray(w, jnp.float32), batches, 256)
  assert scales["b_simple"] == pytest.approx(19 / 2.41, rel=0.1)
  assert scales["b_crit"] == pytest.approx(67.5 / 3.765, rel=0.1)
  assert doctest.testmod(critical).failed == 0


def test_price_frontier_readings_at_take_the_logged_row_nearest_each_progress(tmp_path):
  """--readings-at: a run that read 10·τ at batch 64 up to τ 500 and at 128 after gives, at
  τ 240 and 880, the rows at τ 250 and 875 (every 125); a run with no reading gives blanks."""
  frontier = _load_script("price_frontier")
  recipe = date.plan(date.Recipe(batch_size=32, num_examples=32_000, num_epochs=1,
                                 learning_rate=0.1, optimizer="sgd"), 128, "adaptive")
  for name, noise in (("read", lambda tau: 10.0 * tau), ("unread", lambda tau: None)):
    os.makedirs(tmp_path / name)
    with open(tmp_path / name / "recipe.json", "w") as f:
      json.dump({"planned": recipe.to_dict()}, f)
    with open(tmp_path / name / "metrics.jsonl", "w") as f:
      f.write(json.dumps({"step": 1, "train/batch_size": 64.0}) + "\n")  # no progress: skipped
      for step in range(1, 9):
        tau = 125.0 * step
        f.write(json.dumps({"step": step, "train/date/progress": tau,
                            "train/date/noise_scale": noise(tau),
                            "train/batch_size": 64.0 if tau <= 500 else 128.0}) + "\n")
  assert frontier.readings_at(str(tmp_path / "read"), [240.0, 880.0]) == [(2500.0, 64),
                                                                        (8750.0, 128)]
  assert frontier.readings_at(str(tmp_path / "unread"), [240.0]) == [None]
  table = frontier.readings_markdown([str(tmp_path / "read"), str(tmp_path / "unread")],
                                     [240.0, 880.0]).splitlines()
  assert table[0] == "| run | τ 240 | τ 880 |"
  assert table[2] == f"| {tmp_path / 'read'} | 2,500@64 | 8,750@128 |"
  assert table[3] == f"| {tmp_path / 'unread'} |  |  |"
  with pytest.raises(FileNotFoundError, match="recipe.json"):
    frontier.readings_at(str(tmp_path / "missing"), [1.0])


def test_price_frontier_climbs_take_the_batch_share_of_a_reading_s_jump(tmp_path):
  """--climbs: B_noise 2^(τ/100), × 1.5 at batch 128; logs every 20 steps, τ 50 a log at
  batch 64 up to step 200 and 100 a log after. Across the climb (τ 500 → 700) the reading
  jumps 2² × 1.5 = 6; the run's own trend before (τ 400 → 500) is 2, scaled to 200 of
  progress 4: the batch's share is 1.5."""
  frontier = _load_script("price_frontier")
  recipe = date.plan(date.Recipe(batch_size=32, num_examples=32_000, num_epochs=1,
                                 learning_rate=0.1, optimizer="sgd"), 128, "adaptive",
                     grow_batch=True)
  with open(tmp_path / "recipe.json", "w") as f:
    json.dump({"planned": recipe.to_dict()}, f)
  with open(tmp_path / "metrics.jsonl", "w") as f:
    for k in range(1, 16):
      tau, batch = (50.0 * k, 64.0) if k <= 10 else (500.0 + 100.0 * (k - 10), 128.0)
      f.write(json.dumps({"step": 20 * k, "train/date/progress": tau, "train/batch_size": batch,
                          "train/date/noise_scale": 2 ** (tau / 100) * (1.5 if batch > 64
                                                                        else 1.0)}) + "\n")
  [(step, old, new, excess)] = frontier.climb_excesses(str(tmp_path))
  assert (step, old, new) == (220, 64, 128) and excess == pytest.approx(1.5)
  assert frontier.climbs_markdown([str(tmp_path)]).splitlines()[-1] == (
      "1 climbs, median excess 1.50 (range 1.50-1.50)")


def test_study_figures_are_written(tmp_path):
  pytest.importorskip("matplotlib")
  from dateopt.study import figures
  summary = study.summarize(_rows())
  for draw in (figures.plot_steps_to_target, figures.plot_steps_vs_examples):
    path = draw(summary, str(tmp_path / f"{draw.__name__}.png"), noise_scale=300.0)
    assert os.path.getsize(path) > 5000
  path = figures.plot_accuracy_vs_batch(summary, str(tmp_path / "acc.png"))
  assert os.path.getsize(path) > 5000
  unreached = [dict(e, steps_to_target=None) for e in summary]  # a short run: none got there
  for draw in (figures.plot_steps_to_target, figures.plot_steps_vs_examples):
    assert os.path.getsize(draw(unreached, str(tmp_path / "u.png"), noise_scale=300.0)) > 5000
  for noise in (float("inf"), float("nan"), 0.0):  # a short run's baseline measured none
    for draw in (figures.plot_steps_to_target, figures.plot_steps_vs_examples):
      assert os.path.getsize(draw(summary, str(tmp_path / "n.png"), noise_scale=noise)) > 5000


# The end-to-end study: the baseline, one static rule, DATE and the static rule at DATE's
# steps (the other static rules differ from LEGW only in their plan: tests/test_date_plan.py).
QUICK_STRATEGIES = ("baseline", "legw", "adaptive", "legw_date_steps")


def _quick(outdir):
  return subprocess.run(
      [sys.executable, "-m", "dateopt.study", "--workload", "tiny",
       "--config", f"tiny={TINY}", "--quick", "--strategies", ",".join(QUICK_STRATEGIES),
       "--outdir", str(outdir), "--no-progress"],
      capture_output=True, text=True, timeout=900, cwd=REPO,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_quick_study_end_to_end_and_resumes(tmp_path):
  out = _quick(tmp_path)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  with open(tmp_path / "results.csv", encoding="utf-8") as f:
    lines = list(csv.DictReader(f))
  assert sorted((line["strategy"], line["multiple"]) for line in lines) == sorted(
      [("baseline", "1")] + [(s, "4") for s in QUICK_STRATEGIES if s != "baseline"])
  by_strategy = {line["strategy"]: line for line in lines}
  assert int(by_strategy["baseline"]["steps"]) == 300  # --quick: a 300-step baseline
  assert int(by_strategy["legw"]["steps"]) == 75  # equal epochs at 4x
  adaptive = int(by_strategy["adaptive"]["steps"])
  assert 75 <= adaptive < 300 and int(by_strategy["adaptive"]["predicted_steps"]) > 0
  assert int(by_strategy["legw_date_steps"]["steps"]) == adaptive
  for name in ("tiny_accuracy.png", "tiny_steps.png", "tiny_tradeoff.png", "results.md"):
    assert (tmp_path / name).exists()
  assert "tiny: by quarter of progress" in (tmp_path / "results.md").read_text()
  # Strict JSON rows, one per cell.
  rows = [json.loads(line) for line in (tmp_path / "cells.jsonl").read_text().splitlines()]
  assert len(rows) == len(QUICK_STRATEGIES)

  # Resume: drop the last finished cell; only it runs again.
  lines = (tmp_path / "cells.jsonl").read_text().splitlines(keepends=True)
  (tmp_path / "cells.jsonl").write_text("".join(lines[:-1]))
  out = _quick(tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  reran = [line for line in out.stdout.splitlines() if line.startswith("tiny/")]
  assert reran == [line for line in reran if "legw_date_steps" in line] and len(reran) == 1
  assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == len(QUICK_STRATEGIES)

  # A study run one --workload at a time into one outdir reports every workload it finished.
  rows = [json.loads(line) for line in (tmp_path / "cells.jsonl").read_text().splitlines()]
  with open(tmp_path / "cells.jsonl", "a", encoding="utf-8") as f:
    for row in rows + [dict(rows[0], workload="unknown", key="unknown/baseline/1x/0")]:
      twin = dict(row, workload=row["workload"].replace("tiny", "twin"))
      f.write(json.dumps(dict(twin, key=twin["key"].replace("tiny", "twin"))) + "\n")
  argv = ["--workload", "tiny", "--config", f"tiny={TINY}", "--config", f"twin={TINY}",
          "--quick", "--strategies", ",".join(QUICK_STRATEGIES), "--report-only",
          "--outdir", str(tmp_path), "--no-progress"]
  study_main.main(argv)
  with open(tmp_path / "results.csv", encoding="utf-8") as f:
    workloads = [line["workload"] for line in csv.DictReader(f)]
  assert workloads.count("tiny") == workloads.count("twin") == len(QUICK_STRATEGIES)
  assert "unknown" not in workloads
  text = (tmp_path / "results.md").read_text()
  assert "#### tiny\n" in text and "#### twin\n" in text and (tmp_path / "twin_steps.png").exists()


def test_measured_noise_scales_read_null_after_a_measurement_as_inf():
  rows = [{"step": 20, "train/date/noise_scale": None},  # not measured yet (NaN)
          {"step": 40, "train/date/noise_scale": 300.0},
          {"step": 60, "train/date/noise_scale": None},  # signal estimate <= 0 (inf)
          {"step": 60, "eval/accuracy": 0.5},
          {"step": 80, "train/date/noise_scale": 200.0}]
  assert study.measured_noise_scales(rows) == [300.0, math.inf, 200.0]


def test_studies_sharing_an_outdir_skip_the_cell_a_live_process_runs(tmp_path, monkeypatch):
  from dateopt.train import workdir_lock
  cells = study.grid(["tiny"], multiples=(1,), seeds=(0, 1))
  ran = []

  def fake_run(cell, config, workdir):
    ran.append(cell.key)
    return {"key": cell.key, **vars(cell), "noise_scales": [], "final_accuracy": 0.5,
            "steps": 10, "wall_seconds": 1.0}

  monkeypatch.setattr(study.runner, "run_cell", fake_run)  # where Study looks it up
  monkeypatch.setattr(study.Study, "config_for", lambda self, cell: None)
  runner = study.Study(str(tmp_path), {"tiny": None})
  # A live process (this one) holds seed 0's claim: its workdir must not be touched.
  claim_dir = tmp_path / "claims" / cells[0].key.replace("/", "_")
  claim_dir.mkdir(parents=True)
  held = workdir_lock.acquire(claim_dir)
  runner.run(cells, progress=False)
  assert ran == [cells[1].key]
  workdir_lock.release(held)  # the claim is free again: a re-run takes the cell
  runner.run(cells, progress=False)
  assert ran == [cells[1].key, cells[0].key]
  assert os.listdir(claim_dir) == []  # released


def test_progress_profile_by_hand():
  # DATE's rows are placed by progress (baseline steps), the baseline's by step.
  rows = [{"step": 1, "train/loss": 2.0, "train/date/progress": 10.0,
           "train/date/noise_scale": None},  # not measured yet: no B_noise
          {"step": 2, "train/loss": 1.0, "train/date/progress": 30.0,
           "train/date/noise_scale": 100.0},
          {"step": 3, "train/loss": 0.5, "train/date/progress": 60.0,
           "train/date/noise_scale": 300.0},
          {"step": 3, "eval/accuracy": 0.9},  # not a training row
          {"step": 4, "train/loss": 0.3, "train/date/progress": 100.0,
           "train/date/noise_scale": 500.0}]
  profile = study.progress_profile(rows, base_steps=100)
  assert profile["loss"] == [2.0, 1.0, 0.5, 0.3]  # quarters (0, 25], (25, 50], (50, 75], (75, 100]
  assert profile["noise_scale"][1:] == [100.0, 300.0, 500.0] and math.isnan(
      profile["noise_scale"][0])
  baseline = [{"step": s, "train/loss": 1.0 / s, "train/date/noise_scale": 10.0 * s}
              for s in (1, 2, 3, 4, 5, 6, 7, 8)]
  assert study.progress_profile(baseline, base_steps=8)["noise_scale"] == [15.0, 35.0, 55.0, 75.0]


def test_profile_report_reads_each_runs_metrics(tmp_path):
  runner = study.Study(str(tmp_path), {})
  rows = []
  for strategy, k, seed, scale in (("baseline", 1, 0, 1.0), ("adaptive_grow", 4, 0, 0.5),
                                   ("adaptive", 4, 0, 2.0), ("adaptive", 4, 1, 4.0),
                                   ("adaptive", 4, 2, 100.0)):
    cell = study.Cell("tiny", strategy, k, seed)
    rows.append({"key": cell.key, **vars(cell), "steps": 4 if k == 1 else 2})
    os.makedirs(runner.workdir(cell))
    with open(os.path.join(runner.workdir(cell), "metrics.jsonl"), "w") as f:
      for step in (1, 2, 3, 4):
        progress = {"train/date/progress": step - 0.5} if k > 1 else {}
        f.write(json.dumps({"step": step, "train/loss": scale / step,
                            "train/date/noise_scale": 10.0 * scale * step, **progress}) + "\n")
  rows.append({"key": "tiny/legw/4x/seed0", "workload": "tiny", "strategy": "legw",
               "multiple": 4, "seed": 0, "steps": 1})  # static rules are not profiled
  lines = study.profile_report(runner, rows).splitlines()
  table = [line for line in lines if line.startswith("| ")][1:]
  # One row per quarter (DATE's progress 0.5, 1.5, 2.5, 3.5 of 4 baseline steps); DATE's
  # values are the median over its 3 seeds (20, 40, 1000 -> 40 for the first quarter).
  assert table[0] == ("| baseline (1x), 1 seeds | 10 | 20 | 30 | 40 | 1.000 | 0.500 | 0.333 "
                      "| 0.250 |")
  assert table[1] == ("| DATE 4x, 3 seeds | 40 | 80 | 120 | 160 | 4.000 | 2.000 | 1.333 "
                      "| 1.000 |")
  assert table[2] == ("| DATE grown to 4x, 1 seeds | 5 | 10 | 15 | 20 | 0.500 | 0.250 | 0.167 "
                      "| 0.125 |")  # after the fixed batch of the same k
  assert len(table) == 3


def test_the_study_language_model_is_the_main_jobs_recipe_with_two_blocks_and_half_its_tokens():
  import jax  # pylint: disable=import-outside-toplevel
  from dateopt.models.transformer import make_transformer_lm  # pylint: disable=import-outside-toplevel
  main, small = configs.load("lm_shakespeare"), configs.load(study_main.WORKLOADS["lm"])
  assert (small.dataset, small.dataset_kwargs) == (main.dataset, main.dataset_kwargs)
  assert small.model_kwargs.to_dict() == dict(main.model_kwargs.to_dict(), num_layers=2)
  changed = {k for k, v in small.baseline.items() if main.baseline[k] != v}
  assert changed == {"num_epochs", "warmup_epochs", "learning_rate", "end_value"}
  # The same warmup share (2%) and the cosine's floor at a tenth of each tuned peak.
  for config in (main, small):
    b = config.baseline
    assert b.warmup_epochs / b.num_epochs == pytest.approx(0.02)
    assert b.end_value == pytest.approx(b.learning_rate / 10)
  # Parameters by hand: token and position tables 256 x 128 each; a block's two LayerNorms
  # (2 x 256), qkv 128 x 384 + 384, the projection 128 x 128 + 128, the MLP 128 x 512 + 512
  # and 512 x 128 + 128; the final LayerNorm 256.
  block = 2 * 256 + (128 * 384 + 384) + (128 * 128 + 128) + (128 * 512 + 512) + (512 * 128 + 128)
  model = make_transformer_lm(vocab_size=256, **small.model_kwargs)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 128), jnp.int32))
  assert sum(x.size for x in jax.tree.leaves(shapes)) == 2 * 256 * 128 + 2 * block + 256 == 462_336


def test_a_cell_whose_rule_has_no_recipe_is_kept_with_its_reason_and_not_run(tmp_path,
                                                                              monkeypatch):
  """The tiny workload runs 2 epochs with 0.02 of warmup: LEGW at 128× warms up for
  0.02 × 128 = 2.56 epochs, longer than the run, so the planner refuses it; at 4× (0.08)
  it plans and runs. The refusal is kept, reported, and a re-run does not retry it."""
  ran = []

  def fake_run(cell, config, workdir):
    ran.append(cell.key)
    return {"key": cell.key, **vars(cell), "noise_scales": [], "final_accuracy": 0.5,
            "steps": 10, "wall_seconds": 1.0}

  monkeypatch.setattr(study.runner, "run_cell", fake_run)
  runner = study.Study(str(tmp_path), {"t": configs.load(TINY)})
  refused, plannable = study.Cell("t", "legw", 128, 0), study.Cell("t", "legw", 4, 0)
  runner.run([refused, plannable], progress=False)
  assert ran == [plannable.key]
  [row] = runner.unplannable()
  assert row["key"] == refused.key and row["multiple"] == 128
  assert "warmup_epochs must be in [0, 2), got 2.56" in row["reason"]
  runner.run([refused, plannable], progress=False)
  assert ran == [plannable.key]  # neither is run again
  assert f"`{refused.key}` (budget 1×): warmup_epochs" in study_main.unplannable_report(runner)
  runner.forget(["legw"])  # --rerun plans a refused cell again, and it is refused again
  assert runner.unplannable() == [] and runner.rows() == []
  runner.run([refused], progress=False)
  assert [row["key"] for row in runner.unplannable()] == [refused.key] and ran == [plannable.key]


def test_a_config_error_is_raised_not_kept_as_a_rule_without_a_recipe(tmp_path, monkeypatch):
  """An unknown `adam_scaling` rule is the config's error: every cell would fail with it."""
  monkeypatch.setattr(study.runner, "run_cell", lambda *args: pytest.fail("ran a cell"))
  config = configs.load(TINY)
  config.plan.adam_scaling = ("b3",)
  runner = study.Study(str(tmp_path), {"t": config})
  with pytest.raises(ValueError, match="b3"):
    runner.run([study.Cell("t", "legw", 4, 0)], progress=False)
  assert runner.unplannable() == []


def test_a_cell_the_watch_gives_up_is_a_row_that_never_counts_at_the_bar(tiny, tmp_path):
  """The tiny LSTM at 1,000x its tuned LR diverges; DATE's watch gives it up. The study keeps
  the cell as a row that says so (the grid goes on): stored in cells.jsonl, it is never at a
  quality bar, the summaries leave it out, and the reports list it."""
  from dateopt import strict_json  # pylint: disable=import-outside-toplevel
  from dateopt.study import ablation, cells, compare, report  # pylint: disable=import-outside-toplevel
  config = tiny(strategy="adaptive", divergence_watch=True, eval_every_steps=10)
  config.baseline = dict(config.baseline.to_dict(), learning_rate=3.0)
  row = cells.run_cell(study.Cell("tiny", "adaptive", 4, 0), config, str(tmp_path / "run"))
  assert row["gave_up"] and row["stopped"].startswith("stopped: the adaptive run")
  assert row["steps"] > 0 and row["examples"] == row["steps"] * 64
  assert row["divergences"] > 0 and row["batch"] == 64 and row["base_batch"] == 16
  row = json.loads(strict_json.line(row))  # as cells.jsonl keeps it
  assert compare.quality(row) == -math.inf
  baseline = dict(row, key="tiny/baseline/1x/seed0", strategy="baseline", multiple=1,
                  gave_up=False, final_accuracy=0.5, steps=120, examples=1920)
  finished = dict(row, key="tiny/adaptive/4x/seed1", seed=1, gave_up=False, final_accuracy=0.45)
  rows = [baseline, row, finished]
  means = ablation._means([row, finished], bar=0.4)
  assert (means["gave_up"], means["at_bar"], means["quality"]) == (1, 1, 0.45)
  entry, = [e for e in compare.summarize_comparison(rows, 4) if e["method"] == "adaptive"]
  assert (entry["runs"], entry["steps"], entry["quality"]) == (1, finished["steps"], 0.45)
  assert {(e["strategy"], e["seeds"]) for e in report.summarize(rows)} == {
      ("baseline", 1), ("adaptive", 1)}
  listed = study_main.gave_up_report(rows)
  assert "tiny/adaptive/4x/seed0" in listed and "tiny/adaptive/4x/seed1" not in listed
