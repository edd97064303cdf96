"""DATE with Flax nnx: the readers of the engine's state take an `nnx.Optimizer` or its opt_state.

References: the same loop on plain optax state (same initial parameters, same data), whose
readers the nnx ones must match step for step, and `date.as_optax_state`'s plain pytree.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dateopt import date
from dateopt.date import _builder as builder_lib

from import_isolation import assert_not_loaded  # tests/import_isolation.py

nnx = pytest.importorskip("flax.nnx")  # flax comes with the `train` extra

T0 = 24  # the baseline's steps
LADDER = date.batch_ladder(8, 64)

rng = np.random.default_rng(0)
FEATURES = rng.normal(size=(4096, 4)).astype(np.float32)
TARGETS = (FEATURES @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)
           + 0.5 * rng.normal(size=4096).astype(np.float32))[:, None]


def _engine(make=lambda learning_rate: optax.sgd(learning_rate)):
  return date.track_statistics(date.adaptive(
      make, optax.constant_schedule(0.05), base_batch_size=LADDER[0], batch_size=LADDER[-1],
      base_steps=T0, batch_sizes=LADDER,
      config=date.EngineConfig(warm_in=4)))  # the growth rule looks every 2 · 4 steps


def _batch(position, size):
  rows = np.arange(position, position + size) % len(FEATURES)
  return {"x": FEATURES[rows], "y": TARGETS[rows]}


def _readings(state):
  """What a loop reads after a step, as numbers."""
  return {"batch_size": int(date.next_batch_size(state)),
          "done": bool(date.progress_done(state, T0)), "diverged": bool(date.diverged(state)),
          "gave_up": bool(date.gave_up(state)),
          **{k: float(v) for k, v in date.statistics(state).items()}}


def _nnx_run():
  """The guide's nnx loop: the readers take the optimizer itself."""
  model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
  init = {"kernel": model.kernel[...], "bias": model.bias[...]}
  optimizer = nnx.Optimizer(model, _engine(), wrt=nnx.Param)
  graphdef = nnx.graphdef(model)
  loss_fn = lambda params, batch: jnp.mean(
      (nnx.merge(graphdef, params)(batch["x"]) - batch["y"]) ** 2)
  grad_fn = date.grouped_value_and_grad(loss_fn, num_groups=4)

  @nnx.jit
  def train_step(model, optimizer, batch):
    loss, grads, sq_norms = grad_fn(nnx.state(model, nnx.Param), batch)
    optimizer.update(model, grads, grad_sq_norms=sq_norms, value=loss)
    return loss

  position, readings = 0, []
  while not date.progress_done(optimizer, T0):
    batch_size = int(date.next_batch_size(optimizer))
    train_step(model, optimizer, _batch(position, batch_size))
    position += batch_size
    readings.append(_readings(optimizer))
    assert _readings(optimizer.opt_state) == readings[-1]
    assert not date.gave_up(optimizer) and len(readings) < 200
  return init, readings


def _optax_run(params):
  """The same loop on plain optax state."""
  tx = _engine()
  loss_fn = lambda p, batch: jnp.mean((batch["x"] @ p["kernel"] + p["bias"] - batch["y"]) ** 2)
  grad_fn = date.grouped_value_and_grad(loss_fn, num_groups=4)

  @jax.jit
  def train_step(params, opt_state, batch):
    loss, grads, sq_norms = grad_fn(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params, grad_sq_norms=sq_norms, value=loss)
    return optax.apply_updates(params, updates), opt_state

  opt_state, position, readings = tx.init(params), 0, []
  while not date.progress_done(opt_state, T0) and len(readings) < 200:
    batch_size = int(date.next_batch_size(opt_state))
    params, opt_state = train_step(params, opt_state, _batch(position, batch_size))
    position += batch_size
    readings.append(_readings(opt_state))
  return readings


def test_a_growing_nnx_run_reads_as_the_same_run_on_optax_state():
  init, got = _nnx_run()
  want = _optax_run(init)
  sizes = [LADDER[0]] + [r["batch_size"] for r in got[:-1]]  # the batch each step had
  assert len(set(sizes)) > 1 and sizes == sorted(sizes)  # it grew
  assert got[-1]["done"] and not any(r["done"] for r in got[:-1])  # progress_done ended it
  assert 10 < len(got) < 60
  assert [r["batch_size"] for r in got] == [r["batch_size"] for r in want]
  for mine, theirs in zip(got, want, strict=True):
    assert mine.keys() == theirs.keys() and "noise_scale" in mine
    assert mine == pytest.approx(theirs, rel=1e-5, abs=1e-7)


def test_every_reader_takes_the_nnx_optimizer_and_its_opt_state():
  model = nnx.Linear(4, 1, rngs=nnx.Rngs(1))
  params = {"bias": model.bias[...], "kernel": model.kernel[...]}
  optimizer = nnx.Optimizer(model, _engine(lambda learning_rate: optax.adam(learning_rate)),
                            wrt=nnx.Param)
  reference = _engine(lambda learning_rate: optax.adam(learning_rate)).init(params)
  recipe = date.Recipe(batch_size=64, num_examples=6400, num_epochs=2, learning_rate=1e-3,
                       optimizer="adam", base_batch_size=8, noise_of="adam_step")
  for state in (optimizer, optimizer.opt_state):
    plain = date.as_optax_state(state)
    is_variable = lambda x: isinstance(x, nnx.Variable)
    assert not any(map(is_variable, jax.tree.leaves(plain, is_leaf=is_variable)))
    assert type(optax.tree.get(plain, "AdaptiveState")) is date.AdaptiveState  # NamedTuples kept
    assert type(optax.tree.get(plain, "ScaleByAdamState")) is optax.ScaleByAdamState
    assert int(date.next_batch_size(state)) == LADDER[0]
    assert not date.progress_done(state, T0) and date.progress_done(state, 0)
    assert not date.diverged(state) and not date.gave_up(state)
    assert jax.tree.map(float, date.statistics(state)) == pytest.approx(
        jax.tree.map(float, date.statistics(reference)), nan_ok=True)
    for scales in (builder_lib.adam_preconditioner(state, b2=0.999, eps=1e-8),
                   builder_lib.noise_leaf_scales(recipe, params, opt_state=state)(None)):
      assert jax.tree.map(jnp.shape, jax.tree.leaves(scales)) == [(1,), (4, 1)]  # bias, kernel
  assert date.as_optax_state(reference) is reference  # optax state comes back as it is


def test_an_nnx_optimizer_without_the_engine_is_refused_by_name():
  optimizer = nnx.Optimizer(nnx.Linear(2, 1, rngs=nnx.Rngs(0)), optax.sgd(0.1), wrt=nnx.Param)
  with pytest.raises(ValueError, match="with Flax nnx, the nnx.Optimizer or its opt_state"):
    date.progress_done(optimizer, T0)
  assert date.statistics(optimizer) == {}


def test_the_readers_on_optax_state_do_not_import_flax():
  assert_not_loaded("import jax.numpy as jnp, optax; from dateopt import date; "
                    "tx = date.adaptive(lambda learning_rate: optax.sgd(learning_rate), "
                    "optax.constant_schedule(0.1), base_batch_size=8, batch_size=8, "
                    "base_steps=10); s = tx.init({'w': jnp.ones(2)}); "
                    "date.progress_done(s, 10), date.next_batch_size(s), date.gave_up(s), "
                    "date.diverged(s), date.statistics(s), date.as_optax_state(s)", ("flax",))
