"""DATE static planning: Recipe, plan, explain, build."""

import doctest
import importlib
import json
import math
import warnings

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from dateopt import date, schedules
from dateopt.date import _recipe as recipe_lib

IMAGENET = 1_281_167


def legw_baseline(**changes):
  """docs/papers.md §3: LARS ResNet-50 at 1K, 2^2.5, 0.3125 warmup epochs, 90 epochs."""
  fields = dict(batch_size=1024, num_examples=IMAGENET, num_epochs=90,
                learning_rate=2 ** 2.5, optimizer="lars", warmup_epochs=0.3125,
                decay="polynomial", end_value=1e-4, weight_decay=1e-4)
  return date.Recipe(**{**fields, **changes})


def goyal_baseline(**changes):
  """Goyal et al. 2017's baseline: momentum SGD, batch 256, LR 0.1, steps at 30/60/80."""
  fields = dict(batch_size=256, num_examples=IMAGENET, num_epochs=90, learning_rate=0.1,
                optimizer="momentum", decay="multistep", weight_decay=1e-4,
                warmup_epochs=0.1)
  return date.Recipe(**{**fields, **changes})


# ---- Recipe -----------------------------------------------------------------


def test_recipe_steps_drop_each_epochs_partial_batch():
  r = legw_baseline()  # 1,281,167 / 1,024 = 1251.1: 1,251 whole batches an epoch
  assert (r.steps_per_epoch, r.warmup_steps, r.total_steps) == (1251, 391, 90 * 1251)


def test_a_saved_recipe_with_the_retired_drop_remainder_still_loads():
  values = legw_baseline().to_dict()
  assert date.Recipe.from_dict({**values, "drop_remainder": True}) == legw_baseline()
  with pytest.raises(ValueError, match="drop_remainder=False is not supported"):
    date.Recipe.from_dict({**values, "drop_remainder": False})
  with pytest.raises(TypeError, match="drop_remainder"):
    legw_baseline(drop_remainder=True)  # not a field any more


def test_recipe_round_trips_through_dict_json_and_configdict():
  r = legw_baseline(decay="multistep", decay_epochs=[30, 60, 80],
                    optimizer_options={"trust_clip": True}, grad_clip_norm=1.0)
  assert date.Recipe.from_dict(r.to_dict()) == r
  assert date.Recipe.from_dict(json.loads(json.dumps(r.to_dict()))) == r
  config = r.to_config()
  assert isinstance(config, ml_collections.ConfigDict)
  assert config.learning_rate == r.learning_rate
  assert date.Recipe.from_config(config) == r
  planned = date.plan(r, 4096)
  assert date.Recipe.from_config(planned.to_config()) == planned  # rationale too
  assert hash(r) == hash(date.Recipe.from_dict(r.to_dict()))


def test_from_dict_rejects_unknown_keys_by_name():
  values = legw_baseline().to_dict()
  values["learning_rat"] = 1.0
  with pytest.raises(ValueError, match="learning_rat"):
    date.Recipe.from_dict(values)


@pytest.mark.parametrize("field, value", [
    ("batch_size", "1024"), ("batch_size", 1024.0), ("num_epochs", "90"),
    ("learning_rate", None), ("grow_batch", 1), ("optimizer", 3),
    ("decay_epochs", (30, "sixty")), ("optimizer_options", ["mode"]),
    ("eps", "small"), ("mask", 0),
])
def test_wrong_types_raise_naming_the_field(field, value):
  with pytest.raises(TypeError, match=field):
    legw_baseline(**{field: value})


@pytest.mark.parametrize("field, value", [
    ("batch_size", 0), ("batch_size", -8), ("num_epochs", 0.0), ("momentum", 1.0),
    ("optimizer", "rmsprop"), ("decay", "linear"), ("learning_rate", 0.0),
    ("mask", "([unclosed"), ("label_smoothing", 1.5),
])
def test_out_of_range_values_raise_naming_the_field(field, value):
  with pytest.raises(ValueError, match=field):
    legw_baseline(**{field: value})


def test_warmup_longer_than_training_raises():
  with pytest.raises(ValueError, match="warmup_epochs"):
    legw_baseline(warmup_epochs=90)  # lars, warmup == num_epochs
  with pytest.raises(ValueError, match="warmup_epochs"):
    goyal_baseline(warmup_epochs=100)
  with pytest.raises(ValueError, match=r"decay_epochs\[0\]"):
    goyal_baseline(warmup_epochs=31)  # the first milestone falls inside the warmup


# ---- plan: strategies -----------------------------------------------------------


@pytest.mark.parametrize("batch, peak, warmup", [
    (512, 4.0, 0.15625), (1024, 5.657, 0.3125), (2048, 8.0, 0.625),
    (4096, 11.31, 1.25), (8192, 16.0, 2.5), (16384, 22.63, 5.0), (32768, 32.0, 10.0)])
def test_plan_reproduces_the_legw_table(batch, peak, warmup):
  planned = date.plan(legw_baseline(), batch)
  assert planned.learning_rate == pytest.approx(peak, rel=1e-3)  # the table rounds
  assert planned.warmup_epochs == pytest.approx(warmup, rel=1e-12)
  assert planned.optimizer == "lars"
  assert planned.num_epochs == 90 and planned.decay == "polynomial"


def test_legw_plans_keep_the_warmup_steps():
  base = legw_baseline(num_examples=1024 * 64 * 20)  # every batch divides N
  steps = {date.plan(base, b).warmup_steps for b in (2048, 8192, 65536)}
  assert steps == {base.warmup_steps}


def test_linear_strategy_is_goyal():
  planned = date.plan(goyal_baseline(), 8192, "linear")
  assert planned.learning_rate == pytest.approx(3.2)
  assert planned.warmup_epochs == 5.0
  assert planned.init_value == pytest.approx(0.1)  # ramp from the baseline LR
  assert planned.optimizer == "momentum"  # no promotion by default


def test_sqrt_and_none_strategies():
  base = goyal_baseline()
  sqrt = date.plan(base, 4096, "sqrt")
  assert sqrt.learning_rate == pytest.approx(0.4)
  assert sqrt.warmup_epochs == base.warmup_epochs
  none = date.plan(base, 4096, "none")
  assert none == base.replace(batch_size=4096, rationale=none.rationale)


def test_the_whole_lr_curve_scales_with_the_peak():
  planned = date.plan(legw_baseline(init_value=0.5), 4096)
  assert planned.end_value == pytest.approx(2e-4)
  assert planned.init_value == pytest.approx(1.0)


def test_plan_bad_input_names_the_field():
  with pytest.raises(ValueError, match="strategy"):
    date.plan(legw_baseline(), 4096, "cubic")
  with pytest.raises(ValueError, match="batch_size"):
    date.plan(legw_baseline(), 0)
  with pytest.raises(TypeError, match="batch_size"):
    date.plan(legw_baseline(), 4096.0)
  with pytest.raises(TypeError, match="baseline"):
    date.plan(legw_baseline().to_dict(), 4096)
  # LEGW at 64x pushes a 5-epoch warmup past a 90-epoch run.
  with pytest.raises(ValueError, match="warmup_epochs"):
    date.plan(legw_baseline(warmup_epochs=5.0), 65536)


# ---- plan: promotion and momentum ------------------------------------------------


def test_momentum_sgd_is_promoted_to_lars_above_the_threshold():
  base = goyal_baseline()
  planned = date.plan(base, 16384)
  assert planned.optimizer == "lars"
  # Re-based on the LARS anchor (2^2.5 at 1K) and scaled by sqrt(16).
  assert planned.learning_rate == pytest.approx(2 ** 2.5 * 4)
  assert planned.warmup_epochs == pytest.approx(0.1 * 64)
  assert "promoted" in planned.rationale["optimizer"]
  assert date.plan(base, 8192).optimizer == "momentum"  # at the threshold: not above
  assert date.plan(base, 16384, batch_norm=False).optimizer == "momentum"
  assert date.plan(base, 16384, promote=False).optimizer == "momentum"
  assert date.plan(base, 4096, promote_above=2048).optimizer == "lars"


def test_adam_is_promoted_to_lamb_with_its_anchor():
  base = goyal_baseline(optimizer="adamw", learning_rate=1e-3, eps=1e-8,
                        optimizer_options={"eps_root": 0.0})
  planned = date.plan(base, 32768)
  assert planned.optimizer == "lamb"
  assert planned.learning_rate == pytest.approx(6e-3 * math.sqrt(0.5))
  assert planned.eps is None and planned.optimizer_options == {}
  anchored = date.plan(base, 32768, promotion_anchors={"lamb": (32768, 5e-3)})
  assert anchored.learning_rate == pytest.approx(5e-3)


def test_promotion_is_off_by_default_for_other_strategies_but_configurable():
  base = goyal_baseline()
  assert date.plan(base, 16384, "sqrt").optimizer == "momentum"
  promoted = date.plan(base, 16384, "linear", promote=True)
  assert promoted.optimizer == "lars"
  assert promoted.learning_rate == pytest.approx(2 ** 2.5 * 16)  # linear from the anchor


def test_momentum_scaling_follows_smith_et_al():
  base = goyal_baseline(warmup_epochs=1.0)
  assert date.plan(base, 1024).momentum == 0.9  # off by default
  planned = date.plan(base, 1024, momentum_scaling=True)  # k = 4
  assert planned.momentum == pytest.approx(1 - 0.1 / 4)
  adam = goyal_baseline(optimizer="adam", learning_rate=1e-3)
  assert date.plan(adam, 1024, momentum_scaling=True).b1 == 0.9  # no momentum to scale


# ---- plan: noise scale ------------------------------------------------------------


def test_noise_scale_reports_efficiency_and_warns_far_beyond_it():
  base = legw_baseline()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    planned = date.plan(base, 4096, noise_scale=8192.0)  # below B_noise: no warning
  # gain = (1 + 8192/1024)/(1 + 8192/4096) = 9/3 = 3; efficiency 3/4.
  assert "0.750" in planned.rationale["expected efficiency"]
  with pytest.warns(date.LargeBatchWarning, match="critical batch"):
    far = date.plan(base, 32768, noise_scale=2048.0)
  # gain = (1 + 2)/(1 + 1/16) = 2.8235; efficiency / 32 = 0.0882.
  assert "0.088" in far.rationale["expected efficiency"]
  with pytest.raises(ValueError, match="noise_scale"):
    date.plan(base, 4096, noise_scale=-1.0)


# ---- explain ------------------------------------------------------------------


def test_explain_has_a_row_per_hyper_parameter_with_its_rule():
  base = legw_baseline()
  planned = date.plan(base, 32768, noise_scale=20000.0)
  table = date.explain(base, planned)
  rows = {line.split()[0]: line for line in table.splitlines()}
  for name in ("batch_size", "learning_rate", "warmup_epochs", "momentum",
               "weight_decay", "decay", "end_value", "warmup_steps", "total_steps"):
    assert name in rows
  assert "5.65685" in rows["learning_rate"] and " 32 " in rows["learning_rate"]
  assert "sqrt" in rows["learning_rate"]
  assert "0.3125" in rows["warmup_epochs"] and "LEGW" in rows["warmup_epochs"]
  assert "unchanged" in rows["momentum"]
  assert "b1" not in rows  # LARS reads no Adam moments
  assert "expected" in rows and "gain" in rows["expected"]
  assert rows["warmup_steps"].split()[1:3] == ["391", "390"]


# ---- build --------------------------------------------------------------------


def _params():
  return {"dense": {"kernel": jnp.array([[3.0, 4.0]]), "bias": jnp.array([1.0, -1.0])}}


def _grads():
  return {"dense": {"kernel": jnp.array([[0.8, -0.6]]), "bias": jnp.array([0.5, 0.5])}}


def _constant_recipe(**changes):
  fields = dict(batch_size=32, num_examples=320, num_epochs=10, learning_rate=1.0,
                decay="constant")
  return date.Recipe(**{**fields, **changes})


def test_build_momentum_with_masked_weight_decay():
  tx, schedule = date.build(_constant_recipe(optimizer="momentum", weight_decay=0.1,
                                             learning_rate=0.5))
  params = _params()
  updates, _ = tx.update(_grads(), tx.init(params), params)
  # First step: -lr·(g + β·w) on the kernel, -lr·g on the (masked-out) bias.
  np.testing.assert_allclose(updates["dense"]["kernel"], -0.5 * np.array([[1.1, -0.2]]),
                             rtol=1e-6)
  np.testing.assert_allclose(updates["dense"]["bias"], [-0.25, -0.25], rtol=1e-6)
  assert float(schedule(0)) == 0.5


def test_build_lars_matches_the_reference_vector():
  recipe = _constant_recipe(optimizer="lars", weight_decay=0.1)
  tx, _ = date.build(recipe)
  params = _params()
  updates, _ = tx.update(_grads(), tx.init(params), params)
  np.testing.assert_allclose(updates["dense"]["kernel"], [[-0.0036667, 0.00066667]],
                             rtol=1e-4)
  np.testing.assert_allclose(updates["dense"]["bias"], [-0.5, -0.5], rtol=1e-6)
  optax_mode, _ = date.build(recipe.replace(optimizer_options={"mode": "optax"}))
  updates, _ = optax_mode.update(_grads(), optax_mode.init(params), params)
  np.testing.assert_allclose(updates["dense"]["kernel"], [[-0.0049193, 0.00089443]],
                             rtol=1e-4)


def test_build_lamb_matches_the_reference_vector():
  tx, _ = date.build(_constant_recipe(optimizer="lamb", weight_decay=0.01, mask="all"))
  params = {"w": jnp.array([3.0, 4.0])}
  updates, _ = tx.update({"w": jnp.array([0.6, 0.8])}, tx.init(params), params)
  np.testing.assert_allclose(updates["w"], [-3.51841, -3.55257], rtol=1e-4)


def test_build_adamw_equals_optax_adamw_with_the_mask():
  recipe = _constant_recipe(optimizer="adamw", weight_decay=0.1, learning_rate=0.01,
                            b2=0.99)
  tx, _ = date.build(recipe)
  mask = {"dense": {"kernel": True, "bias": False}}
  reference = optax.adamw(0.01, b2=0.99, weight_decay=0.1, mask=mask)
  params, grads = _params(), _grads()
  state, ref_state = tx.init(params), reference.init(params)
  for _ in range(3):
    updates, state = tx.update(grads, state, params)
    ref_updates, ref_state = reference.update(grads, ref_state, params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
                 updates, ref_updates)


def test_build_schedule_and_clip_follow_the_recipe():
  recipe = legw_baseline().replace(grad_clip_norm=1.0, optimizer="sgd")
  tx, schedule = date.build(recipe)
  reference = schedules.warmup_polynomial_decay(2 ** 2.5, 391, 90 * 1251)
  for step in (0, 200, 391, 5000, 100000):
    assert float(schedule(step)) == pytest.approx(float(reference(step)), rel=1e-6)
  params = {"w": jnp.zeros((2, 2))}
  state = tx.init(params)
  for _ in range(200):  # move into the warmup, where the LR is known
    updates, state = jax.jit(tx.update)({"w": jnp.full((2, 2), 10.0)}, state, params)
  # The gradient norm is 20, clipped to 1: the update is lr·1 at step 199.
  assert float(optax.tree.norm(updates)) == pytest.approx(float(schedule(199)), rel=1e-5)


def test_build_rejects_unknown_optimizer_options_by_name():
  # Python's own TypeError for the unknown keyword, re-raised naming the Recipe field.
  with pytest.raises(TypeError, match="optimizer_options.*tust_clip"):
    date.build(_constant_recipe(optimizer="lars", optimizer_options={"tust_clip": True}))
  with pytest.raises(ValueError, match="optimizer_options"):
    date.build(_constant_recipe(optimizer="lars", optimizer_options={"momentum": 0.5}))


@pytest.mark.parametrize("optimizer", recipe_lib.OPTIMIZERS)
def test_every_family_builds_and_steps_under_jit(optimizer):
  tx, _ = date.build(_constant_recipe(optimizer=optimizer, weight_decay=1e-4,
                                      learning_rate=0.01))
  params = _params()
  updates, _ = jax.jit(tx.update)(_grads(), tx.init(params), params)
  assert all(bool(jnp.all(jnp.isfinite(u))) and bool(jnp.any(u != 0))
             for u in jax.tree.leaves(updates))


@pytest.mark.parametrize("module", ["dateopt.date._recipe", "dateopt.date._planner",
                                    "dateopt.date._builder", "dateopt.date",
                                    "dateopt.date._batch_schedules", "dateopt.date._adam_scaling",
                                    "dateopt.study.compare"])
def test_docstring_examples(module):
  result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
  assert result.failed == 0


@pytest.mark.parametrize("batch", [2048, 8192, 32768])
def test_planned_legw_schedule_by_hand(batch):
  """LEGW (You et al. SC'19) written out: peak √k·η0, warmup k·w0 epochs, MLPerf poly decay."""
  k = batch / 1024
  planned = date.build_schedule(date.plan(legw_baseline(), batch, "legw", promote=False))
  peak, end = 2 ** 2.5 * np.sqrt(k), 1e-4 * np.sqrt(k)
  per_epoch = IMAGENET // batch
  warmup, total = int(np.floor(0.3125 * k * per_epoch + 0.5)), 90 * per_epoch

  def by_hand(t):
    if t < warmup:
      return peak * t / warmup
    return end + (peak - end) * (1 - (t - warmup) / (total - warmup + 1)) ** 2

  for step in np.linspace(0, total, 41).astype(int):
    assert float(planned(step)) == pytest.approx(by_hand(step), rel=1e-5, abs=1e-7)


def test_planned_linear_schedule_by_hand():
  """Goyal et al. 2017 written out: 5 epochs from 0.1 to k·0.1, then ×0.1 at 30/60/80."""
  planned = date.build_schedule(date.plan(goyal_baseline(decay_epochs=(30.0, 60.0, 80.0)),
                                          8192, "linear", promote=False))
  per_epoch = IMAGENET // 8192
  warmup = 5 * per_epoch

  def by_hand(t):
    if t < warmup:
      return 0.1 + (3.2 - 0.1) * t / warmup
    return 3.2 * 0.1 ** sum(t >= e * per_epoch for e in (30, 60, 80))

  for step in np.linspace(0, 90 * per_epoch, 41).astype(int):
    assert float(planned(step)) == pytest.approx(by_hand(step), rel=1e-5, abs=1e-9)


def test_noise_of_the_lars_step_is_planned_explained_and_kept_for_adaptive_only():
  base = legw_baseline()  # LARS
  planned = date.plan(base, 8192, "adaptive", noise_of="lars_step", grow_batch=True)
  assert planned.noise_of == "lars_step" and "trust ratio" in planned.rationale["noise_of"]
  row = next(line for line in date.explain(base, planned).splitlines()
             if line.startswith("noise_of"))
  assert "gradient" in row and "lars_step" in row
  assert date.Recipe.from_dict(json.loads(json.dumps(planned.to_dict()))) == planned
  # By default ("auto") a LARS plan measures the step too, and says so.
  auto = date.plan(base, 8192, "adaptive")
  assert (auto.noise_of, auto.measured_noise_of) == ("auto", "lars_step")
  assert auto.rationale["noise_of"].startswith("auto: the step LARS takes")
  # A baseline's explicit choice passes on, unless the plan says otherwise.
  gradient = legw_baseline(noise_of="gradient")
  assert date.plan(gradient, 8192, "adaptive").measured_noise_of == "gradient"
  assert "noise_of" not in date.plan(gradient, 8192, "adaptive").rationale
  assert date.plan(gradient, 8192, "adaptive", noise_of="lars_step").noise_of == "lars_step"
  assert "noise_of" in base.used_fields() and "noise_of" not in gradient.used_fields()
  with pytest.raises(ValueError, match="noise_of='lars_step' is a rule of the 'adaptive'"):
    date.plan(base, 8192, "legw", noise_of="lars_step")
  with pytest.raises(ValueError, match="optimizer='momentum'"):
    date.plan(goyal_baseline(), 8192, "adaptive", noise_of="lars_step")
