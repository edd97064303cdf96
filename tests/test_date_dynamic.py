"""DATE's dynamic part: statistics, the gradient noise scale, the divergence guard."""

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from dateopt import date
from dateopt.date import guard as guard_lib
from dateopt.date import stats as stats_lib

# ---- noise scale: formulas ----------------------------------------------------


def test_noise_estimates_invert_the_expected_norms():
  # |G|² = 2, tr Σ = 30: E|G_B|² = |G|² + tr Σ / B at B = 10 and B = 80.
  sq = date.GradientSqNorms(small=2 + 30 / 10, big=2 + 30 / 80, small_batch_size=10,
                            big_batch_size=80)
  grad_sq, trace = date.noise_estimates(sq)
  assert float(grad_sq) == pytest.approx(2.0, rel=1e-6)
  assert float(trace) == pytest.approx(30.0, rel=1e-6)


def test_noise_scale_ema_skips_non_finite_measurements():
  state = date.init_noise_scale()
  assert np.isnan(float(date.noise_scale(state)))
  state = date.update_noise_scale(state, date.GradientSqNorms(5.0, 2.375, 10, 80), 0.9)
  state = date.update_noise_scale(state, date.GradientSqNorms(jnp.nan, 1.0, 10, 80), 0.9)
  assert int(state.count) == 1
  assert float(date.noise_scale(state)) == pytest.approx(15.0, rel=1e-5)


def test_adascale_gain_and_efficiency():
  # gain = (1 + B_noise/B0)/(1 + B_noise/B) = (1 + 10)/(1 + 1) = 5.5 for S = 10.
  assert date.adascale_gain(1000.0, 100, 1000) == pytest.approx(5.5)
  assert date.expected_efficiency(1000.0, 100, 1000) == pytest.approx(0.55)
  assert date.expected_efficiency(1e9, 100, 1600) == pytest.approx(1.0, rel=1e-5)
  assert date.expected_efficiency(1e-3, 100, 1600) == pytest.approx(1 / 16, rel=1e-4)


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
  """Runs `track_statistics` at the fixed point W with fresh batches each step."""
  tx = date.track_statistics(optax.sgd(0.0), noise_decay=0.99)

  def body(state, key):
    grads, sq = grads_and_sq_norms(W, _sample(key, LOCAL_BATCH * REPLICAS))
    _, state = tx.update(grads, state, W, grad_sq_norms=sq)
    return state, None

  keys = jax.random.split(jax.random.PRNGKey(1), steps)
  state, _ = jax.jit(lambda s: jax.lax.scan(body, s, keys))(tx.init(W))
  return float(date.statistics(state)["noise_scale"])


def test_noise_scale_from_a_shard_map_data_parallel_step():
  mesh = jax.make_mesh((REPLICAS,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("data")),
                     out_specs=(P(), P(), P()))
  def data_parallel_grads(params, batch):
    # Per-replica gradients: take them w.r.t. a varying copy of the params.
    local = jax.grad(_least_squares_loss)(jax.lax.pcast(params, "data", to="varying"),
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
  got = date.trust_ratio_summary(grads, params, trust_coefficient=eta, weight_decay=beta)
  np.testing.assert_allclose(got, [min(ratios), np.median(ratios), max(ratios)], rtol=1e-5)


def test_compute_statistics_norms_and_update_ratio():
  params, grads = _tree()
  updates = jax.tree.map(lambda g: -0.5 * g, grads)
  s = date.compute_statistics(grads, updates, params)
  flat = lambda t: np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)])
  assert float(s.grad_norm) == pytest.approx(np.linalg.norm(flat(grads)), rel=1e-5)
  assert float(s.update_to_param_ratio) == pytest.approx(
      0.5 * np.linalg.norm(flat(grads)) / np.linalg.norm(flat(params)), rel=1e-5)
  assert np.isnan(float(s.noise_scale))


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
  assert set(logged) == set(date.TrainingStatistics._fields)
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


def test_guard_skips_non_finite_gradients_and_keeps_the_inner_state():
  tx = date.divergence_guard(optax.sgd(0.1, momentum=0.9))
  params = {"w": jnp.ones(2)}
  state = tx.init(params)
  updates, state = tx.update({"w": jnp.array([1.0, 1.0])}, state, params, value=1.0)
  momentum_before = state.inner_state
  updates, state = tx.update({"w": jnp.array([jnp.inf, 1.0])}, state, params, value=1.0)
  np.testing.assert_array_equal(updates["w"], [0.0, 0.0])
  jax.tree.map(np.testing.assert_array_equal, state.inner_state, momentum_before)
  assert (int(state.num_skipped), int(state.num_nonfinite), int(state.num_spikes)) == (1, 1, 0)
  assert float(state.lr_multiplier) == 0.5
  _, state = tx.update({"w": jnp.ones(2)}, state, params, value=jnp.nan)  # NaN loss
  assert int(state.num_nonfinite) == 2


def test_guard_skips_a_spike_then_recovers_the_multiplier_gradually():
  tx = date.divergence_guard(optax.sgd(1.0), spike_factor=2.0, backoff=0.5,
                             recovery_steps=10)
  params, grads = {"w": jnp.zeros(1)}, {"w": jnp.ones(1)}
  state = tx.init(params)
  for _ in range(5):
    _, state = tx.update(grads, state, params, value=1.0)
  updates, state = tx.update(grads, state, params, value=3.0)  # a bad batch
  assert float(updates["w"][0]) == 0.0 and int(state.num_spikes) == 1
  assert float(state.loss_ema) == pytest.approx(1.0)  # the spike is not averaged in
  multipliers = []
  for _ in range(12):
    updates, state = tx.update(grads, state, params, value=1.0)
    multipliers.append(float(state.lr_multiplier))
  # Each good step multiplies by 2^(1/10): back to 1 after 10 steps, then capped.
  np.testing.assert_allclose(multipliers[:10], 0.5 * 2 ** (np.arange(1, 11) / 10), rtol=1e-5)
  assert multipliers[-1] == 1.0
  assert float(updates["w"][0]) == -1.0


def test_guard_accepts_a_persistent_level_after_patience():
  tx = date.divergence_guard(optax.sgd(1.0), patience=2)
  params, grads = {"w": jnp.zeros(1)}, {"w": jnp.ones(1)}
  state = tx.init(params)
  _, state = tx.update(grads, state, params, value=1.0)
  applied = []
  for _ in range(4):
    updates, state = tx.update(grads, state, params, value=10.0)
    applied.append(float(updates["w"][0]))
  # Two skips (x0.5 each), then the level is accepted at multiplier 0.25.
  assert applied[:3] == [0.0, 0.0, -0.25]
  assert float(state.loss_ema) == pytest.approx(10.0, rel=0.01)
  assert int(state.num_skipped) == 2


def _ill_conditioned_regression():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(256, 10)) * np.linspace(0.3, 3.0, 10)  # curvature up to ~9
  y = x @ rng.normal(size=10) + 0.1 * rng.normal(size=256)
  x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
  return lambda w: 0.5 * jnp.mean((x @ w - y) ** 2)


def _train(make_tx, loss_fn, learning_rate, steps=400):
  """Full-batch training; returns (final loss, first loss, optimizer state)."""
  w = jnp.zeros(10)
  tx = make_tx(learning_rate)  # built under jit: one compile for every LR

  def body(carry, _):
    w, state = carry
    loss, grads = jax.value_and_grad(loss_fn)(w)
    updates, state = tx.update(grads, state, w, value=loss)
    return (optax.apply_updates(w, updates), state), loss

  (w, state), losses = jax.lax.scan(body, (w, tx.init(w)), None, length=steps)
  return loss_fn(w), losses[0], state


def test_guard_rescues_a_run_with_a_ten_times_too_high_learning_rate():
  loss_fn = _ill_conditioned_regression()
  plain = lambda lr: optax.with_extra_args_support(optax.sgd(lr, momentum=0.9))
  final, first, _ = jax.jit(jax.vmap(lambda lr: _train(plain, loss_fn, lr)))(
      jnp.array([0.1, 1.0]))
  assert float(final[0]) < 0.01 * float(first[0])  # the tuned LR learns
  assert np.isnan(float(final[1]))  # 10x too high: diverges to NaN
  guarded = lambda lr: optax.chain(optax.clip_by_global_norm(1e6),
                                   date.divergence_guard(optax.sgd(lr, momentum=0.9)))
  final, first, state = jax.jit(lambda lr: _train(guarded, loss_fn, lr))(1.0)
  assert np.isfinite(float(final)) and float(final) < 0.01 * float(first)
  assert int(state[1].num_skipped) > 0


def test_guard_around_statistics_passes_both_extra_arguments_under_jit():
  params = {"w": jnp.ones((2, 2))}
  tx = date.divergence_guard(date.track_statistics(optax.sgd(0.1)))
  sq = date.GradientSqNorms(jnp.float32(5.0), jnp.float32(2.375), 10, 80)
  step = jax.jit(lambda g, s, loss: tx.update(g, s, params, value=loss, grad_sq_norms=sq))
  state = tx.init(params)
  _, state = step({"w": jnp.ones((2, 2))}, state, 1.0)
  updates, state = step({"w": jnp.ones((2, 2))}, state, 100.0)  # a spike: skipped
  assert float(jnp.sum(jnp.abs(updates["w"]))) == 0.0 and int(state.num_spikes) == 1
  logged = date.statistics(state)  # found inside the guard's inner state
  assert float(logged["noise_scale"]) == pytest.approx(15.0, rel=1e-5)
  assert float(logged["grad_norm"]) == pytest.approx(2.0)


@pytest.mark.parametrize("module", [stats_lib, guard_lib])
def test_docstring_examples(module):
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0


def test_noise_scale_is_infinite_when_the_signal_estimate_is_not_positive():
  # |G|² estimate = (B_big·|G_b|² − B_small·|G_s|²)/(B_big − B_small) < 0 here.
  state = date.update_noise_scale(date.init_noise_scale(),
                                  date.GradientSqNorms(5.0, 0.5, 10, 80))
  assert float(state.grad_sq_ema) < 0
  assert float(date.noise_scale(state)) == float("inf")
  assert np.isnan(float(date.noise_scale(date.init_noise_scale())))
