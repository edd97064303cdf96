"""The field's batch schedules: each published rule by hand, the optax wrapper, the trainer."""

import json
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dateopt import date
from dateopt.date import _batch_schedules as batch_schedules
from dateopt.date import _batch_schedules as batch_schedules_lib
from dateopt.date import _builder as builder_lib
from dateopt.date import _planner as planner_lib

import tiny_config


# --- The rules, by hand (REFERENCE.md §9) -----------------------------------------------------

def _megatron_batch(consumed, start, increment, ramp, top):
  """Megatron-LM's ramp as its docs state it, transcribed: a second path to the batch."""
  n = (top - start) // increment
  if consumed > ramp:
    return top
  return min(top, start + int(consumed / (ramp / n)) * increment)


def test_linear_ramp_is_megatrons_rule_at_every_example_count():
  ramp = batch_schedules_lib.linear_ramp(base_batch_size=8, max_batch_size=64, start_batch=16, increment=16,
                          ramp_examples=1000)
  # n = 3 increments, one every 333.3 examples: 16 below 334, 32 from 334, 48 from 667.
  assert ramp.batch_sizes == (16, 32, 48, 64) and ramp.boundaries == (334, 667, 1000)
  assert [ramp.batch_at(e) for e in (0, 333, 334, 666, 667, 999, 1000, 5000)] == [
      16, 16, 32, 32, 48, 48, 64, 64]
  for consumed in range(0, 1200):
    assert ramp.batch_at(consumed) == _megatron_batch(consumed, 16, 16, 1000, 64), consumed
  # The LR is B_max's at every batch: lr0 · √(64/8).
  assert all(ramp.lr_multiplier(b) == pytest.approx(math.sqrt(8)) for b in ramp.batch_sizes)
  # The traced path agrees with the Python one.
  traced = jax.jit(ramp.batch_at)(jnp.arange(0, 1200, dtype=jnp.int32))
  assert list(np.asarray(traced)) == [ramp.batch_at(e) for e in range(0, 1200)]


def test_linear_ramp_refuses_an_increment_that_does_not_divide():
  with pytest.raises(ValueError, match="increment=20 must divide max_batch_size - start_batch"):
    batch_schedules_lib.linear_ramp(base_batch_size=8, max_batch_size=64, start_batch=16, increment=20,
                     ramp_examples=1000)


def test_doubling_multiplies_the_lr_by_root_2_at_each_doubling():
  schedule = batch_schedules_lib.doubling(base_batch_size=8, max_batch_size=64, start_batch=8,
                           ramp_examples=900)
  assert schedule.batch_sizes == (8, 16, 32, 64) and schedule.boundaries == (300, 600, 900)
  lrs = [schedule.lr_multiplier(b) for b in schedule.batch_sizes]
  assert lrs == pytest.approx([1.0, math.sqrt(2), 2.0, math.sqrt(8)])
  assert [b / a for a, b in zip(lrs, lrs[1:])] == pytest.approx([math.sqrt(2)] * 3)
  with pytest.raises(ValueError, match="must be a power of 2"):
    batch_schedules_lib.doubling(base_batch_size=8, max_batch_size=48, start_batch=8, ramp_examples=900)


def test_seesaw_cuts_the_lr_by_root_2_where_the_schedule_halves_it_and_doubles_the_batch():
  cosine = optax.cosine_decay_schedule(1.0, 100)
  schedule = batch_schedules_lib.seesaw(base_batch_size=4, max_batch_size=16, start_batch=4, alpha=0.5,
                         base_schedule=cosine, base_steps=100)
  # ½(1 + cos(πt/100)) reaches ½ at t = 50 and ¼ at t = 66.7: baseline steps 50 and 67.
  assert schedule.boundaries == (50 * 4, 67 * 4) and schedule.batch_sizes == (4, 8, 16)
  lr = lambda examples: float(cosine(examples / 4)) * schedule.lr_multiplier_at(examples)
  assert lr(199) == pytest.approx(float(cosine(49.75)))  # before: the schedule as it is
  # Where the schedule has halved (0.5), Seesaw's LR is 1/√2 of the peak, at twice the batch.
  assert lr(200) == pytest.approx(1 / math.sqrt(2), rel=1e-6)
  assert lr(268) == pytest.approx(float(cosine(67)) * 2)  # the second fall: ½ again, × 2


def test_batch_for_decay_keeps_the_lr_where_the_schedule_would_cut_it():
  cosine = optax.cosine_decay_schedule(1.0, 100)
  schedule = batch_schedules_lib.seesaw(base_batch_size=4, max_batch_size=16, start_batch=4, alpha=0.5,
                         base_schedule=cosine, base_steps=100, keep_lr=True)
  assert schedule.name == "batch_for_decay" and schedule.boundaries == (200, 268)
  assert [schedule.lr_multiplier(b) for b in (4, 8, 16)] == pytest.approx([1.0, 2.0, 4.0])
  assert float(cosine(50)) * schedule.lr_multiplier_at(200) == pytest.approx(1.0, rel=1e-6)


def test_seesaw_counts_its_points_after_the_warmup_and_stops_where_the_decay_does():
  warmup = optax.join_schedules([optax.linear_schedule(0.0, 1.0, 10),
                                 optax.cosine_decay_schedule(1.0, 90, alpha=0.2)], [10])
  points = batch_schedules.decay_points(warmup, 100, warmup_steps=10, alpha=0.5, count=4)
  # The warmup's low start is not a fall. 0.2 + 0.8·½(1 + cos(πt/90)) falls to ½ at t = 52.2
  # and to ¼ at t = 75.5 (steps 53 and 76 after the warmup), never to ⅛.
  assert points == (63, 86)
  schedule = batch_schedules_lib.seesaw(base_batch_size=4, max_batch_size=64, start_batch=4, alpha=0.5,
                         base_schedule=warmup, base_steps=100, warmup_steps=10)
  assert schedule.batch_sizes == (4, 8, 16)  # it never reaches 64


def test_a_step_decay_that_passes_several_powers_of_alpha_is_one_step_up():
  base = date.Recipe(batch_size=32, num_examples=24_000, num_epochs=90, learning_rate=0.1,
                     optimizer="momentum", decay="multistep", decay_epochs=(30, 60, 80),
                     warmup_epochs=1)
  # A step decay's α is its own cut by default: × 0.1 at epochs 30 and 60 (Smith et al.).
  seesaw = date.plan(base, 2048, "seesaw")
  assert seesaw.batch_schedule_options["alpha"] == 0.1
  schedule = builder_lib.batch_schedule_of(seesaw)
  assert schedule.batch_sizes == (32, 320, 2048)  # × 10, then × 10 capped at 2,048
  assert schedule.boundaries == (30 * 24_000, 60 * 24_000)
  # At the first cut the LR falls by √0.1 instead of 0.1, the batch grows × 10.
  assert 0.1 * schedule.lr_multiplier(320) == pytest.approx(math.sqrt(0.1))
  # With α = ½, the × 0.1 cut passes ½, ¼ and ⅛ at one step: one step-up, × 8.
  halves = date.plan(base, 2048, "seesaw", schedule_options={"alpha": 0.5})
  assert builder_lib.batch_schedule_of(halves).batch_sizes == (32, 256, 2048)


def test_a_schedule_that_never_falls_to_alpha_warns_and_keeps_its_batch():
  with pytest.warns(UserWarning, match="never falls to α = 0.5"):
    schedule = batch_schedules_lib.seesaw(base_batch_size=4, max_batch_size=16, start_batch=4, alpha=0.5,
                           base_schedule=optax.constant_schedule(1.0), base_steps=100)
  assert schedule.batch_sizes == (4,)


def test_a_start_batch_above_b0_starts_at_the_root_rule_lr():
  schedule = batch_schedules_lib.seesaw(base_batch_size=4, max_batch_size=64, start_batch=16, alpha=0.5,
                         base_schedule=optax.cosine_decay_schedule(1.0, 100), base_steps=100)
  assert schedule.batch_sizes == (16, 32, 64)
  assert schedule.lr_multiplier(16) == pytest.approx(2.0)  # √(16/4)


def test_steps_for_counts_every_step_a_loop_takes():
  ramp = batch_schedules_lib.linear_ramp(base_batch_size=8, max_batch_size=64, start_batch=16, increment=16,
                          ramp_examples=1000)
  for total in (1, 333, 1000, 1001, 4096):
    seen = steps = 0
    while seen < total:
      seen, steps = seen + ramp.batch_at(seen), steps + 1
    assert ramp.steps_for(total) == (steps, seen)


def test_rounding_to_the_layout_merges_rungs_at_their_first_boundary():
  ramp = batch_schedules_lib.linear_ramp(base_batch_size=8, max_batch_size=64, start_batch=16, increment=16,
                          ramp_examples=1000)
  rounded = ramp.rounded(32)
  assert rounded.batch_sizes == (32, 64) and rounded.boundaries == (667,)
  with pytest.raises(ValueError, match="the largest batch 64 must be a multiple of 48"):
    ramp.rounded(48)


# --- The optax wrapper --------------------------------------------------------------------

def test_scheduled_batch_applies_the_schedule_in_examples_and_stops_at_the_budget():
  base = optax.warmup_cosine_decay_schedule(0.0, 0.1, 5, 40)
  schedule = batch_schedules_lib.doubling(base_batch_size=4, max_batch_size=16, start_batch=4,
                           ramp_examples=40)
  tx = date.scheduled_batch(lambda learning_rate: optax.sgd(learning_rate), base, schedule,
                            base_steps=40)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  seen = steps = 0
  update = jax.jit(tx.update)
  while not bool(date.progress_done(state, 40)):
    batch = int(date.next_batch_size(state))
    assert batch == schedule.batch_at(seen)
    updates, state = update({"w": jnp.ones(3)}, state, params)
    lr = float(optax.tree.get(state, "learning_rate"))
    assert lr == pytest.approx(float(base(seen / 4)) * math.sqrt(batch / 4), rel=1e-6)
    assert np.allclose(updates["w"], -lr)
    seen, steps = seen + batch, steps + 1
  # 5 steps of 4 to 20 examples, 3 of 8 to 44, 8 of 16 to 172 (the first ≥ 160).
  assert (steps, seen) == schedule.steps_for(40 * 4) == (16, 172)
  assert float(state.progress) == 43.0
  updates, after = update({"w": jnp.ones(3)}, state, params)  # past the budget: nothing moves
  assert np.all(updates["w"] == 0) and int(after.examples) == 172


def test_the_progress_reaches_the_budget_at_its_last_example_not_before():
  to_steps = lambda e: float(batch_schedules._baseline_steps(jnp.asarray(e, jnp.int32), 1024,
                                                             2 ** 20))
  # float32(2^30 - 1) / 1024 rounds up to 2^20, the budget: one example short is not done.
  assert to_steps(2 ** 30 - 1) < 2 ** 20 and to_steps(2 ** 30) == 2 ** 20
  assert to_steps(3 * 1024 + 512) == 3.5


# --- The planner --------------------------------------------------------------------------

def _baseline():
  return date.Recipe(batch_size=32, num_examples=24_000, num_epochs=10, learning_rate=1e-3,
                     optimizer="adam", warmup_epochs=0.5)


@pytest.mark.parametrize("strategy, citation", [
    ("linear_ramp", "Megatron-LM"), ("doubling", "OLMo-core"), ("seesaw", "Meterez"),
    ("batch_for_decay", "Smith")])
def test_plan_explains_each_schedule_and_predicts_its_steps(strategy, citation):
  base = _baseline()
  planned = date.plan(base, 2048, strategy, budget=2)
  assert planned.scheduled and planned.batch_schedule == strategy
  assert planned.num_epochs == 20 and planned.warmup_steps == base.warmup_steps
  schedule = builder_lib.batch_schedule_of(planned)
  steps, examples = schedule.steps_for(planned.total_steps * 32)
  assert planner_lib.plan_predicted_steps(planned, None) == steps
  assert examples >= 2 * base.total_steps * 32
  text = date.explain(base, planned)
  assert citation in text and f"{steps:,} steps" in text and "batch schedule" in text
  again = date.Recipe.from_dict(planned.to_dict())  # what recipe.json stores
  assert again == planned and builder_lib.batch_schedule_of(again) == schedule


def test_plan_resolves_each_schedules_options_and_names_a_bad_one():
  base = _baseline()
  ramp = date.plan(base, 2048, "linear_ramp", schedule_options={"ramp_share": 0.2})
  assert ramp.batch_schedule_options == {"start_batch": 256, "increment": 256,
                                         "ramp_examples": 48_000}
  seesaw = date.plan(base, 2048, "seesaw", schedule_options={"start_batch": 512})
  assert seesaw.batch_schedule_options == {"start_batch": 512, "alpha": 0.5}
  with pytest.raises(ValueError, match="unknown option.*'ramp_share'.*'seesaw'"):
    date.plan(base, 2048, "seesaw", schedule_options={"ramp_share": 0.2})
  with pytest.raises(ValueError, match="alpha is an option of 'seesaw'"):
    date.plan(base, 2048, "doubling", schedule_options={"alpha": 0.5})
  with pytest.raises(ValueError, match="start_batch must be in \\[32, 2048\\]"):
    date.plan(base, 2048, "doubling", schedule_options={"start_batch": 4096})
  with pytest.raises(ValueError, match="schedule_options are a batch schedule's"):
    date.plan(base, 2048, "legw", schedule_options={"start_batch": 64})
  with pytest.raises(ValueError, match="budget=2: the 'adaptive' strategy chooses its own"):
    date.plan(base, 2048, "adaptive", budget=2)
  with pytest.raises(ValueError, match="strategy must be one of"):
    date.plan(base, 2048, "seasaw")
  with pytest.raises(ValueError, match="noise_of and noise_scale do not apply"):
    date.plan(base, 2048, "seesaw", noise_scale=500.0)
  with pytest.raises(ValueError, match="ramp_examples=480000 is past the budget"):
    date.plan(base, 2048, "doubling", schedule_options={"ramp_examples": 480_000})
  with pytest.raises(TypeError, match="ramp_share must be a number"):
    date.plan(base, 2048, "doubling", schedule_options={"ramp_share": True})
  with pytest.raises(TypeError, match="alpha must be a number"):
    date.plan(base, 2048, "seesaw", schedule_options={"alpha": "0.5"})
  with pytest.raises(ValueError, match="the increment defaults to the start batch"):
    date.plan(base, 2048, "linear_ramp", schedule_options={"start_batch": 96})


def test_a_static_plan_takes_a_budget():
  planned = date.plan(_baseline(), 512, "legw", budget=3)
  assert planned.num_epochs == 30 and "budget: 3" in planned.rationale["num_epochs"]


def test_a_budget_stretches_a_step_decay_and_keeps_the_warmups_examples():
  base = _baseline().replace(decay="multistep", decay_epochs=(5, 8))
  for strategy in ("sqrt", "doubling"):
    planned = date.plan(base, 512, strategy, budget=2)
    assert planned.num_epochs == 20 and planned.decay_epochs == (10, 16)
    assert planned.warmup_epochs == base.warmup_epochs
  exponential = date.plan(base.replace(decay="exponential", decay_every_epochs=2.0), 512,
                          "seesaw", budget=3)
  assert exponential.decay_every_epochs == 6.0


def test_a_recipe_refuses_a_schedule_without_its_options_or_a_base_batch():
  base = _baseline()
  with pytest.raises(ValueError, match="needs base_batch_size set"):
    base.replace(batch_schedule="seesaw", batch_schedule_options={"start_batch": 32,
                                                                  "alpha": 0.5})
  with pytest.raises(ValueError, match="must hold exactly start_batch, alpha"):
    base.replace(batch_size=64, base_batch_size=32, batch_schedule="seesaw")


# --- The trainer --------------------------------------------------------------------------

def _doubling_config(**overrides):
  """The tiny LSTM (B0 = 16, 120 baseline steps, 1,920 examples) doubling to 64 by half
  its examples: 16 for 480 examples (30 steps), 32 for 480 (15), 64 for 960 (15)."""
  return tiny_config.with_fields(**{
      "strategy": "doubling", "batch_size": 64, "grad_groups": 4, "log_every_steps": 5,
      "plan": {"schedule_options": {"ramp_share": 0.5}}, "checkpoint_every_steps": -1,
      **overrides})


def test_trainer_follows_the_schedule_logs_every_batch_and_compiles_once_per_batch(tmp_path):
  from dateopt import train
  result = train.train_and_evaluate(_doubling_config(), str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  changes = [(r["step"], r["train/batch_size"]) for r in rows
             if "train/batch_size" in r and "train/loss" not in r]
  assert changes == [(1, 16), (31, 32), (46, 64)]
  assert result.steps == 60 == planner_lib.plan_predicted_steps(result.recipe, None)
  assert result.examples == 1920 and result.largest_batch_size == 64
  assert result.train_step_compilations == 3
  # The LR applied at each logged step: the baseline's schedule at τ = examples before / B0,
  # × √(B/B0).
  schedule = date.build_schedule(result.recipe)
  batch_at = lambda step: max(b for s, b in changes if s <= step)
  for row in rows:
    if "train/learning_rate" in row:
      step = row["step"]
      before = sum(batch_at(s) for s in range(1, step))
      expected = float(schedule(before / 16)) * math.sqrt(batch_at(step) / 16)
      assert row["train/learning_rate"] == pytest.approx(expected, rel=1e-5), step
  assert max(r["step"] for r in rows) == result.steps


def test_a_scheduled_run_killed_mid_ramp_resumes_bit_exact(tmp_path):
  from dateopt import train
  config = _doubling_config(checkpoint_every_steps=5, keep_checkpoints=20)
  whole = train.train_and_evaluate(config, str(tmp_path / "whole"))
  resume_at = 35  # inside the batch-32 stretch (steps 31-45)
  shutil.copytree(tmp_path / "whole" / "checkpoints" / str(resume_at),
                  tmp_path / "resumed" / "checkpoints" / str(resume_at))
  resumed = train.train_and_evaluate(config, str(tmp_path / "resumed"))
  assert (resumed.steps, resumed.examples) == (whole.steps, whole.examples) == (60, 1920)
  for a, b in zip(jax.tree.leaves(whole.state.params), jax.tree.leaves(resumed.state.params)):
    np.testing.assert_array_equal(a, b)


def test_a_schedule_without_a_target_batch_is_refused_not_ignored():
  from dateopt import train
  config = _doubling_config(batch_size=None)
  with pytest.raises(ValueError, match="would ignore config.strategy='doubling' and "
                                       "config.plan.schedule_options=\\{'ramp_share': 0.5\\}"):
    train.build_experiment(config)


def test_a_schedule_whose_largest_batch_the_layout_cannot_split_is_refused(tmp_path):
  from dateopt import train
  with pytest.raises(train.StartupError, match="config.batch_size=120, the batch schedule's "
                                               "largest, must be a multiple of 32"):
    train.train_and_evaluate(_doubling_config(batch_size=120, grad_accum_steps=4,
                                              strategy="linear_ramp",
                                              plan={"schedule_options": {"start_batch": 32,
                                                                         "increment": 8}}),
                             str(tmp_path))
