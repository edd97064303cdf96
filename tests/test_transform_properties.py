"""Properties every dateopt transform and wrapper keeps, checked over all of them at once.

Like optax's `contrib/_common_test.py`: `init`/`update` under `jax.jit` give
what they give eagerly; the updates keep the parameters' dtypes and, on a
mesh of 8 devices, their shardings; the LR can be injected with
`optax.inject_hyperparams`; and a zero gradient at LR 0 moves nothing.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import dateopt
from dateopt import date


def _recipe_tx(optimizer: str, **options):
  """DATE's whole optimizer (schedule, mask, family) for a 10-step recipe of `optimizer`."""
  def make(lr, weight_decay=1e-4):
    recipe = date.Recipe(batch_size=8, num_examples=80, num_epochs=1, learning_rate=lr,
                         optimizer=optimizer, weight_decay=weight_decay, warmup_epochs=0.0,
                         decay="constant", **options)
    return date.build(recipe)[0]
  return make


# name -> learning_rate -> transformation. The wrappers wrap SGD with momentum.
TRANSFORMS = {
    "lars_paper": lambda lr: dateopt.lars(lr, weight_decay=1e-3, nesterov=True),
    "lars_optax": lambda lr: dateopt.lars(lr, weight_decay=1e-3, mode="optax", trust_clip=True),
    "lars_momentum_correction": lambda lr: dateopt.lars(lr, momentum_correction=True),
    "lamb": lambda lr: dateopt.lamb(lr, weight_decay=1e-2, max_grad_norm=1.0),
    "lars_trust_ratio_in_a_chain": lambda lr: optax.chain(
        dateopt.scale_by_lars_trust_ratio(weight_decay=1e-3), optax.scale_by_learning_rate(lr)),
    "lamb_trust_ratio_in_a_chain": lambda lr: optax.chain(
        optax.scale_by_adam(), dateopt.scale_by_lamb_trust_ratio(),
        optax.scale_by_learning_rate(lr)),
    "momentum_paper_order": lambda lr: optax.chain(optax.scale(lr),
                                                   dateopt.scale_by_momentum(0.9)),
    "divergence_guard": lambda lr: date.divergence_guard(optax.sgd(lr, momentum=0.9)),
    "track_statistics": lambda lr: date.track_statistics(optax.sgd(lr, momentum=0.9)),
    "measure_noise_scale": lambda lr: date.measure_noise_scale(optax.sgd(lr, momentum=0.9)),
    "date_build_lars": _recipe_tx("lars"),
    "date_build_lamb": _recipe_tx("lamb"),
    "date_build_nesterov": _recipe_tx("nesterov"),
}


def _params(dtype=jnp.float32):
  # Every leading dimension divides 8: each leaf can be sharded on it.
  rng = np.random.default_rng(0)
  shapes = {"Dense_0": {"kernel": (8, 4), "bias": (8,)},
            "BatchNorm_0": {"scale": (8,), "bias": (8,)}}
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s), dtype), shapes,
                      is_leaf=lambda x: isinstance(x, tuple))


def _grads(params, scale=0.1):
  return jax.tree.map(lambda p: (scale * jnp.cos(p.astype(jnp.float32))).astype(p.dtype), params)


def _two_steps(tx, params, grads):
  state = tx.init(params)
  for _ in range(2):
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return updates, params


@pytest.mark.parametrize("name", TRANSFORMS)
def test_jit_gives_what_eager_gives(name):
  tx = TRANSFORMS[name](0.1)
  params = _params()
  eager = _two_steps(tx, params, _grads(params))
  jitted = jax.jit(functools.partial(_two_steps, tx))(params, _grads(params))
  chex.assert_trees_all_close(jitted, eager, rtol=1e-5, atol=1e-6)
  chex.assert_tree_all_finite(jitted)


@pytest.mark.parametrize("name", TRANSFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_updates_keep_the_parameters_dtypes(name, dtype):
  tx = TRANSFORMS[name](0.1)
  params = _params(dtype)
  updates, new_params = jax.jit(functools.partial(_two_steps, tx))(params, _grads(params))
  chex.assert_trees_all_equal_dtypes(updates, params)
  chex.assert_trees_all_equal_dtypes(new_params, params)
  chex.assert_tree_all_finite(updates)


@pytest.mark.parametrize("name", TRANSFORMS)
def test_updates_keep_the_parameters_shardings(name, mesh8):
  mesh = mesh8
  layout = {"Dense_0": {"kernel": P("data"), "bias": P()},
            "BatchNorm_0": {"scale": P("data"), "bias": P()}}
  shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), layout,
                           is_leaf=lambda x: isinstance(x, P))
  params = jax.device_put(_params(), shardings)
  tx = TRANSFORMS[name](0.1)
  updates, _ = jax.jit(functools.partial(_two_steps, tx))(params, _grads(params))
  for update, param in zip(jax.tree.leaves(updates), jax.tree.leaves(params)):
    assert update.sharding.is_equivalent_to(param.sharding, update.ndim), name
  single = _two_steps(tx, _params(), _grads(_params()))[0]  # and the same numbers as 1 device
  chex.assert_trees_all_close(jax.device_get(updates), single, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", [n for n in TRANSFORMS if not n.startswith("date_build")])
def test_the_learning_rate_can_be_injected(name):
  injected = optax.inject_hyperparams(TRANSFORMS[name])(lr=0.1)
  params = _params()
  state = injected.init(params)
  assert float(state.hyperparams["lr"]) == pytest.approx(0.1)
  chex.assert_trees_all_close(_two_steps(injected, params, _grads(params)),
                              _two_steps(TRANSFORMS[name](0.1), params, _grads(params)),
                              rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", [n for n in TRANSFORMS if n.startswith("date_build")])
def test_date_build_injects_its_own_schedule(name):
  """`date.build` fixes the LR from its recipe's schedule and injects it itself: the
  state holds the LR each step applied (the trainer logs it from there)."""
  tx = TRANSFORMS[name](0.1)
  params = _params()
  state = tx.init(params)
  _, state = tx.update(_grads(params), state, params)
  injected = [s for s in jax.tree.leaves(state, is_leaf=lambda x: hasattr(x, "hyperparams"))
              if hasattr(s, "hyperparams")]
  assert [float(s.hyperparams["learning_rate"]) for s in injected] == [pytest.approx(0.1)]


@pytest.mark.parametrize("name", TRANSFORMS)
def test_a_zero_gradient_at_learning_rate_zero_moves_nothing(name):
  # A recipe's LR must be positive: DATE's optimizer gets a zero gradient and no weight decay.
  tx = (TRANSFORMS[name](0.1, weight_decay=0.0) if name.startswith("date_build")
        else TRANSFORMS[name](0.0))
  params = _params()
  updates, new_params = _two_steps(tx, params, _grads(params, scale=0.0))
  chex.assert_trees_all_equal(updates, jax.tree.map(jnp.zeros_like, params))
  chex.assert_trees_all_equal(new_params, params)
