"""The divergence guard: hands off healthy runs; skips, backs off and recovers on bad ones."""

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sklearn.datasets import load_digits

from dateopt.date import _guard as guard_lib
from dateopt.date._guard import DivergenceGuardState, divergence_guard

# ---- healthy runs: a tiny MLP on scikit-learn's digits ------------------------------


@functools.cache
def _digits():
  x, y = load_digits(return_X_y=True)
  return (x / 16.0).astype(np.float32), y.astype(np.int32)


def _mlp_loss(params, x, y):
  hidden = jnp.tanh(x @ params["w1"] + params["b1"])
  logits = hidden @ params["w2"] + params["b2"]
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _train_digits(tx, batch_size, steps):
  """Trains the MLP from a fixed init on fixed batches; returns (params, state, losses)."""
  x, y = _digits()
  rng = np.random.default_rng(0)
  order = np.concatenate([rng.permutation(len(x)) for _ in range(steps * batch_size // len(x) + 1)])
  batches = order[:steps * batch_size].reshape(steps, batch_size)
  k1, k2 = jax.random.split(jax.random.key(0))
  params = {"w1": jax.random.normal(k1, (64, 32)) / 8.0, "b1": jnp.zeros(32),
            "w2": jax.random.normal(k2, (32, 10)) / np.sqrt(32), "b2": jnp.zeros(10)}

  def body(carry, batch):
    params, state = carry
    loss, grads = jax.value_and_grad(_mlp_loss)(params, *batch)
    updates, state = tx.update(grads, state, params, value=loss)
    return (optax.apply_updates(params, updates), state), loss

  run = jax.jit(lambda carry, xs: jax.lax.scan(body, carry, xs))
  (params, state), losses = run((params, tx.init(params)), (x[batches], y[batches]))
  return params, state, np.asarray(losses)


# Warmup then cosine decay, as every recipe `date.build` makes.
_OPTIMIZERS = {
    "sgd_momentum": lambda steps: optax.sgd(
        optax.warmup_cosine_decay_schedule(0.0, 0.1, steps // 10, steps), momentum=0.9),
    "adam": lambda steps: optax.adam(
        optax.warmup_cosine_decay_schedule(0.0, 1e-2, steps // 10, steps)),
}


@pytest.mark.xla_defaults  # a user's run, two programs bit for bit
@pytest.mark.parametrize("optimizer", sorted(_OPTIMIZERS))
@pytest.mark.parametrize("batch_size,steps", [(16, 300), (512, 100)])
def test_a_healthy_run_trains_bit_identically_with_the_guard(optimizer, batch_size, steps):
  make = _OPTIMIZERS[optimizer]
  plain, _, plain_losses = _train_digits(optax.with_extra_args_support(make(steps)),
                                         batch_size, steps)
  guarded, state, losses = _train_digits(divergence_guard(make(steps)), batch_size, steps)
  assert losses[-10:].mean() < 0.5 * losses[0]  # a real run: it learns
  jax.tree.map(np.testing.assert_array_equal, guarded, plain)
  np.testing.assert_array_equal(losses, plain_losses)
  assert (int(state.num_skipped), int(state.num_spikes), int(state.num_nonfinite)) == (0, 0, 0)
  assert int(state.num_accepted) == steps and float(state.lr_multiplier) == 1.0


# ---- a ten times too high learning rate ----------------------------------------------


def _ill_conditioned_regression(num_examples=1024, dim=10):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(num_examples, dim)) * np.linspace(0.3, 3.0, dim)  # curvature up to ~9
  y = x @ rng.normal(size=dim) + 0.1 * rng.normal(size=num_examples)
  return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)


def _train_regression(make_tx, learning_rate, steps=400, batch_size=256):
  """SGD-momentum on mini-batches, warmup then cosine; returns (final, first loss, state)."""
  x, y = _ill_conditioned_regression()
  loss_fn = lambda w, xb, yb: 0.5 * jnp.mean((xb @ w - yb) ** 2)
  shape = optax.warmup_cosine_decay_schedule(0.0, 1.0, steps // 10, steps)
  tx = make_tx(optax.sgd(lambda count: learning_rate * shape(count), momentum=0.9))
  batches = jax.random.randint(jax.random.key(0), (steps, batch_size), 0, x.shape[0])

  def body(carry, rows):
    w, state = carry
    loss, grads = jax.value_and_grad(loss_fn)(w, x[rows], y[rows])
    updates, state = tx.update(grads, state, w, value=loss)
    return (optax.apply_updates(w, updates), state), None

  w = jnp.zeros(x.shape[1])
  (w, state), _ = jax.lax.scan(body, (w, tx.init(w)), batches)
  return loss_fn(w, x, y), loss_fn(jnp.zeros(x.shape[1]), x, y), state


def test_the_guard_rescues_a_run_with_a_ten_times_too_high_learning_rate():
  tuned_and_10x = jnp.array([0.1, 1.0])
  plain = jax.jit(jax.vmap(lambda lr: _train_regression(optax.with_extra_args_support, lr)))
  final, first, _ = plain(tuned_and_10x)
  assert float(final[0]) < 1e-3 * float(first[0])  # the tuned LR learns
  assert not np.isfinite(float(final[1]))  # 10x too high: blows up
  guarded = jax.jit(jax.vmap(lambda lr: _train_regression(divergence_guard, lr)))
  final, first, state = guarded(tuned_and_10x)
  assert np.isfinite(float(final[1])) and float(final[1]) < 1e-3 * float(first[1])
  assert int(state.num_spikes[1]) > 0  # it backed off
  assert int(state.num_skipped[0]) == 0  # and left the tuned run alone
  assert float(final[0]) < 1e-3 * float(first[0])


# ---- non-finite steps -----------------------------------------------------------------


def test_non_finite_gradients_and_losses_are_skipped_then_the_multiplier_recovers():
  tx = divergence_guard(optax.sgd(0.1, momentum=0.9), backoff=0.5, recovery_steps=10)
  step = jax.jit(tx.update)
  params, grads = {"w": jnp.ones(2)}, {"w": jnp.array([1.0, -2.0])}
  state = tx.init(params)
  for loss in [1.0, 1.1, 0.9]:
    _, state = step(grads, state, params, value=jnp.float32(loss))
  bad_steps = [({"w": jnp.array([jnp.nan, 1.0])}, 1.0),  # NaN gradient
               (grads, jnp.nan),  # NaN loss
               ({"w": jnp.array([jnp.inf, 1.0])}, 1.0),  # inf gradient
               (grads, jnp.inf)]  # inf loss
  for i, (bad_grads, loss) in enumerate(bad_steps, start=1):
    before = state
    updates, state = step(bad_grads, state, params, value=jnp.float32(loss))
    np.testing.assert_array_equal(updates["w"], [0.0, 0.0])
    jax.tree.map(np.testing.assert_array_equal, state.inner_state, before.inner_state)
    assert float(state.loss.mean) == float(before.loss.mean)  # not averaged in
    assert int(state.num_nonfinite) == i and int(state.num_skipped) == i
    assert float(state.lr_multiplier) == 0.5 ** i
  assert int(state.num_accepted) == 3
  plain = optax.sgd(0.1, momentum=0.9)
  plain_state = before.inner_state  # skipped steps kept it: plain SGD's after 3 steps
  multiplier, multipliers = float(state.lr_multiplier), []
  for _ in range(45):  # accepted: the plain update times the multiplier held before
    updates, state = step(grads, state, params, value=jnp.float32(1.0))
    expected, plain_state = plain.update(grads, plain_state, params)
    np.testing.assert_allclose(updates["w"], multiplier * expected["w"], rtol=1e-6)
    multiplier = float(state.lr_multiplier)
    multipliers.append(multiplier)
  # Each accepted step multiplies by 2^(1/10): four back-offs undone after 40 steps.
  np.testing.assert_allclose(multipliers[:40], 0.5 ** 4 * 2 ** (np.arange(1, 41) / 10),
                             rtol=1e-5)
  assert multipliers[-1] == 1.0


def test_without_a_loss_only_non_finite_steps_are_caught():
  tx = divergence_guard(optax.sgd(1.0))
  params = {"w": jnp.zeros(2)}
  state = tx.init(params)
  for _ in range(30):
    updates, state = tx.update({"w": jnp.full(2, 1e6)}, state, params)  # huge but finite
  np.testing.assert_array_equal(updates["w"], [-1e6, -1e6])
  updates, state = tx.update({"w": jnp.array([jnp.nan, 0.0])}, state, params)
  np.testing.assert_array_equal(updates["w"], [0.0, 0.0])
  assert (int(state.num_nonfinite), int(state.num_spikes), int(state.loss.count)) == (1, 0, 0)


# ---- loss spikes ----------------------------------------------------------------------


def _run_losses(losses, **kwargs):
  """Feeds `losses` with a constant gradient; returns (applied updates, states)."""
  tx = divergence_guard(optax.sgd(1.0), **kwargs)
  step = jax.jit(tx.update)
  params, grads = {"w": jnp.zeros(1)}, {"w": jnp.ones(1)}
  state, applied, states = tx.init(params), [], []
  for loss in losses:
    updates, state = step(grads, state, params, value=jnp.float32(loss))
    applied.append(-float(updates["w"][0]))
    states.append(state)
  return np.array(applied), states


def _noise(n, level, seed=0):
  return level * (1.0 + 0.05 * np.random.default_rng(seed).normal(size=n))


def test_isolated_spikes_never_back_the_learning_rate_off():
  losses = _noise(200, 1.0)
  losses[50::20] = 50.0  # a single spike every 20 steps
  losses[61:61 + 2] = 50.0  # and patience - 1 = 2 in a row
  applied, states = _run_losses(losses, patience=3)
  np.testing.assert_array_equal(applied, np.ones(200))  # every update as without the guard
  assert int(states[-1].num_skipped) == 0 and float(states[-1].lr_multiplier) == 1.0
  assert float(states[-1].loss.mean) == pytest.approx(1.0, abs=0.05)  # spikes left out


def test_a_persistent_loss_jump_backs_off_once_then_rebases_and_training_continues():
  losses = np.concatenate([_noise(40, 1.0), _noise(100, 5.0, seed=1)])
  applied, states = _run_losses(losses, patience=3, backoff=0.5, recovery_steps=50)
  np.testing.assert_array_equal(applied[:42], 1.0)  # two spikes in a row: still accepted
  assert applied[42] == 0.0  # the third: skipped, LR backed off, statistics re-based
  assert int(states[42].num_spikes) == 1 and float(states[42].lr_multiplier) == 0.5
  assert float(states[42].ref_mean) == pytest.approx(losses[42])
  # The new level is not a spike: training goes on, the multiplier recovers.
  growth = 2 ** (1 / 50)
  np.testing.assert_allclose(applied[43:], np.minimum(0.5 * growth ** np.arange(97), 1.0),
                             rtol=1e-5)
  assert int(states[-1].num_skipped) == 1 and int(states[-1].num_accepted) == 139
  assert float(states[-1].loss.mean) == pytest.approx(5.0, rel=0.05)


def test_a_spike_that_keeps_growing_keeps_backing_off():
  losses = np.concatenate([_noise(30, 1.0), 10.0 * 3.0 ** np.arange(12)])
  _, states = _run_losses(losses, patience=2)
  assert int(states[-1].num_spikes) >= 2
  assert float(states[-1].lr_multiplier) <= 0.25


# ---- composition, state, arguments ----------------------------------------------------


def _needs_scale():
  """An inner transformation that needs an extra argument: updates × scale."""
  def update_fn(updates, state, params=None, *, scale, **extra_args):
    del params, extra_args
    return jax.tree.map(lambda u: u * scale, updates), state
  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


def test_works_inside_a_chain_under_jit_and_passes_extra_arguments_through():
  tx = optax.chain(optax.clip_by_global_norm(10.0), divergence_guard(_needs_scale()))
  params = {"w": jnp.zeros(3)}
  step = jax.jit(lambda g, s, loss: tx.update(g, s, params, value=loss, scale=2.0))
  state = tx.init(params)
  updates, state = step({"w": jnp.ones(3)}, state, jnp.float32(1.0))
  np.testing.assert_array_equal(updates["w"], [2.0, 2.0, 2.0])
  updates, state = step({"w": jnp.array([1.0, jnp.nan, 1.0])}, state, jnp.float32(1.0))
  np.testing.assert_array_equal(updates["w"], [0.0, 0.0, 0.0])
  guard_state = state[1]
  assert isinstance(guard_state, DivergenceGuardState)
  assert int(guard_state.num_nonfinite) == 1 and int(guard_state.num_accepted) == 1


def test_num_skipped_is_derived_not_stored():
  assert "num_skipped" not in DivergenceGuardState._fields
  state = divergence_guard(optax.sgd(0.1)).init({"w": jnp.zeros(2)})
  state = state._replace(num_nonfinite=jnp.int32(2), num_spikes=jnp.int32(3))
  assert int(state.num_skipped) == 5


@pytest.mark.parametrize("kwargs,error,name", [
    (dict(spike_threshold="2"), TypeError, "spike_threshold"),
    (dict(spike_threshold=None), TypeError, "spike_threshold"),
    (dict(spike_threshold=True), TypeError, "spike_threshold"),
    (dict(spike_threshold=0.0), ValueError, "spike_threshold"),
    (dict(spike_min_excess=-0.1), ValueError, "spike_min_excess"),
    (dict(patience=2.5), TypeError, "patience"),
    (dict(patience=0), ValueError, "patience"),
    (dict(loss_decay=1.0), ValueError, "loss_decay"),
    (dict(loss_decay="0.9"), TypeError, "loss_decay"),
    (dict(min_steps=1), ValueError, "min_steps"),
    (dict(min_steps=None), TypeError, "min_steps"),
    (dict(backoff=1.0), ValueError, "backoff"),
    (dict(backoff=[0.5]), TypeError, "backoff"),
    (dict(recovery_steps=0), ValueError, "recovery_steps"),
    (dict(min_multiplier=0.0), ValueError, "min_multiplier"),
    (dict(min_multiplier=float("nan")), ValueError, "min_multiplier"),
])
def test_bad_arguments_raise_naming_the_argument(kwargs, error, name):
  with pytest.raises(error, match=name):
    divergence_guard(optax.sgd(0.1), **kwargs)


def test_an_inner_that_is_not_a_transformation_raises():
  with pytest.raises(TypeError, match="inner"):
    divergence_guard("sgd")


def test_a_non_scalar_loss_raises_at_trace_time():
  tx = divergence_guard(optax.sgd(0.1))
  params = {"w": jnp.zeros(3)}
  state = tx.init(params)
  with pytest.raises(ValueError, match=r"value=.*scalar.*\(3,\)"):
    tx.update(params, state, params, value=jnp.ones(3))
  with pytest.raises(ValueError, match="value="):
    jax.jit(lambda loss: tx.update(params, state, params, value=loss))(jnp.ones((2, 1)))


def test_docstring_examples():
  result = doctest.testmod(guard_lib, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0
