"""What a run says it will do is what it does: the ladder it prints and records, the target
batch a growing run needs, and a profile window inside the run. In-process, before any
compilation (8 simulated devices, tests/conftest.py)."""

import json

import pytest

from dateopt import date, train
from dateopt.train import startup


def _growing(tiny, **fields):
  config = tiny(strategy="adaptive", **fields)
  config.plan.grow_batch = True
  return config


def test_a_ladder_rounded_to_the_batch_layout_is_the_one_printed_and_recorded(tiny, tmp_path):
  exp = train.build_experiment(_growing(tiny, batch_size=128, grad_accum_steps=8))
  assert exp.batch_sizes == (64, 128)  # 8 devices x 8 micro-batches: no rung below 64
  report = date.explain(exp.baseline, exp.recipe)  # the run's "DATE plan" table
  note = ("rungs 16 and 32 are below the batch layout's quantum of 64 (8 devices x 8 "
          "accumulation steps): the ladder starts at 64")
  rows = {line.split("  ")[0]: line for line in report.splitlines()}
  assert rows["batch ladder"].endswith("  64, 128"), report
  assert "start at 64," in rows["grow_batch"], report
  assert sum(note in line for line in report.splitlines()) == 1, report
  startup.save_recipes(str(tmp_path), exp, report)
  recorded = json.loads((tmp_path / "recipe.json").read_text())["planned"]["rationale"]
  assert recorded["batch ladder"] == "64, 128"
  assert note in recorded.values()
  assert note in (tmp_path / "recipe.txt").read_text()


def test_a_ladder_the_layout_keeps_is_planned_without_a_note(tiny):
  exp = train.build_experiment(_growing(tiny, batch_size=128))
  assert exp.batch_sizes == (16, 32, 64, 128)  # a quantum of 8
  assert exp.recipe == date.plan(exp.baseline, 128, "adaptive", grow_batch=True)


def test_a_growing_batch_without_a_target_batch_is_refused(tiny, tmp_path):
  with pytest.raises(train.StartupError,
                     match=r"config.batch_size=None .* config.strategy='adaptive' and "
                           r"config.plan.grow_batch=True: set config.batch_size"):
    train.train_and_evaluate(_growing(tiny, batch_size=None), str(tmp_path))
  assert not (tmp_path / "recipe.json").exists()


def test_the_adaptive_strategy_without_a_target_batch_is_refused(tiny):
  with pytest.raises(ValueError, match=r"config.batch_size=None .* config.strategy='adaptive'"):
    train.build_experiment(tiny(strategy="adaptive", batch_size=None))


def test_the_baseline_without_a_target_batch_still_trains_as_it_is(tiny):
  exp = train.build_experiment(tiny(batch_size=None))
  assert exp.recipe == exp.baseline


@pytest.mark.parametrize("window", ["40:45", "25:35"])
def test_a_profile_window_past_the_runs_last_step_is_refused(tiny, window):
  with pytest.raises(ValueError, match=rf"config.profile_steps='{window}' .* the run's 30 "
                                       r"steps"):
    train.build_experiment(tiny(num_train_steps=30, profile_steps=window))


def test_a_profile_window_that_ends_on_the_last_step_is_kept(tiny):
  exp = train.build_experiment(tiny(num_train_steps=30, profile_steps="25:30"))
  assert exp.num_train_steps == 30
