"""Final Polishing: batch-norm statistics re-estimated on non-augmented training data.

Kasagi et al. (HPDC 2020) end training on training images preprocessed like
validation images, which "adjusts the means and variances in batch
normalization and mitigates the difference of normalization between
validation data and augmented training data". This is its optimizer-free
form ("precise BN", as fvcore's `update_bn_stats`): weights frozen, each BN
layer's running mean and variance replaced by the plain average of the
per-batch statistics over `num_batches` non-augmented training batches.
"""

from __future__ import annotations

import functools

import jax

from dateopt.models.resnet import BN_MOMENTUM
from dateopt.train import parallel
from dateopt.train.steps import TrainState, apply_model


def batch_moments(model, state: TrainState, inputs: jax.Array, *, bn_momentum: float):
  """Every BN layer's mean and variance on one batch, with weights frozen.

  Flax updates running stats as m·old + (1−m)·batch; starting from the
  current stats and inverting that recovers the batch's own moments.
  """
  _, updated = apply_model(model, state.params, state.batch_stats, inputs, train=True)
  return jax.tree.map(lambda new, old: (new - bn_momentum * old) / (1.0 - bn_momentum),
                      updated, state.batch_stats)


def polish_batch_stats(state: TrainState, exp, num_batches: int, *,
                       bn_momentum: float = BN_MOMENTUM) -> TrainState:
  """Replaces `state.batch_stats` by their average over non-augmented train batches.

  Example:
    >>> state = polish_batch_stats(state, experiment, num_batches=50)

  Args:
    state: the trained state (replicated over `exp.mesh`).
    exp: the `Experiment` (dataset, model, mesh, recipe).
    num_batches: training batches to average over (eval-style preprocessing).
    bn_momentum: the models' BN momentum (`dateopt.models.resnet.BN_MOMENTUM`).
  """
  moments_fn = jax.jit(functools.partial(batch_moments, exp.model, bn_momentum=bn_momentum),
                       out_shardings=parallel.replicated(exp.mesh))
  total = None
  for step in range(num_batches):
    local = exp.dataset.train_batch(step, exp.recipe.batch_size, seed=exp.config.seed,
                                    process_index=jax.process_index(),
                                    process_count=jax.process_count(), augment=False)
    batch = parallel.global_batch(local, exp.mesh)
    moments = moments_fn(state, batch["inputs"])
    total = moments if total is None else jax.tree.map(jax.numpy.add, total, moments)
  return state.replace(batch_stats=jax.tree.map(lambda x: x / num_batches, total))
