"""dateopt.date's optax-level API on the inputs a user gets wrong: clear errors, no silent runs."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dateopt import date
from dateopt.date import _noise as noise_lib


def _engine(make=lambda learning_rate: optax.adam(learning_rate),
            schedule=optax.constant_schedule(1e-2), **kwargs):
  options = dict(base_batch_size=32, batch_size=512, base_steps=1000)
  options.update(kwargs)
  return date.adaptive(make, schedule, **options)


PARAMS = {"w": jnp.ones(3)}
# |G|² = 1, tr Σ = 320 at groups of 64 in a batch of 512: a healthy reading (gain 6.77).
SQ = date.GradientSqNorms(1 + 320 / 64, 1 + 320 / 512, 64, 512)


# --- Updates without the noise readings -------------------------------------------------------

def test_an_update_without_grad_sq_norms_warns_that_the_gain_stays_one():
  tx = _engine()
  with pytest.warns(UserWarning, match=r"grad_sq_norms.*gain stays 1.*grouped_value_and_grad"):
    _, state = tx.update(PARAMS, tx.init(PARAMS), PARAMS)
  assert float(state.gain) == 1.0


def test_an_engine_at_the_baselines_batch_needs_no_readings():
  tx = _engine(batch_size=32)  # k = 1: the gain is 1 whatever the noise
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    tx.update(PARAMS, tx.init(PARAMS), PARAMS)


def test_an_update_with_grad_sq_norms_does_not_warn():
  tx = _engine()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    tx.update(PARAMS, tx.init(PARAMS), PARAMS, grad_sq_norms=SQ)


# --- Non-finite gradients and updates ---------------------------------------------------------

def _warm(tx, steps=12):
  state = tx.init(PARAMS)
  update = jax.jit(tx.update)
  for _ in range(steps):
    _, state = update(PARAMS, state, PARAMS, grad_sq_norms=SQ, value=2.0)
  return state, update


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf])
def test_a_nonfinite_gradient_with_finite_norms_is_skipped_not_credited(bad):
  tx = _engine()
  before, update = _warm(tx)
  grads = {"w": jnp.array([1.0, bad, 1.0])}
  updates, state = update(grads, before, PARAMS, grad_sq_norms=SQ, value=2.0)
  assert not np.any(np.asarray(updates["w"]))
  assert float(state.progress) == float(before.progress) and int(state.count) == 12
  jax.tree.map(np.testing.assert_array_equal, state.inner_state, before.inner_state)
  jax.tree.map(np.testing.assert_array_equal, state.noise, before.noise)  # not measured
  assert int(state.watch.gradient_jumps) == 1  # a skipped step, counted by the patience


def test_nonfinite_gradients_that_keep_coming_give_up_at_the_patience():
  tx = _engine(config=date.EngineConfig(horizon=5))  # a diverged run is given up after h steps
  before, update = _warm(tx)
  state, nan = before, {"w": jnp.full(3, jnp.nan)}
  for _ in range(5):
    assert not bool(date.gave_up(state))
    _, state = update(nan, state, PARAMS, grad_sq_norms=SQ, value=2.0)
  assert bool(date.gave_up(state)) and float(state.progress) == float(before.progress)


def test_a_nonfinite_gradient_is_skipped_without_the_watch_too():
  tx = _engine(watch=False)
  state = tx.init(PARAMS)
  updates, state = tx.update({"w": jnp.full(3, jnp.nan)}, state, PARAMS, grad_sq_norms=SQ)
  assert float(state.progress) == 0.0 and int(state.count) == 0
  assert not np.any(np.asarray(updates["w"]))
  assert np.all(np.isfinite(np.asarray(optax.tree.get(state.inner_state, "mu")["w"])))


def test_a_nonfinite_update_from_finite_gradients_is_not_credited():
  # An infinite LR: the gradient is fine, the optimizer's update is not.
  tx = _engine(make=lambda learning_rate: optax.sgd(learning_rate),
               schedule=optax.constant_schedule(jnp.inf))
  state = tx.init(PARAMS)
  updates, state = tx.update(PARAMS, state, PARAMS, grad_sq_norms=SQ, value=2.0)
  assert float(state.progress) == 0.0 and int(state.count) == 0
  assert not np.any(np.asarray(updates["w"]))
  assert int(state.watch.gradient_jumps) == 1


# --- Reading an optimizer state that holds no engine ------------------------------------------

@pytest.mark.parametrize("reader", [
    date.next_batch_size, date.diverged, date.gave_up,
    lambda opt_state: date.progress_done(opt_state, 100)])
def test_state_readers_say_the_state_holds_no_adaptive_engine(reader):
  plain = optax.sgd(0.1).init(PARAMS)
  with pytest.raises(ValueError, match="opt_state holds no dateopt.date.adaptive state"):
    reader(plain)


def test_state_readers_find_the_engine_inside_a_chain():
  tx = date.track_statistics(date.divergence_guard(_engine()))
  state = tx.init(PARAMS)
  assert int(date.next_batch_size(state)) == 512
  assert not bool(date.progress_done(state, 1000))
  assert not bool(date.diverged(state)) and not bool(date.gave_up(state))


# --- The loss -----------------------------------------------------------------------------------

def test_a_vector_loss_is_refused_at_trace_time_naming_value():
  tx = _engine()
  with pytest.raises(ValueError, match=r"value= must be the scalar loss.*shape \(3,\)"):
    jax.jit(tx.update)(PARAMS, tx.init(PARAMS), PARAMS, grad_sq_norms=SQ, value=jnp.ones(3))


# --- Batch sizes of the noise readings ----------------------------------------------------------

@pytest.mark.parametrize("small, big, field", [
    (0, 8, "small_batch_size"), (-4, 8, "small_batch_size"), (8, 8, "big_batch_size"),
    (16, 8, "big_batch_size"), (2.5, 8, "small_batch_size"), (True, 8, "small_batch_size")])
def test_noise_readings_need_two_positive_batch_sizes(small, big, field):
  with pytest.raises((ValueError, TypeError), match=field):
    noise_lib.noise_estimates(date.GradientSqNorms(5.0, 2.0, small, big))
  with pytest.raises((ValueError, TypeError), match=field):
    noise_lib.no_measurement(small, big)
  with pytest.raises((ValueError, TypeError), match=field):
    _engine().update(PARAMS, _engine().init(PARAMS), PARAMS,
                     grad_sq_norms=date.GradientSqNorms(5.0, 2.0, small, big))


def test_noise_readings_take_numpy_and_whole_float_batch_sizes():
  grad_sq, trace = noise_lib.noise_estimates(date.GradientSqNorms(5.0, 2.375, np.int64(10), 80.0))
  assert (float(grad_sq), float(trace)) == pytest.approx((2.0, 30.0))


def test_group_and_replica_helpers_check_their_batch_size():
  with pytest.raises(ValueError, match="batch_size"):
    noise_lib.combine_group_grads(jnp.zeros(2), jnp.ones((2, 3)), 0)
  with pytest.raises(ValueError, match="batch_size=7.*num_groups=2"):
    noise_lib.combine_group_grads(jnp.zeros(2), jnp.ones((2, 3)), 7)
  with pytest.raises(ValueError, match="local_batch_size"):
    date.cross_replica_sq_norms({"w": jnp.ones(3)}, "data", 0)


# --- Ladders, steps and batch sizes as numbers --------------------------------------------------

def test_a_ladder_of_numpy_integers_is_accepted_as_ints():
  ladder = np.array([32, 64, 128, 256, 512])
  tx = _engine(batch_sizes=ladder, batch_size=np.int64(512))
  assert int(date.next_batch_size(tx.init(PARAMS))) == 32
  budget = date.predicted_budget(100.0, base_batch_size=np.int32(32), batch_sizes=ladder,
                                 base_steps=1000)
  assert type(budget["largest_batch_size"]) is int
  base = date.Recipe(batch_size=32, num_examples=8000, num_epochs=30, learning_rate=2e-3,
                     optimizer="adam", warmup_epochs=0.25)
  tx, _ = date.build(date.plan(base, 512, "adaptive", grow_batch=True), batch_sizes=ladder)
  assert int(date.next_batch_size(tx.init(PARAMS))) == 32


def test_a_ladder_rung_that_is_not_a_whole_number_is_named():
  with pytest.raises((TypeError, ValueError), match=r"batch_sizes\[1\]"):
    _engine(batch_sizes=(32, 64.5, 512))
  with pytest.raises(TypeError, match=r"batch_sizes\[1\]"):
    _engine(batch_sizes=(32, True, 512))


@pytest.mark.parametrize("base_steps", [2.5, "100", True])
def test_base_steps_that_is_not_a_whole_number_is_named_first(base_steps):
  with pytest.raises((TypeError, ValueError), match="base_steps"):
    _engine(base_steps=base_steps, warmup_steps=3)
  with pytest.raises((TypeError, ValueError), match="base_steps"):
    noise_lib.predicted_steps(100.0, base_batch_size=32, batch_size=512, base_steps=base_steps)


def test_batch_ladder_gives_ints_for_whole_floats_and_names_a_fraction():
  ladder = date.batch_ladder(16.0, 128)
  assert ladder == (16, 32, 64, 128) and all(type(b) is int for b in ladder)
  ladder = date.batch_ladder(np.int64(20), 96.0, multiple_of=np.int32(8))
  assert ladder == (24, 48, 96) and all(type(b) is int for b in ladder)
  for kwargs, name in [(dict(base_batch_size=16.5, max_batch_size=128), "base_batch_size"),
                       (dict(base_batch_size=16, max_batch_size=128.5), "max_batch_size"),
                       (dict(base_batch_size=16, max_batch_size=128, multiple_of=2.5),
                        "multiple_of")]:
    with pytest.raises(ValueError, match=name):
      date.batch_ladder(**kwargs)


def test_an_optimizer_factory_without_a_learning_rate_parameter_is_named():
  with pytest.raises(TypeError, match=r"make_optimizer must take the LR as `learning_rate`.*"
                                      r"its parameters are \('lr',\)"):
    _engine(make=lambda lr: optax.sgd(lr))
  for make in (optax.sgd, functools.partial(optax.adamw, weight_decay=0.1)):
    _engine(make=make).init(PARAMS)
