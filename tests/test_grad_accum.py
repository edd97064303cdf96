"""Gradient accumulation: k micro-batches in one jitted step give the one-batch step.

The reference is the same train step with `grad_accum_steps=1` on the same
global batch: parameters, loss, noise-scale EMAs, DATE statistics and guard
state after the step must agree to float tolerance, on 8 simulated devices.
"""

import doctest
import functools
import json
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dateopt import date, models, train
from dateopt.train import accumulation, parallel
from dateopt.train.steps import apply_model
from dateopt.train.experiment import gradient_groups
from dateopt.train.layout import BatchLayout
from dateopt.date import _noise as noise_lib

import tiny_config  # tests/tiny_config.py: MNIST-1D LSTM, batch 64, grad_groups 8

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow

ACCUM = 4  # micro-batches of 16: 2 rows of each of the 8 gradient groups
STEPS = 2


def _config(**overrides):
  return tiny_config.with_fields(**{"num_train_steps": STEPS, "checkpoint_every_steps": -1,
                                    **overrides})


def _run_steps(grad_accum_steps: int, optimizer: str):
  """STEPS jitted train steps on the tiny LSTM; the first measures the noise, the second not."""
  config = _config(grad_accum_steps=grad_accum_steps)
  config.baseline = dict(config.baseline.to_dict(), optimizer=optimizer)
  exp = train.build_experiment(config)
  tx, _ = train.build_optimizer(config, exp.recipe)
  replicated = parallel.replicated(exp.mesh)
  example = jnp.zeros((1,) + tuple(exp.dataset.input_shape), exp.dataset.input_dtype)
  state = jax.jit(functools.partial(train.create_train_state, exp.model, tx, seed=config.seed),
                  out_shardings=replicated)(example)
  step_fn = jax.jit(functools.partial(
      train.train_step, model=exp.model, tx=tx, num_classes=exp.dataset.num_classes,
      seed=config.seed, grad_groups=gradient_groups(config), recipe=exp.recipe,
      grad_accum_steps=grad_accum_steps), out_shardings=(replicated, replicated))
  batches = exp.dataset.train_iterator(exp.recipe.batch_size, seed=config.seed, start_step=0,
                                       process_index=0, process_count=1)
  states, metrics = [], []
  for step in range(1, STEPS + 1):
    measure = np.bool_(step == 1)  # both branches of the measured/plain cond, accumulated
    state, step_metrics = step_fn(state, parallel.global_batch(next(batches), exp.mesh),
                                  record_statistics=np.bool_(True), measure_noise=measure)
    states.append(parallel.to_host(state))
    metrics.append(parallel.to_host(step_metrics))
  return states, metrics


@pytest.fixture(scope="module", params=["momentum", "adam"])
def one_and_accumulated(request):
  """(k=1 run, k=ACCUM run) of the same two steps, one optimizer family each."""
  return _run_steps(1, request.param), _run_steps(ACCUM, request.param)


def _assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def test_accumulated_step_gives_the_one_batch_update(one_and_accumulated):
  (one_states, one_metrics), (acc_states, acc_metrics) = one_and_accumulated
  for one, acc in zip(one_states, acc_states):
    assert int(one.step) == int(acc.step)  # one optimizer step per global batch
    _assert_trees_close(one.params, acc.params)
  for one, acc in zip(one_metrics, acc_metrics):
    for key in ("loss", "accuracy", "learning_rate"):
      np.testing.assert_allclose(acc[key], one[key], rtol=1e-5, err_msg=key)


def test_noise_scale_statistics_and_guard_match_the_one_batch_step(one_and_accumulated):
  (one_states, one_metrics), (acc_states, acc_metrics) = one_and_accumulated
  for one, acc in zip(one_states, acc_states):
    one_noise = optax.tree.get(one.opt_state, noise_lib.NoiseScaleState.__name__)
    acc_noise = optax.tree.get(acc.opt_state, noise_lib.NoiseScaleState.__name__)
    assert int(acc_noise.count) == int(one_noise.count) == 1  # measured on step 1 only
    _assert_trees_close(acc_noise, one_noise, rtol=1e-4)
    one_guard = optax.tree.get(one.opt_state, "DivergenceGuardState")
    acc_guard = optax.tree.get(acc.opt_state, "DivergenceGuardState")
    _assert_trees_close(acc_guard, one_guard, rtol=1e-5)
  date_keys = [k for k in one_metrics[0] if k.startswith(("date/", "guard/"))]
  assert "date/noise_scale" in date_keys and "guard/lr_multiplier" in date_keys
  for one, acc in zip(one_metrics, acc_metrics):
    for key in date_keys:
      np.testing.assert_allclose(acc[key], one[key], rtol=1e-4, atol=1e-7, err_msg=key)


def test_microbatches_hold_an_equal_part_of_every_gradient_group():
  batch_size, groups = 32, 4
  rows = accumulation.split_microbatches(jnp.arange(batch_size), ACCUM)
  # The g-th slice of every micro-batch, together: the g-th group of the whole batch.
  per_group = rows.reshape(ACCUM, groups, -1).transpose(1, 0, 2).reshape(groups, -1)
  for g in range(groups):
    assert sorted(per_group[g].tolist()) == list(range(g * 8, (g + 1) * 8))
  index = accumulation.microbatch_index(batch_size, ACCUM)
  for m in range(ACCUM):
    assert (index[rows[m]] == m).all()


def test_batch_norm_statistics_are_the_average_of_the_micro_batches_updates():
  model = models.create_model("resnet_tiny", num_classes=4, bn_group_size=4)
  inputs = jax.random.normal(jax.random.key(0), (16, 8, 8, 1))
  variables = model.init(jax.random.key(1), inputs[:1], train=False)
  params, stats = variables["params"], variables["batch_stats"]
  new_stats = lambda p, batch: apply_model(model, p, stats, inputs=batch["x"], train=True)[1]
  accumulated = jax.jit(accumulation.mean_over_microbatches(new_stats, 2))(params, {"x": inputs})
  halves = accumulation.split_microbatches(inputs, 2)
  by_hand = jax.tree.map(lambda a, b: (a + b) / 2, new_stats(params, {"x": halves[0]}),
                         new_stats(params, {"x": halves[1]}))
  _assert_trees_close(accumulated, by_hand)


def test_train_and_evaluate_with_accumulation_checkpoints_and_resumes(tmp_path):
  config = _config(grad_accum_steps=2, num_train_steps=4, checkpoint_every_steps=2,
                   log_every_steps=1)
  whole = train.train_and_evaluate(config, str(tmp_path / "whole"))
  config.num_train_steps = 2  # stopped after a checkpoint, then run again to the end
  train.train_and_evaluate(config, str(tmp_path / "resumed"))
  config.num_train_steps = 4
  resumed = train.train_and_evaluate(config, str(tmp_path / "resumed"))
  assert whole.steps == resumed.steps == 4
  assert sorted(os.listdir(tmp_path / "resumed" / "checkpoints"))[-1] == "4"
  _assert_trees_close(resumed.state.params, whole.state.params, rtol=0, atol=0)
  rows = [json.loads(line) for line in open(tmp_path / "resumed" / "metrics.jsonl")]
  steps = [row["step"] for row in rows if "train/loss" in row]
  assert steps == [1, 2, 3, 4]  # one row per optimizer step, none repeated after the resume
  assert np.isfinite(resumed.train_metrics["date/noise_scale"])
  assert resumed.eval_metrics["accuracy"] >= 0.0


@pytest.mark.parametrize("value, overrides, match", [
    (0, {}, r"config\.grad_accum_steps must be an int >= 1"),
    (-2, {}, r"config\.grad_accum_steps must be an int >= 1"),
    (True, {}, r"config\.grad_accum_steps must be an int >= 1"),
    (16, {}, r"config\.grad_accum_steps=16: config\.batch_size=64 .* device count"),
    (4, dict(grad_groups=32), r"config\.grad_accum_steps=4: .* config\.grad_groups"),
    (8, dict(grad_groups=0, model="resnet_tiny", dataset="digits", dataset_kwargs={},
             model_kwargs=dict(bn_group_size=16)),
     r"config\.grad_accum_steps=8: .*bn_group_size=16"),
])
def test_bad_grad_accum_steps_are_rejected_naming_the_field(value, overrides, match):
  config = _config(**overrides)
  with config.unlocked():
    config["grad_accum_steps"] = value
  with pytest.raises(ValueError, match=match):
    train.build_experiment(config)


@pytest.mark.parametrize("value", [2.5, "2", None, 0, True])
def test_non_integers_are_rejected_naming_the_field(value):
  config = types.SimpleNamespace(grad_accum_steps=value, model="lstm_classifier",
                                 model_kwargs={})  # a --config file may set anything
  with pytest.raises(ValueError, match=r"config\.grad_accum_steps must be an int"):
    BatchLayout.from_config(config, num_devices=8, grad_groups=0)


def test_docstring_examples():
  result = doctest.testmod(accumulation, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0
