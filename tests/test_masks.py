"""Parameter masks on Linen and NNX trees."""

import jax
import jax.numpy as jnp
import optax
import pytest

import dateopt
from dateopt import masks
from import_isolation import assert_not_loaded  # tests/import_isolation.py


def _linen_params():
  from flax import linen as nn

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
      x = nn.Conv(4, (3, 3), use_bias=False)(x)
      x = nn.BatchNorm(use_running_average=not train)(x)
      x = nn.Dense(3)(x.reshape(x.shape[0], -1))
      return nn.LayerNorm()(x)

  return Net().init(jax.random.key(0), jnp.ones((1, 4, 4, 2)))["params"]


def _flat(tree):
  return {masks.path_to_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_exclude_bias_and_norm_on_linen():
  got = _flat(masks.resolve(masks.exclude_bias_and_norm, _linen_params()))
  assert got == {"BatchNorm_0/bias": False, "BatchNorm_0/scale": False,
                 "Conv_0/kernel": True, "Dense_0/bias": False, "Dense_0/kernel": True,
                 "LayerNorm_0/bias": False, "LayerNorm_0/scale": False}


def test_exclude_bias_and_norm_on_nnx_state():
  from flax import nnx
  net = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.BatchNorm(4, rngs=nnx.Rngs(0)))
  got = _flat(masks.resolve(masks.exclude_bias_and_norm, nnx.state(net, nnx.Param)))
  assert got == {"layers/0/bias": False, "layers/0/kernel": True,
                 "layers/1/bias": False, "layers/1/scale": False}


def test_regex_ndim_names_and_combinators():
  params = _linen_params()
  assert _flat(masks.resolve(r"kernel$", params))["Dense_0/kernel"] is True
  assert _flat(masks.resolve(r"kernel$", params))["Dense_0/bias"] is False
  only_conv = masks.regex("^Conv") & masks.min_ndim(2)
  assert [k for k, v in _flat(masks.resolve(only_conv, params)).items() if v] == ["Conv_0/kernel"]
  inverted = _flat(masks.resolve(~masks.exclude_bias_and_norm, params))
  assert inverted["Dense_0/bias"] is True and inverted["Dense_0/kernel"] is False
  assert masks.from_name("exclude_bias_and_norm") is masks.exclude_bias_and_norm
  assert masks.from_name("Dense") == masks.regex("Dense")
  either = masks.regex("^Conv") | "LayerNorm"
  assert sum(_flat(masks.resolve(either, params)).values()) == 3


def test_masks_are_static_hashable_and_not_callable():
  # optax.inject_hyperparams treats callables as schedules: masks must not be callable.
  for m in (masks.exclude_bias_and_norm, masks.regex("a"), masks.min_ndim(2),
            masks.regex("a") & masks.min_ndim(1)):
    assert not callable(m)
    assert hash(m) == hash(type(m)(*m.__dict__.values()))


def test_resolve_accepts_callables_trees_and_none():
  params = {"a": jnp.ones((2, 2)), "b": jnp.ones(2)}
  assert masks.resolve(None, params) == {"a": True, "b": True}
  assert masks.resolve(False, params) == {"a": False, "b": False}
  assert masks.resolve(lambda p: {"a": True, "b": False}, params) == {"a": True, "b": False}
  assert masks.resolve({"a": False, "b": True}, params) == {"a": False, "b": True}


def test_bad_masks_raise_naming_the_mask():
  params = {"a": jnp.ones((2, 2)), "b": jnp.ones(2)}
  with pytest.raises(ValueError, match="mask"):
    masks.resolve({"a": True}, params)
  with pytest.raises(ValueError, match="regex"):
    masks.regex("(")
  with pytest.raises(ValueError, match="mask"):
    dateopt.lars(0.1, mask=3)


def test_masks_apply_under_jit_in_a_chain():
  params = _linen_params()
  grads = jax.tree.map(jnp.ones_like, params)
  tx = optax.chain(dateopt.scale_by_lars_trust_ratio(weight_decay=0.1, mask="kernel$"),
                   optax.scale(-1.0))
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  assert jnp.allclose(updates["Dense_0"]["bias"], -1.0)
  assert not jnp.allclose(updates["Dense_0"]["kernel"], -1.0)


def test_import_dateopt_does_not_load_flax_tfds_or_grain():
  assert_not_loaded("import dateopt; dateopt.lars, dateopt.schedules, dateopt.date.plan",
                    ("flax", "tensorflow_datasets", "grain", "tensorflow"))


def test_a_misspelt_mask_name_is_refused_with_the_names():
  with pytest.raises(ValueError, match="did you mean 'exclude_bias_and_norm'.*kernels"):
    masks.from_name("exclude_bias_and_nrom")
  with pytest.raises(ValueError, match="unknown mask name"):
    dateopt.lars(0.1, weight_decay=1e-4, mask="exclude_bias_and_nrom")
  # Regex syntax, or a word far from every name, stays a regex.
  assert isinstance(masks.from_name(r"kernel$"), masks.Mask)
  assert isinstance(masks.from_name("conv"), masks.Mask)
