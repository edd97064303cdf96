"""DATE's dynamic part: the gradient noise scale, the adaptive engine, statistics."""

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import dateopt
from dateopt import date, masks, transforms
from dateopt.date import _progress as progress_lib
from dateopt.date import _noise as noise_lib
from dateopt.date import _stats as stats_lib
from dateopt.date import _builder as builder_lib
from dateopt.date import _planner as planner_lib

# ---- noise scale: formulas ----------------------------------------------------


def test_noise_estimates_invert_the_expected_norms():
  # |G|² = 2, tr Σ = 30: E|G_B|² = |G|² + tr Σ / B at B = 10 and B = 80.
  sq = date.GradientSqNorms(small=2 + 30 / 10, big=2 + 30 / 80, small_batch_size=10,
                            big_batch_size=80)
  grad_sq, trace = noise_lib.noise_estimates(sq)
  assert float(grad_sq) == pytest.approx(2.0, rel=1e-6)
  assert float(trace) == pytest.approx(30.0, rel=1e-6)


def test_noise_scale_ema_skips_non_finite_measurements():
  state = noise_lib.init_noise_scale()
  assert np.isnan(float(noise_lib.noise_scale(state)))
  state = noise_lib.update_noise_scale(state, date.GradientSqNorms(5.0, 2.375, 10, 80), 0.9)
  state = noise_lib.update_noise_scale(state, date.GradientSqNorms(jnp.nan, 1.0, 10, 80), 0.9)
  assert int(state.count) == 1
  assert float(noise_lib.noise_scale(state)) == pytest.approx(15.0, rel=1e-5)


def test_the_signal_ema_keeps_a_horizon_of_its_own():
  """|G|² reads 2, 2, 0.5 (tr Σ 30 each time). At decay 0.5 its bias-corrected EMA is
  (0.125·2 + 0.25·2 + 0.5·0.5)/0.875 = 1.1429 (hand arithmetic); tr Σ's, at 0.9, stays 30."""
  readings = [date.GradientSqNorms(g + 30 / 10, g + 30 / 80, 10, 80) for g in (2.0, 2.0, 0.5)]
  state = noise_lib.init_noise_scale()
  for sq in readings:
    state = noise_lib.update_noise_scale(state, sq, 0.9, signal_decay=0.5)
  grad_sq, trace = noise_lib.corrected_estimates(state, 0.9)
  assert float(grad_sq) == pytest.approx(1.0 / 0.875, rel=1e-5)
  assert float(trace) == pytest.approx(30.0, rel=1e-5)
  assert float(noise_lib.noise_scale(state)) == pytest.approx(30.0 * 0.875, rel=1e-5)
  # One decay for both (None, or the same number) is the EMA of before, bit for bit.
  for signal_decay in (None, 0.9):
    same = noise_lib.init_noise_scale()
    for sq in readings:
      same = noise_lib.update_noise_scale(same, sq, 0.9, signal_decay=signal_decay)
    want = 0.9 * (0.9 * 0.1 * 2.0 + 0.1 * 2.0) + 0.1 * 0.5  # the plain EMA, not corrected
    assert float(same.grad_sq_ema) == pytest.approx(want, rel=1e-5)
  with pytest.raises(ValueError, match="EngineConfig.horizon"):  # a |G|² decay 1 − 3/2 < 0
    date.measure_noise_scale(optax.sgd(0.1), config={"horizon": 2})


def test_a_faster_signal_ema_follows_a_falling_gradient_in_the_engine():
  """The engine reads |G|² over a third of its horizon: after |G|² falls from 4 to 1 (tr Σ
  320), its B_noise is closer to the new 320 than that of the engine with the `signal_horizon`
  rule off, whose |G|² EMA decays as slowly as tr Σ's (0.99)."""
  base = optax.constant_schedule(1e-3)
  make = lambda **options: date.adaptive(
      lambda learning_rate: optax.sgd(learning_rate), base, base_batch_size=32,
      batch_size=512, base_steps=10_000, **options)
  params = {"w": jnp.ones(3)}
  sq = lambda g: date.GradientSqNorms(g + 320 / 64, g + 320 / 512, 64, 512)
  readings = []
  for options in (dict(rules_off=("signal_horizon",)), {}):
    tx = make(**options)
    state = tx.init(params)
    update = jax.jit(functools.partial(tx.update, params=params))
    for g in [4.0] * 100 + [1.0] * 40:
      _, state = update({"w": jnp.ones(3)}, state, grad_sq_norms=sq(g))
    readings.append(float(noise_lib.noise_scale(state.noise)))
  # Hand arithmetic: the bias-corrected EMA at decay d gives the 100 old readings the weight
  # (d^40 - d^140)/(1 - d^140): 0.562 at 0.99 (B_noise 119), 0.286 at 0.97 (B_noise 172).
  config = date.EngineConfig()
  assert (config.noise_decay, config.signal_decay) == (0.99, 0.97)
  for got, d in zip(readings, (config.noise_decay, config.signal_decay)):
    old_share = (d ** 40 - d ** 140) / (1 - d ** 140)
    assert got == pytest.approx(320 / (4 * old_share + (1 - old_share)), rel=1e-4)
  assert readings[1] > readings[0]
  with pytest.raises(ValueError, match="EngineConfig.horizon"):
    make(config={"horizon": 2})


def test_a_spike_s_readings_are_winsorized_once_the_emas_have_settled():
  """|G|² = 2, tr Σ = 30 for 10 measurements (decay 0.9), then a spike reading |G|² = -500,
  tr Σ = 3,000 at B = 80: it enters as -4·(2 + 30/80) = -9.5 and 4·30 = 120 (hand arithmetic)."""
  steady = date.GradientSqNorms(5.0, 2.375, 10, 80)
  state = noise_lib.init_noise_scale()
  # Before `warm_in` measurements nothing is clipped: the first reading is 30 times the rest.
  clip = dict(clip=4.0, clip_after=date.EngineConfig().warm_in)  # the engine's
  first = noise_lib.update_noise_scale(state, date.GradientSqNorms(2 + 900 / 10, 2 + 900 / 80, 10, 80),
                                  0.9, **clip)
  assert float(first.trace_ema) == pytest.approx(0.1 * 900.0, rel=1e-5)
  for _ in range(date.EngineConfig().warm_in):
    state = noise_lib.update_noise_scale(state, steady, 0.9, **clip)
  spike = date.GradientSqNorms(-500 + 3000 / 10, -500 + 3000 / 80, 10, 80)
  assert [float(x) for x in noise_lib.noise_estimates(spike)] == pytest.approx([-500, 3000], rel=1e-5)
  after = noise_lib.update_noise_scale(state, spike, 0.9, **clip)
  assert float(after.grad_sq_ema) == pytest.approx(0.9 * float(state.grad_sq_ema) - 0.95,
                                                   rel=1e-5)
  assert float(after.trace_ema) == pytest.approx(0.9 * float(state.trace_ema) + 12.0, rel=1e-5)
  # Unclipped, the one reading would have turned |G|² negative (B_noise infinite).
  assert 0.9 * float(state.grad_sq_ema) - 50.0 < 0 < float(after.grad_sq_ema)


def test_adascale_gain_and_efficiency():
  # gain = (1 + B_noise/B0)/(1 + B_noise/B) = (1 + 10)/(1 + 1) = 5.5 for S = 10.
  assert noise_lib.adascale_gain(1000.0, 100, 1000) == pytest.approx(5.5)
  assert noise_lib.expected_efficiency(1000.0, 100, 1000) == pytest.approx(0.55)
  assert noise_lib.expected_efficiency(1e9, 100, 1600) == pytest.approx(1.0, rel=1e-5)
  assert noise_lib.expected_efficiency(1e-3, 100, 1600) == pytest.approx(1 / 16, rel=1e-4)


# ---- noise scale on least squares with a known gradient covariance ---------------

DIM, NOISE_VAR, LOCAL_BATCH, REPLICAS = 16, 0.5, 8, 8
W_STAR = jnp.zeros(DIM)
W = W_STAR + jnp.ones(DIM) / jnp.sqrt(DIM)  # |w - w*|² = 1


def _analytic_noise_scale():
  # Per-example gradient g = x xᵀδ − x ε with x ~ N(0, I), ε ~ N(0, σ²):
  # G = δ, Σ = |δ|² I + δδᵀ + σ² I, so tr Σ = (d + 1)|δ|² + dσ² and |G|² = |δ|².
  return (DIM + 1) + DIM * NOISE_VAR


def _least_squares_loss(w, batch):
  return 0.5 * jnp.mean((batch["x"] @ w - batch["y"]) ** 2)


def _sample(key, n):
  kx, ke = jax.random.split(key)
  x = jax.random.normal(kx, (n, DIM))
  return {"x": x, "y": x @ W_STAR + jnp.sqrt(NOISE_VAR) * jax.random.normal(ke, (n,))}


def _measure_noise_scale(grads_and_sq_norms, steps=500):
  """Runs `measure_noise_scale` at the fixed point W with fresh batches each step."""
  tx = date.measure_noise_scale(optax.sgd(0.0))  # a 100-step horizon: decay 0.99

  def body(state, key):
    grads, sq = grads_and_sq_norms(W, _sample(key, LOCAL_BATCH * REPLICAS))
    _, state = tx.update(grads, state, W, grad_sq_norms=sq)
    return state, None

  keys = jax.random.split(jax.random.PRNGKey(1), steps)
  state, _ = jax.jit(lambda s: jax.lax.scan(body, s, keys))(tx.init(W))
  return float(date.statistics(state)["noise_scale"])


def _per_replica(tree, axis_name):
  """`tree` marked as varying over `axis_name`: jax.lax.pcast (jax 0.10), or pvary (jax 0.8)."""
  if hasattr(jax.lax, "pcast"):
    return jax.lax.pcast(tree, axis_name, to="varying")
  return jax.lax.pvary(tree, axis_name)  # jax 0.8, the oldest allowed (make test-oldest)


def test_noise_scale_from_a_shard_map_data_parallel_step():
  mesh = jax.make_mesh((REPLICAS,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("data")),
                     out_specs=(P(), P(), P()))
  def data_parallel_grads(params, batch):
    # Per-replica gradients: take them w.r.t. a varying copy of the params.
    local = jax.grad(_least_squares_loss)(_per_replica(params, "data"),
                                          batch)
    grads, sq = date.cross_replica_sq_norms(local, "data", LOCAL_BATCH)
    assert (sq.small_batch_size, sq.big_batch_size) == (LOCAL_BATCH, 64)
    return grads, sq.small, sq.big

  def grads_and_sq_norms(w, batch):
    grads, small, big = data_parallel_grads(w, batch)
    return grads, date.GradientSqNorms(small, big, LOCAL_BATCH, LOCAL_BATCH * REPLICAS)

  estimate = _measure_noise_scale(grads_and_sq_norms)
  assert estimate == pytest.approx(_analytic_noise_scale(), rel=0.15)


def test_noise_scale_from_grouped_value_and_grad():
  grouped = date.grouped_value_and_grad(_least_squares_loss, REPLICAS)

  def grads_and_sq_norms(w, batch):
    _, grads, sq = grouped(w, batch)
    return grads, sq

  estimate = _measure_noise_scale(grads_and_sq_norms)
  assert estimate == pytest.approx(_analytic_noise_scale(), rel=0.15)


def test_grouped_value_and_grad_matches_the_full_batch_gradient():
  rng = np.random.default_rng(3)
  batch = {"x": jnp.asarray(rng.normal(size=(32, DIM)), jnp.float32),
           "y": jnp.asarray(rng.normal(size=32), jnp.float32)}
  value, grads, sq = jax.jit(date.grouped_value_and_grad(_least_squares_loss, 4))(W, batch)
  full_value, full_grads = jax.jit(jax.value_and_grad(_least_squares_loss))(W, batch)
  np.testing.assert_allclose(value, full_value, rtol=1e-5)
  np.testing.assert_allclose(grads, full_grads, rtol=1e-5, atol=1e-6)
  x, y, w = np.asarray(batch["x"]), np.asarray(batch["y"]), np.asarray(W)
  # The least-squares gradient of each slice of 8, in closed form: Xᵀ(Xw − y)/8.
  groups = [x[i:i + 8].T @ (x[i:i + 8] @ w - y[i:i + 8]) / 8 for i in range(0, 32, 8)]
  assert float(sq.small) == pytest.approx(np.mean([np.sum(g ** 2) for g in groups]),
                                          rel=1e-5)
  assert float(sq.big) == pytest.approx(float(np.sum(full_grads ** 2)), rel=1e-5)
  with pytest.raises(ValueError, match="divisible"):
    jax.jit(date.grouped_value_and_grad(_least_squares_loss, 5))(W, batch)


# ---- the noise of the step LARS takes (noise_of="lars_step") --------------------------


def _lars_step_recipe(**fields):
  return date.Recipe(**{"batch_size": 256, "num_examples": 50_000, "num_epochs": 10,
                        "learning_rate": 1.0, "optimizer": "lars", "base_batch_size": 32,
                        "noise_of": "lars_step", **fields})


def _group_grads(params, num_groups=4):
  rng = np.random.default_rng(7)
  return jax.tree.map(
      lambda p: jnp.asarray(0.1 * rng.normal(size=(num_groups,) + p.shape), jnp.float32), params)


def test_lars_step_norms_are_those_of_the_trust_ratio_scaled_gradients():
  """Checked against the LARS transform's own output (with no weight decay it is λ_l·g_l,
  the bias passing unscaled): its squared norm is the big batch's, and each leaf's
  λ_l = |output_l|/|ḡ_l| weights the groups' norms."""
  params, _ = _tree()
  group_grads = _group_grads(params)
  scales = builder_lib.noise_leaf_scales(_lars_step_recipe(weight_decay=0.0), params)
  _, mean, sq = noise_lib.combine_group_grads(jnp.zeros(4), group_grads, 32, leaf_scales=scales)
  lars = dateopt.scale_by_lars_trust_ratio(weight_decay=0.0)
  step, _ = lars.update(mean, lars.init(params), params)
  norm = lambda x: float(np.linalg.norm(np.asarray(x)))
  ratios = jax.tree.map(lambda out, g: norm(out) / norm(g), step, mean)
  assert ratios["c"]["bias"] == pytest.approx(1.0) and ratios["a"]["kernel"] != 1.0
  small = np.mean([sum(r ** 2 * norm(g[i]) ** 2 for r, g in zip(
      jax.tree.leaves(ratios), jax.tree.leaves(group_grads))) for i in range(4)])
  assert float(sq.big) == pytest.approx(sum(norm(x) ** 2 for x in jax.tree.leaves(step)),
                                        rel=1e-5)
  assert float(sq.small) == pytest.approx(small, rel=1e-5)
  assert (sq.small_batch_size, sq.big_batch_size) == (8, 32)


def test_lars_step_scales_follow_the_recipe_and_cross_replica_agrees_with_groups():
  params, _ = _tree()
  group_grads = _group_grads(params, REPLICAS)
  recipe = _lars_step_recipe(weight_decay=0.01, trust_coefficient=0.02)
  scales = builder_lib.noise_leaf_scales(recipe, params)
  mean = jax.tree.map(lambda g: jnp.mean(g, axis=0), group_grads)
  expected = transforms.lars_trust_ratios(mean, params, weight_decay=0.01,
                                         trust_coefficient=0.02,
                                         mask=masks.exclude_bias_and_norm)  # the recipe's
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), scales(mean), expected)
  assert builder_lib.noise_leaf_scales(recipe.replace(noise_of="gradient"), params) is None
  # Options the optimizer takes reach the scales too (eps in the denominator, the mode).
  optioned = recipe.replace(optimizer_options={"eps": 1.0, "mode": "optax"})
  expected_optioned = transforms.lars_trust_ratios(
      mean, params, weight_decay=0.01, trust_coefficient=0.02, eps=1.0, mode="optax",
      mask=masks.exclude_bias_and_norm)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
               builder_lib.noise_leaf_scales(optioned, params)(mean), expected_optioned)
  _, _, grouped = noise_lib.combine_group_grads(jnp.zeros(REPLICAS), group_grads, 64,
                                           leaf_scales=scales)
  mesh = jax.make_mesh((REPLICAS,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("data"), out_specs=(P(), P()))
  def replicated_norms(local):
    _, sq = date.cross_replica_sq_norms(jax.tree.map(lambda g: g[0], local), "data", 8,
                                        leaf_scales=scales)
    return sq.small, sq.big

  small, big = replicated_norms(group_grads)
  assert float(small) == pytest.approx(float(grouped.small), rel=1e-5)
  assert float(big) == pytest.approx(float(grouped.big), rel=1e-5)


def test_grouped_value_and_grad_takes_the_recipes_scales_at_the_steps_params():
  """The one-call form gives what per_group_value_and_grad + combine_group_grads give with
  the scales taken at the same params, and the gradient's norms without them."""
  params, _ = _tree()
  x = jnp.asarray(np.random.default_rng(3).normal(size=(16, 4)), jnp.float32)
  loss = lambda p, batch: jnp.mean(
      (jnp.tanh(batch @ p["a"]["kernel"]) @ p["b"]["kernel"] @ p["c"]["kernel"]
       + p["c"]["bias"]) ** 2)
  recipe = _lars_step_recipe(weight_decay=1e-3)
  got = date.grouped_value_and_grad(
      loss, 4, leaf_scales=functools.partial(builder_lib.noise_leaf_scales, recipe))(params, x)
  values, group_grads = date.per_group_value_and_grad(loss, 4)(params, x)
  expected = noise_lib.combine_group_grads(values, group_grads, 16,
                                      leaf_scales=builder_lib.noise_leaf_scales(recipe, params))
  plain = date.grouped_value_and_grad(loss, 4)(params, x)
  for field in ("small", "big"):
    assert float(getattr(got[2], field)) == pytest.approx(float(getattr(expected[2], field)),
                                                          rel=1e-6)
    assert float(getattr(got[2], field)) != pytest.approx(float(getattr(plain[2], field)),
                                                          rel=0.01)
  jax.tree.map(np.testing.assert_array_equal, got[1], plain[1])  # the step's gradient: unscaled


def _adam_state_after(params, updates: int, *, b2=0.99, eps=1e-3):
  """optax.adam's state after `updates` updates on random gradients."""
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2, b2=b2, eps=eps))
  state = tx.init(params)
  rng = np.random.default_rng(11)
  for _ in range(updates):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    _, state = tx.update(grads, state, params)
  return state


def test_adam_step_norms_are_the_gradient_in_adams_metric():
  """Checked by hand in numpy: each coordinate of every group's gradient times
  1/(√(ν/(1 − b2^t)) + ε), with ν and t read off optax.adam's own state (inside a chain)."""
  params, _ = _tree()
  group_grads = _group_grads(params)
  recipe = _lars_step_recipe(optimizer="adam", b2=0.99, eps=1e-3, noise_of="adam_step")
  state = _adam_state_after(params, 3)
  scales = builder_lib.noise_leaf_scales(recipe, params, state)
  _, _, sq = noise_lib.combine_group_grads(jnp.zeros(4), group_grads, 32, leaf_scales=scales)
  nu = jax.tree.leaves(state[1][0].nu)
  factors = [1 / (np.sqrt(np.asarray(v) / (1 - 0.99 ** 3)) + 1e-3) for v in nu]
  groups = [np.asarray(g) for g in jax.tree.leaves(group_grads)]
  small = np.mean([sum(np.sum((f * g[i]) ** 2) for f, g in zip(factors, groups))
                   for i in range(4)])
  big = sum(np.sum((f * g.mean(0)) ** 2) for f, g in zip(factors, groups))
  assert float(sq.small) == pytest.approx(small, rel=1e-5)
  assert float(sq.big) == pytest.approx(big, rel=1e-5)
  plain = noise_lib.combine_group_grads(jnp.zeros(4), group_grads, 32)[2]
  assert float(sq.small) != pytest.approx(float(plain.small), rel=0.01)


def test_adam_step_before_the_first_update_measures_the_gradient():
  """At t = 0 Adam has no second moments: every factor is 1 (not 0/0)."""
  params, _ = _tree()
  recipe = _lars_step_recipe(optimizer="adamw", noise_of="adam_step")
  scales = builder_lib.noise_leaf_scales(recipe, params, _adam_state_after(params, 0))(None)
  for factor in jax.tree.leaves(scales):
    np.testing.assert_array_equal(factor, np.ones_like(factor))


def test_adam_step_needs_an_adam_state():
  params, _ = _tree()
  recipe = _lars_step_recipe(optimizer="adam", noise_of="adam_step")
  with pytest.raises(ValueError, match="noise_of='adam_step' reads Adam's second moments"):
    builder_lib.noise_leaf_scales(recipe, params, optax.sgd(0.1).init(params))


@pytest.mark.parametrize("fields, match", [
    ({"optimizer": "adam"}, "noise_of='lars_step' measures the step LARS takes; "
                            "optimizer='adam'"),
    ({"optimizer_options": {"trust_clip": True}}, "trust_clip"),
    ({"grad_clip_norm": 1.0}, "grad_clip_norm"),
    ({"noise_of": "update"}, "noise_of.*'auto', 'gradient', 'lars_step', 'adam_step'"),
    ({"noise_of": "adam_step"}, "noise_of='adam_step' measures the step Adam takes; "
                                "optimizer='lars'"),
])
def test_a_recipe_refuses_a_noise_of_its_optimizer_does_not_take(fields, match):
  with pytest.raises(ValueError, match=match):
    _lars_step_recipe(**fields)


@pytest.mark.parametrize("fields, measured", [
    ({}, "lars_step"),
    ({"optimizer": "adam"}, "gradient"),
    ({"optimizer": "lamb"}, "gradient"),
    ({"optimizer_options": {"trust_clip": True}}, "gradient"),
    ({"grad_clip_norm": 1.0}, "gradient"),
])
def test_auto_measures_the_lars_step_where_it_can_and_the_gradient_elsewhere(fields, measured):
  """The default, "auto", never refuses: it falls back to the gradient where the step's
  noise is not LARS's plain trust ratios × the gradient."""
  params, _ = _tree()
  recipe = _lars_step_recipe(**{"noise_of": "auto", **fields})
  assert recipe.measured_noise_of == measured
  scales = builder_lib.noise_leaf_scales(recipe, params)
  assert (scales is None) == (measured == "gradient")
  if scales is not None:  # the same scales as the explicit choice
    mean = jax.tree.map(lambda p: jnp.ones_like(p), params)
    jax.tree.map(np.testing.assert_array_equal, scales(mean),
                 builder_lib.noise_leaf_scales(recipe.replace(noise_of="lars_step"), params)(mean))


# ---- per-step statistics ------------------------------------------------------------


def _tree():
  rng = np.random.default_rng(0)
  params = {"a": {"kernel": rng.normal(size=(4, 3))}, "b": {"kernel": rng.normal(size=(3, 2))},
            "c": {"kernel": 5 * rng.normal(size=(2, 2)), "bias": rng.normal(size=(2,))}}
  grads = jax.tree.map(lambda p: 0.1 * rng.normal(size=p.shape), params)
  cast = lambda t: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), t)
  return cast(params), cast(grads)


def test_trust_ratio_summary_matches_numpy():
  params, grads = _tree()
  eta, beta = 0.001, 0.01
  ratios = [eta * np.linalg.norm(params[k]["kernel"]) /
            (np.linalg.norm(grads[k]["kernel"]) + beta * np.linalg.norm(params[k]["kernel"]))
            for k in ("a", "b", "c")]  # the bias is masked out
  got = stats_lib.trust_ratio_summary(grads, params, trust_coefficient=eta, weight_decay=beta)
  np.testing.assert_allclose(got, [min(ratios), np.median(ratios), max(ratios)], rtol=1e-5)


def test_compute_statistics_norms_and_update_ratio():
  params, grads = _tree()
  updates = jax.tree.map(lambda g: -0.5 * g, grads)
  s = stats_lib.compute_statistics(grads, updates, params)
  flat = lambda t: np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)])
  assert float(s.grad_norm) == pytest.approx(np.linalg.norm(flat(grads)), rel=1e-5)
  assert float(s.update_to_param_ratio) == pytest.approx(
      0.5 * np.linalg.norm(flat(grads)) / np.linalg.norm(flat(params)), rel=1e-5)


def test_track_statistics_leaves_updates_alone_inside_a_jitted_chain():
  params, grads = _tree()
  inner = optax.sgd(0.1, momentum=0.9)
  tx = optax.chain(optax.clip_by_global_norm(10.0), date.track_statistics(inner))
  ref = optax.chain(optax.clip_by_global_norm(10.0), inner)
  state, ref_state = tx.init(params), ref.init(params)
  step, ref_step = jax.jit(tx.update), jax.jit(ref.update)
  for _ in range(3):
    updates, state = step(grads, state, params)
    ref_updates, ref_state = ref_step(grads, ref_state, params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), updates, ref_updates)
  logged = date.statistics(state)
  assert set(logged) == set(stats_lib.TrainingStatistics._fields)
  assert float(logged["update_norm"]) == pytest.approx(float(optax.tree.norm(updates)),
                                                       rel=1e-5)


def test_track_statistics_records_only_when_asked():
  params, grads = _tree()
  tx = date.track_statistics(optax.sgd(0.1))
  step = jax.jit(tx.update)  # one compilation for both values of `record`
  state = tx.init(params)
  _, state = step(grads, state, params, record=jnp.bool_(True))
  recorded = {k: float(v) for k, v in date.statistics(state).items()}
  params = jax.tree.map(lambda p: 2.0 * p, params)  # a different param norm
  _, state = step(grads, state, params, record=jnp.bool_(False))
  kept = {k: float(v) for k, v in date.statistics(state).items()}
  assert kept == pytest.approx(recorded, nan_ok=True)
  _, state = step(grads, state, params, record=jnp.bool_(True))
  flat = lambda t: np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)])
  assert float(date.statistics(state)["param_norm"]) == pytest.approx(
      np.linalg.norm(flat(params)), rel=1e-5)
  assert step._cache_size() == 1


# ---- divergence guard ------------------------------------------------------------------


def test_guard_around_statistics_passes_every_extra_argument_under_jit():
  params = {"w": jnp.ones((2, 2))}
  tx = date.divergence_guard(date.track_statistics(date.measure_noise_scale(optax.sgd(0.1))))
  sq = date.GradientSqNorms(jnp.float32(5.0), jnp.float32(2.375), 10, 80)
  step = jax.jit(lambda g, s, loss: tx.update(g, s, params, value=loss, grad_sq_norms=sq,
                                              record=jnp.bool_(True)))
  state = tx.init(params)
  _, state = step({"w": jnp.ones((2, 2))}, state, 1.0)
  logged = date.statistics(state)  # found inside the guard's inner state
  assert float(logged["noise_scale"]) == pytest.approx(15.0, rel=1e-5)
  assert float(logged["grad_norm"]) == pytest.approx(2.0)


@pytest.mark.parametrize("module", [stats_lib, noise_lib, progress_lib])
def test_docstring_examples(module):
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0


def test_noise_scale_is_infinite_when_the_signal_estimate_is_not_positive():
  # |G|² estimate = (B_big·|G_b|² − B_small·|G_s|²)/(B_big − B_small) < 0 here.
  state = noise_lib.update_noise_scale(noise_lib.init_noise_scale(),
                                  date.GradientSqNorms(5.0, 0.5, 10, 80), 0.99)
  assert float(state.grad_sq_ema) < 0
  assert float(noise_lib.noise_scale(state)) == float("inf")
  assert np.isnan(float(noise_lib.noise_scale(noise_lib.init_noise_scale())))


# ---- the law: gain, efficiency, predicted steps ------------------------------------


def test_gain_from_estimates_matches_the_closed_form_and_is_clipped():
  # |G|² = 1, tr Σ = 320 (B_noise = 320), measured exactly (decay 0).
  state = noise_lib.update_noise_scale(noise_lib.init_noise_scale(),
                                  date.GradientSqNorms(1 + 320 / 64, 1 + 320 / 512, 64, 512),
                                  0.0)
  assert float(noise_lib.gain_from_estimates(state, 32, 512)) == pytest.approx(
      noise_lib.adascale_gain(320.0, 32, 512), rel=1e-5)
  assert noise_lib.adascale_gain(320.0, 32, 512) == pytest.approx((1 + 10) / (1 + 0.625))
  # No measurement yet: the baseline's pace. Pure noise: k. No noise: 1.
  assert float(noise_lib.gain_from_estimates(noise_lib.init_noise_scale(), 32, 512)) == 1.0
  noise_only = noise_lib.NoiseScaleState(jnp.float32(-1.0), jnp.float32(5.0), jnp.int32(3))
  assert float(noise_lib.gain_from_estimates(noise_only, 32, 512)) == pytest.approx(16.0)
  signal_only = noise_lib.NoiseScaleState(jnp.float32(2.0), jnp.float32(-5.0), jnp.int32(3))
  assert float(noise_lib.gain_from_estimates(signal_only, 32, 512)) == 1.0
  assert noise_lib.adascale_gain(float("inf"), 32, 512) == 16.0


def test_predicted_steps_by_hand():
  # gain(B_noise = 1000, 100 -> 1000) = 11/2 = 5.5; 5500 baseline steps, no warmup.
  at_1000 = {"base_batch_size": 100, "batch_size": 1000}
  assert noise_lib.predicted_steps(1000.0, **at_1000, base_steps=5500) == 1000
  # With a 10-step ramp: 5.5 · 11/2 = 30.25 covered in the ramp, (5500 − 30.25)/5.5 after.
  assert noise_lib.predicted_steps(1000.0, **at_1000, base_steps=5500, warmup_steps=10) == (
      10 + int(np.ceil(5469.75 / 5.5)))
  # A baseline that ends inside the ramp: r·n(n+1)/(2W) ≥ T.
  n = noise_lib.predicted_steps(1000.0, **at_1000, base_steps=20, warmup_steps=100)
  assert 5.5 * n * (n + 1) / 200 >= 20 > 5.5 * (n - 1) * n / 200
  with pytest.raises(TypeError, match="noise_scale"):
    noise_lib.predicted_steps("500", base_batch_size=32, batch_size=512, base_steps=7500)
  with pytest.raises(ValueError, match="noise_scale"):
    noise_lib.predicted_steps(-1.0, base_batch_size=32, batch_size=512, base_steps=7500)


# ---- the adaptive engine ------------------------------------------------------------


def _adaptive_numpy(grads_seq, sq_seq, *, lr0, b0, b, base_steps, warmup, rule, decay,
                    signal_decay):
  """SGD under DATE's adaptive rule, written out in NumPy (float64); |G|²'s EMA runs at
  `signal_decay` and is rescaled to tr Σ's bias, (1 - decay^n)/(1 - signal_decay^n)."""
  w, tau, g_raw, t_ema, lrs, taus = np.ones(3), 0.0, 0.0, 0.0, [], []
  for t, (g, (small, big, bs, bb)) in enumerate(zip(grads_seq, sq_seq)):
    if tau >= base_steps:
      break
    g_est = (bb * big - bs * small) / (bb - bs)
    t_est = (small - big) / (1 / bs - 1 / bb)
    g_raw = signal_decay * g_raw + (1 - signal_decay) * g_est
    g_ema = g_raw * (1 - decay ** (t + 1)) / (1 - signal_decay ** (t + 1))
    t_ema = decay * t_ema + (1 - decay) * t_est
    gain = np.clip((max(t_ema, 0) / b0 + max(g_ema, 0)) / (max(t_ema, 0) / b + max(g_ema, 0)),
                   1, b / b0)
    ramp = min(1.0, (t + 1) / warmup) if warmup else 1.0
    lr = ramp * (gain if rule == "linear" else np.sqrt(gain)) * lr0(max(tau, warmup))
    w = w - lr * np.asarray(g)
    tau += ramp * gain
    lrs.append(lr)
    taus.append(tau)
  return w, lrs, taus


@pytest.mark.parametrize("rule", ["linear", "sqrt"])
def test_adaptive_sgd_matches_a_numpy_transcription(rule):
  lr0 = lambda s: 0.1 * (1 - min(s, 60) / 60)   # linear decay over 60 baseline steps
  rng = np.random.default_rng(0)
  grads = [rng.normal(size=3) for _ in range(40)]
  sqs = [(float(s + 4 * n), float(s + n / 2), 8, 64)
         for s, n in zip(rng.uniform(0.5, 2, 40), rng.uniform(1, 30, 40))]
  tx = date.adaptive(lambda learning_rate: optax.sgd(learning_rate),
                     lambda s: 0.1 * (1 - jnp.minimum(s, 60) / 60), base_batch_size=8,
                     batch_size=64, base_steps=60, warmup_steps=5, gain_rule=rule)
  step = jax.jit(lambda g, s, p, sq: tx.update(g, s, p, grad_sq_norms=sq))
  params, state = jnp.ones(3), tx.init(jnp.ones(3))
  lrs = []
  for g, sq in zip(grads, sqs):
    updates, state = step(jnp.asarray(g, jnp.float32), state, params,
                          date.GradientSqNorms(*[jnp.float32(v) for v in sq[:2]], *sq[2:]))
    params = optax.apply_updates(params, updates)
    lrs.append(float(optax.tree.get(state, "learning_rate")))
  w, want_lrs, taus = _adaptive_numpy(grads, sqs, lr0=lr0, b0=8, b=64, base_steps=60,
                                      warmup=5, rule=rule, decay=date.EngineConfig().noise_decay,
                                      signal_decay=date.EngineConfig().signal_decay)  # the engine's
  assert int(state.count) == len(want_lrs) < 40   # it stopped by itself
  assert float(state.progress) == pytest.approx(taus[-1], rel=1e-5) and taus[-1] >= 60
  np.testing.assert_allclose(lrs[:len(want_lrs)], want_lrs, rtol=1e-5)
  np.testing.assert_allclose(params, w, rtol=1e-5, atol=1e-6)
  assert bool(date.progress_done(state, 60)) and step._cache_size() == 1


def test_adaptive_without_noise_runs_the_baseline_schedule_step_for_step():
  # B = B0: the gain is 1, so lr_t = ramp_t · lr0(max(t, W)) and τ = Σ ramp.
  schedule = optax.linear_schedule(0.5, 0.0, 20)
  tx = date.adaptive(lambda learning_rate: optax.sgd(learning_rate), schedule,
                     base_batch_size=16, batch_size=16, base_steps=20)
  params, state = jnp.zeros(2), tx.init(jnp.zeros(2))
  for t in range(20):
    updates, state = tx.update(jnp.ones(2), state, params)
    assert float(updates[0]) == pytest.approx(-float(schedule(t)), abs=1e-7)
  assert bool(date.progress_done(state, 20))
  updates, state = tx.update(jnp.ones(2), state, params)   # covered: nothing more
  assert float(jnp.abs(updates).sum()) == 0.0 and int(state.count) == 20


def test_adaptive_inside_guard_and_statistics_in_one_jitted_chain():
  schedule = optax.cosine_decay_schedule(1e-2, 100)
  tx = date.divergence_guard(date.track_statistics(date.adaptive(
      lambda learning_rate: optax.adam(learning_rate), schedule, base_batch_size=8,
      batch_size=64, base_steps=100, warmup_steps=4)))
  params = {"w": jnp.ones((2, 2))}
  state = tx.init(params)
  sq = date.GradientSqNorms(jnp.float32(5.0), jnp.float32(2.375), 10, 80)
  step = jax.jit(lambda g, s: tx.update(g, s, params, value=jnp.float32(1.0), grad_sq_norms=sq))
  for _ in range(3):
    _, state = step({"w": jnp.ones((2, 2))}, state)
  assert float(date.statistics(state)["noise_scale"]) == pytest.approx(15.0, rel=1e-5)
  assert float(optax.tree.get(state, "progress")) > 0


def test_adaptive_rejects_bad_arguments():
  make = lambda learning_rate: optax.sgd(learning_rate)
  with pytest.raises(ValueError, match="gain_rule"):
    date.adaptive(make, optax.constant_schedule(0.1), base_batch_size=8, batch_size=64,
                  base_steps=10, gain_rule="cube")
  with pytest.raises(ValueError, match="batch_size"):
    date.adaptive(make, optax.constant_schedule(0.1), base_batch_size=64, batch_size=8,
                  base_steps=10)
  with pytest.raises(ValueError, match="warmup_steps"):
    date.adaptive(make, optax.constant_schedule(0.1), base_batch_size=8, batch_size=64,
                  base_steps=10, warmup_steps=10)


def test_adaptive_plan_builds_the_adaptive_optimizer_and_explains_the_prediction():
  base = date.Recipe(batch_size=32, num_examples=8000, num_epochs=30, learning_rate=2e-3,
                     optimizer="adam", warmup_epochs=0.25)
  big = date.plan(base, 512, "adaptive", noise_scale=500.0)
  assert (big.adaptive, big.base_batch_size, big.batch_size) == (True, 32, 512)
  assert (big.total_steps, big.warmup_steps, big.max_steps) == (7500, 63, 7563)
  assert big.learning_rate == base.learning_rate and big.steps_per_epoch == 15
  # The baseline's B_noise, as a run at 512 reads it: × 16^0.2 = 870.55 (the batch trend).
  predicted = noise_lib.predicted_steps(500.0 * 16 ** 0.2, base_batch_size=32, batch_size=512,
                                   base_steps=7500, warmup_steps=63)
  assert planner_lib.plan_predicted_steps(big, 500.0) == predicted == 750
  assert (f"{predicted} for B_noise = 500 at the baseline's batch, read × 1.74 at 512"
          in date.explain(base, big))
  tx, schedule = date.build(big)
  assert float(schedule(63)) == pytest.approx(2e-3)   # the baseline's, in baseline steps
  state = tx.init({"w": jnp.ones(2)})
  assert isinstance(state, date.AdaptiveState)
  assert date.Recipe.from_dict(big.to_dict()) == big
  with pytest.raises(ValueError, match="base_batch_size"):
    base.replace(base_batch_size=64)
  with pytest.raises(ValueError, match="momentum_scaling"):
    date.plan(base, 512, "adaptive", momentum_scaling=True)
