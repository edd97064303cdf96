"""LARS / LAMB transforms against docs/papers.md vectors, optax, and a NumPy reference."""

import numpy as np
import jax
import jax.numpy as jnp
import optax
import pytest

import dateopt
from dateopt import masks


def _tree(seed, scale=1.0, dtype=np.float32):
  """A small multi-layer tree: conv kernel, dense kernel, biases, a BN layer."""
  rng = np.random.default_rng(seed)
  shapes = {"conv": {"kernel": (3, 3, 2, 8)}, "bn": {"scale": (8,), "bias": (8,)},
            "dense": {"kernel": (8, 16), "bias": (16,)}, "head": {"kernel": (16, 4)}}
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(0, scale, s).astype(dtype)),
                      shapes, is_leaf=lambda x: isinstance(x, tuple))


def _grads_at(params, step):
  """Deterministic, parameter-dependent gradients (a quadratic pull plus noise)."""
  noise = _tree(1000 + step, 0.1)
  return jax.tree.map(lambda w, n: 0.5 * w + n, params, noise)


def _run(tx, params, steps):
  state = tx.init(params)
  update = jax.jit(tx.update)
  for t in range(steps):
    updates, state = update(_grads_at(params, t), state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def _assert_trees_close(a, b, atol=1e-6, rtol=0.0):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x, np.float64),
                                                       np.asarray(y, np.float64),
                                                       atol=atol, rtol=rtol), a, b)


# --- docs/papers.md test vectors (hand arithmetic) ------------------------------

W, G = {"w": jnp.array([3.0, 4.0])}, {"w": jnp.array([0.8, -0.6])}


@pytest.mark.parametrize("mode, ratio, update", [
    ("paper", 0.0033333, [-0.0036667, 0.00066667]),
    ("optax", 0.0044721, [-0.0049193, 0.00089443]),
])
def test_lars_reference_vector(mode, ratio, update):
  tx = dateopt.lars(1.0, weight_decay=0.1, mode=mode, mask=None)
  got, _ = tx.update(G, tx.init(W), W)
  np.testing.assert_allclose(got["w"], update, rtol=2e-5)
  lam = dateopt.transforms.lars_trust_ratios(G, W, weight_decay=0.1, mode=mode)["w"]
  np.testing.assert_allclose(lam, ratio, rtol=2e-5)


def test_lamb_reference_vector():
  w, g = {"w": jnp.array([3.0, 4.0])}, {"w": jnp.array([0.6, 0.8])}
  tx = dateopt.lamb(1.0, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=None)
  got, _ = tx.update(g, tx.init(w), w)
  np.testing.assert_allclose(got["w"], [-3.51841, -3.55257], rtol=2e-6)
  # trust = ‖w‖ / ‖r‖ = 3.41594 with r = g/(|g|+eps) + 0.01·w.
  r = np.array([0.6, 0.8]) / (np.array([0.6, 0.8]) + 1e-6) + 0.01 * np.array([3.0, 4.0])
  np.testing.assert_allclose(5.0 / np.linalg.norm(r), 3.41594, rtol=1e-5)


def test_lars_weight_decay_caps_local_lr():
  """λ <= η/β whatever the gradient (docs/papers.md §1)."""
  g = {"w": jnp.array([1e-9, 0.0])}
  lam = dateopt.transforms.lars_trust_ratios(g, W, weight_decay=0.1)["w"]
  assert float(lam) <= 0.001 / 0.1 + 1e-9
  np.testing.assert_allclose(lam, 0.001 * 5 / (1e-9 + 0.5), rtol=1e-5)


# --- Against optax's own implementations --------------------------------------

@pytest.mark.parametrize("nesterov", [False, True])
def test_optax_mode_matches_optax_lars(nesterov):
  schedule = optax.warmup_cosine_decay_schedule(0.0, 2.0, 10, 100)
  params = _tree(0)
  ours, _ = _run(dateopt.lars(schedule, momentum=0.9, weight_decay=1e-3, mode="optax",
                              mask=None, nesterov=nesterov), params, 100)
  theirs, _ = _run(optax.lars(schedule, weight_decay=1e-3, momentum=0.9, nesterov=nesterov),
                   params, 100)
  _assert_trees_close(ours, theirs, atol=1e-6)


def test_lamb_matches_optax_lamb():
  schedule = optax.linear_schedule(1e-2, 1e-3, 50)
  params = _tree(0)
  ours, _ = _run(dateopt.lamb(schedule, weight_decay=0.01, mask=None), params, 50)
  theirs, _ = _run(optax.lamb(schedule, weight_decay=0.01), params, 50)
  _assert_trees_close(ours, theirs, atol=1e-6)


# --- Against an independent NumPy implementation of docs/papers.md §1 ------------

def numpy_lars(params, steps, lr_fn, *, momentum, weight_decay, eta, eps, nesterov,
               selected, trust_clip=False, momentum_correction=False):
  """Plain float64 NumPy LARS, paper order, written from docs/papers.md §1."""
  w = {k: np.asarray(v, np.float64) for k, v in params.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  last_lr = 0.0
  for t in range(steps):
    lr = lr_fn(t)
    grads = {k: np.asarray(x, np.float64)
             for k, x in _flat(_grads_at(_unflat(w), t)).items()}
    for k in w:
      g = grads[k]
      if selected[k]:
        wn, gn = np.linalg.norm(w[k]), np.linalg.norm(g)
        lam = eta * wn / (gn + weight_decay * wn + eps) if wn > 0 and gn > 0 else 1.0
        if trust_clip:
          lam = min(lam / lr, 1.0) if lr > 0 else 1.0
        d = g + weight_decay * w[k]
      else:
        lam, d = 1.0, g
      c = lr / last_lr if (momentum_correction and last_lr > 0) else 1.0
      v[k] = momentum * c * v[k] + lr * lam * d
      w[k] = w[k] - (lr * lam * d + momentum * v[k] if nesterov else v[k])
    last_lr = lr
  return w


def _flat(tree):
  return {masks.path_to_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _unflat(flat):
  out = {}
  for k, x in flat.items():
    a, b = k.split("/")
    out.setdefault(a, {})[b] = jnp.asarray(x, jnp.float32)
  return out


@pytest.mark.parametrize("nesterov, trust_clip, momentum_correction", [
    (False, False, False), (True, False, False), (False, True, False), (False, False, True),
])
def test_paper_mode_matches_numpy(nesterov, trust_clip, momentum_correction):
  schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, 3.0, 10), optax.polynomial_schedule(3.0, 1e-4, 2, 40)],
      [10])
  params = _tree(0)
  kw = dict(momentum=0.9, weight_decay=5e-3, nesterov=nesterov)
  ours, _ = _run(dateopt.lars(schedule, trust_coefficient=0.02, trust_clip=trust_clip,
                              momentum_correction=momentum_correction, **kw), params, 50)
  selected = {k: (x.ndim > 1) for k, x in _flat(params).items()}
  expected = numpy_lars(_flat(params), 50, lambda t: float(schedule(t)), eta=0.02, eps=0.0,
                        selected=selected, trust_clip=trust_clip,
                        momentum_correction=momentum_correction, **kw)
  for k, x in _flat(ours).items():
    np.testing.assert_allclose(x, expected[k], atol=1e-6, rtol=1e-5, err_msg=k)
  # The default mask really did leave BN and biases out: they moved by plain momentum.
  assert selected["bn/scale"] is False and selected["conv/kernel"] is True


def test_momentum_buffer_is_the_last_update():
  """The buffer is kept as −v, so without Nesterov the update is the stored buffer."""
  params, lr = _tree(0), 0.3
  tx = dateopt.lars(lr, momentum=0.9, weight_decay=1e-3)
  state = tx.init(params)
  velocity = {k: np.zeros_like(x) for k, x in _flat(params).items()}
  for t in range(3):
    grads = _grads_at(params, t)
    updates, state = tx.update(grads, state, params)
    buffer = _flat(state[2].trace)
    for k, u in _flat(updates).items():
      np.testing.assert_array_equal(u, buffer[k], err_msg=k)
    # Independent check on a masked-out leaf (plain momentum): v ← 0.9 v + lr g.
    velocity["bn/bias"] = 0.9 * velocity["bn/bias"] + lr * np.asarray(grads["bn"]["bias"])
    np.testing.assert_allclose(buffer["bn/bias"], -velocity["bn/bias"], rtol=1e-6)
    params = optax.apply_updates(params, updates)


def test_masked_out_leaves_get_plain_momentum():
  params = _tree(0)
  grads = _grads_at(params, 0)
  tx = dateopt.lars(0.5, weight_decay=0.1)
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(updates["bn"]["bias"], -0.5 * grads["bn"]["bias"], rtol=1e-6)
  np.testing.assert_allclose(updates["dense"]["bias"], -0.5 * grads["dense"]["bias"], rtol=1e-6)
  assert not np.allclose(updates["dense"]["kernel"], -0.5 * grads["dense"]["kernel"])


# --- Edge cases: zero layers, low precision, compilation ----------------------

def test_zero_initialised_layer_gets_ratio_one():
  params = {"w": jnp.zeros((4, 4)), "v": jnp.ones((4, 4))}
  grads = {"w": jnp.full((4, 4), 0.25), "v": jnp.zeros((4, 4))}
  tx = dateopt.lars(0.1, weight_decay=1e-4, momentum=0.0, mask=None)
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(updates["w"], -0.1 * 0.25 * np.ones((4, 4)), rtol=1e-6)
  # Zero gradient and nonzero weights: ratio 1, so the decay term alone remains.
  np.testing.assert_allclose(updates["v"], -0.1 * 1e-4 * np.ones((4, 4)), rtol=1e-5)
  assert np.all(np.isfinite(updates["w"])) and np.all(np.isfinite(updates["v"]))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_params_accumulate_norms_in_float32(dtype):
  # 4096 entries of 64: the sum of squares (1.7e7) overflows float16 (max 65504).
  params = {"w": jnp.full((64, 64), 64.0, dtype)}
  grads = {"w": jnp.full((64, 64), 8.0, dtype)}
  lam = dateopt.transforms.lars_trust_ratios(grads, params)["w"]
  assert lam.dtype == jnp.float32
  np.testing.assert_allclose(lam, 0.001 * 64 / 8, rtol=1e-6)
  tx = dateopt.lars(1.0, mask=None)
  updates, state = jax.jit(tx.update)(grads, tx.init(params), params)
  assert updates["w"].dtype == dtype
  np.testing.assert_allclose(np.asarray(updates["w"], np.float32), -0.008 * 8, rtol=1e-2)


def test_no_recompilation_on_second_step():
  traces = []
  tx = dateopt.lars(optax.linear_schedule(0.0, 1.0, 10), weight_decay=1e-4,
                    momentum_correction=True, trust_clip=True)

  @jax.jit
  def step(params, state):
    traces.append(1)
    updates, state = tx.update(_grads_at(params, 0), state, params)
    return optax.apply_updates(params, updates), state

  params = _tree(0)
  state = tx.init(params)
  for _ in range(3):
    params, state = step(params, state)
  assert len(traces) == 1


def test_masks_survive_inject_hyperparams():
  params = _tree(0)
  grads = _grads_at(params, 0)
  injected = optax.inject_hyperparams(dateopt.lars)(learning_rate=0.5, weight_decay=0.1)
  explicit = optax.inject_hyperparams(dateopt.lars)(
      learning_rate=0.5, weight_decay=0.1, mask=masks.regex(r"kernel$"))
  plain = dateopt.lars(0.5, weight_decay=0.1)
  expected, _ = plain.update(grads, plain.init(params), params)
  for tx in (injected, explicit):
    state = tx.init(params)
    got, state = jax.jit(tx.update)(grads, state, params)
    _assert_trees_close(got, expected, atol=1e-7)
  # The learning rate is a live hyper-parameter there: change it and the step follows
  # (second step: v = 0.9 * 0.5 g + 0.25 g on the plain-momentum bias).
  state.hyperparams["learning_rate"] = jnp.asarray(0.25)
  second, _ = tx.update(grads, state, params)
  np.testing.assert_allclose(second["bn"]["bias"], -(0.9 * 0.5 + 0.25) * grads["bn"]["bias"],
                             rtol=1e-6)


# --- Composition with optax wrappers and Flax --------------------------------

def test_composes_with_chain_and_masked():
  params = _tree(0)
  grads = _grads_at(params, 0)
  only_dense = {k: jax.tree.map(lambda _: k == "dense", v) for k, v in params.items()}
  tx = optax.chain(optax.clip_by_global_norm(10.0),
                   optax.masked(dateopt.lars(0.1, weight_decay=1e-4), only_dense))
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  np.testing.assert_allclose(updates["head"]["kernel"], grads["head"]["kernel"])
  assert not np.allclose(updates["dense"]["kernel"], grads["dense"]["kernel"])


def test_multisteps_accumulates_then_applies_lars_once():
  params = _tree(0)
  g1, g2 = _grads_at(params, 0), _grads_at(params, 1)
  inner = dateopt.lars(0.1, weight_decay=1e-4)
  tx = optax.MultiSteps(inner, every_k_schedule=2)
  state = tx.init(params)
  u1, state = tx.update(g1, state, params)
  u2, state = tx.update(g2, state, params)
  _assert_trees_close(u1, jax.tree.map(jnp.zeros_like, params), atol=0)
  mean = jax.tree.map(lambda a, b: (a + b) / 2, g1, g2)
  expected, _ = inner.update(mean, inner.init(params), params)
  _assert_trees_close(u2, expected, atol=1e-7)


def test_apply_if_finite_skips_nan_step():
  params = _tree(0)
  tx = optax.apply_if_finite(dateopt.lars(0.1, weight_decay=1e-4), max_consecutive_errors=5)
  state = tx.init(params)
  bad = jax.tree.map(lambda g: g.at[..., 0].set(jnp.nan), _grads_at(params, 0))
  updates, state = tx.update(bad, state, params)
  assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(updates))
  assert int(state.notfinite_count) == 1
  updates, state = tx.update(_grads_at(params, 0), state, params)
  assert int(state.notfinite_count) == 0
  assert float(jnp.abs(updates["conv"]["kernel"]).max()) > 0


def test_flax_train_state_and_nnx_optimizer():
  from flax import linen as nn, nnx
  from flax.training import train_state

  class Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(3)(nn.relu(nn.LayerNorm()(nn.Dense(8)(x))))

  x = jnp.ones((4, 5))
  model = Linen()
  params = model.init(jax.random.key(0), x)["params"]
  tx = dateopt.lars(0.1, weight_decay=1e-4)
  state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
  loss = lambda p: jnp.sum(model.apply({"params": p}, x) ** 2)
  grads = jax.grad(loss)(params)
  new_state = jax.jit(lambda s, g: s.apply_gradients(grads=g))(state, grads)
  updates, _ = tx.update(grads, tx.init(params), params)
  _assert_trees_close(new_state.params, optax.apply_updates(params, updates), atol=1e-7)

  class NNX(nnx.Module):
    def __init__(self, rngs):
      self.dense = nnx.Linear(5, 8, rngs=rngs)
      self.norm = nnx.LayerNorm(8, rngs=rngs)
      self.head = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
      return self.head(nnx.relu(self.norm(self.dense(x))))

  net = NNX(nnx.Rngs(0))
  before = jax.tree.map(jnp.copy, nnx.state(net, nnx.Param))  # a snapshot, not live refs
  optimizer = nnx.Optimizer(net, dateopt.lars(0.1, weight_decay=1e-4), wrt=nnx.Param)
  grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(net)
  expected_updates, _ = tx.update(grads, tx.init(before), before)
  expected = optax.apply_updates(before, expected_updates)
  optimizer.update(net, grads)
  _assert_trees_close(nnx.state(net, nnx.Param), expected, atol=1e-7)
  # The norm layer's scale was not trust-scaled: it moved by exactly -lr * grad.
  np.testing.assert_allclose(net.norm.scale[...] - before["norm"]["scale"][...],
                             -0.1 * grads["norm"]["scale"][...], rtol=1e-5, atol=1e-7)


# --- Bad arguments ------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(learning_rate=-0.1), "learning_rate"),
    (dict(learning_rate=0.1, momentum=1.0), "momentum"),
    (dict(learning_rate=0.1, momentum=-0.1), "momentum"),
    (dict(learning_rate=0.1, trust_coefficient=0.0), "trust_coefficient"),
    (dict(learning_rate=0.1, weight_decay=-1.0), "weight_decay"),
    (dict(learning_rate=0.1, mode="fancy"), "mode"),
    (dict(learning_rate=0.1, eps=-1.0), "eps"),
])
def test_lars_bad_arguments_name_the_field(kwargs, field):
  with pytest.raises(ValueError, match=field):
    dateopt.lars(**kwargs)


@pytest.mark.parametrize("kwargs, field", [
    (dict(learning_rate=-1.0), "learning_rate"),
    (dict(learning_rate=1e-3, b1=1.0), "b1"),
    (dict(learning_rate=1e-3, trust_bounds=(2.0, 1.0)), "trust_bounds"),
    (dict(learning_rate=1e-3, max_grad_norm=0.0), "max_grad_norm"),
])
def test_lamb_bad_arguments_name_the_field(kwargs, field):
  with pytest.raises(ValueError, match=field):
    dateopt.lamb(**kwargs)


def test_mask_not_matching_params_fails_at_init():
  params = _tree(0)
  bad_mask = {"conv": {"kernel": True}}
  with pytest.raises(ValueError, match="mask"):
    dateopt.lars(0.1, mask=bad_mask).init(params)
  with pytest.raises(ValueError, match="mask"):
    dateopt.lamb(0.1, mask=bad_mask).init(params)


def test_update_without_params_is_a_clear_error():
  params = _tree(0)
  tx = dateopt.lars(0.1)
  with pytest.raises(ValueError, match="params"):
    tx.update(params, tx.init(params))


def test_lamb_trust_bounds_clip_the_weight_norm():
  w, g = {"w": jnp.array([3.0, 4.0])}, {"w": jnp.array([0.6, 0.8])}
  tx = dateopt.lamb(1.0, mask=None, trust_bounds=(0.0, 2.0))
  got, _ = tx.update(g, tx.init(w), w)
  r = np.array([0.6, 0.8]) / (np.array([0.6, 0.8]) + 1e-6)
  np.testing.assert_allclose(got["w"], -2.0 / np.linalg.norm(r) * r, rtol=1e-5)


def test_lamb_without_bias_correction_and_clipping():
  w, g = {"w": jnp.array([3.0, 4.0])}, {"w": jnp.array([6.0, 8.0])}
  tx = dateopt.lamb(1.0, mask=None, bias_correction=False, max_grad_norm=1.0, eps=0.0)
  got, _ = tx.update(g, tx.init(w), w)
  # clipped g = [0.6, 0.8]; m = 0.1 g, v = 0.001 g², r = m/√v = (0.1/√0.001)·sign(g).
  r = 0.1 / np.sqrt(0.001) * np.ones(2)
  np.testing.assert_allclose(got["w"], -5.0 / np.linalg.norm(r) * r, rtol=1e-5)


def test_wrong_types_and_non_finite_hyper_parameters_are_refused_at_construction():
  with pytest.raises(TypeError, match="learning_rate must be a number"):
    dateopt.lars("0.1")
  with pytest.raises(ValueError, match="learning_rate must be finite"):
    dateopt.lars(float("inf"))
  with pytest.raises(TypeError, match="weight_decay"):
    dateopt.lamb(1e-3, weight_decay="0.01")
  dateopt.lars(optax.constant_schedule(0.1))  # a schedule is not checked here


@pytest.mark.parametrize("module", ["dateopt.transforms", "dateopt.schedules", "dateopt.masks",
                                    "dateopt.epochs", "dateopt.date._divergence",
                                    "dateopt.date._guard", "dateopt.metrics_io",
                                    "dateopt.models.transformer"])
def test_docstring_examples_of_the_optax_level_modules(module):
  import doctest  # pylint: disable=import-outside-toplevel
  import importlib  # pylint: disable=import-outside-toplevel
  result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0
