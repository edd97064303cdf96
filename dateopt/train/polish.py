"""Final Polishing (Kasagi et al., HPDC 2020): batch norm fitted to evaluation-like data.

At very large batches the batch-norm statistics learnt on augmented training
data no longer fit the evaluation data. Final Polishing "adjusts the means and
variances in batch normalization and mitigates the difference of normalization
between validation data and augmented training data". dateopt offers its two
forms (`config.polish.mode`):

- "final_epochs", the paper's: the last `polish.epochs` of training run on
  training examples preprocessed like evaluation ones (no shift, scaling,
  noise, crop or flip). The trainer switches the input pipeline
  (`polish_window`); this module has nothing to do for it.
- "precise_bn", optimizer-free (as fvcore's `update_bn_stats`): weights
  frozen, every BN layer's running mean and variance replaced by the exact
  mean and variance of its inputs over N training batches, clean or weakly
  augmented (Merchant, Zoph & Cubuk 2020 found statistics from weakly
  augmented images helped where clean ones did not): `polish_batch_stats`.
- "both": final epochs, then precise BN.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from dateopt.data import Dataset
from dateopt.models import GhostBatchNorm
from dateopt.train import parallel
from dateopt.train.steps import TrainState
from dateopt.validation import check_choice, check_range, check_type

POLISH_MODES = ("none", "precise_bn", "final_epochs", "both")
# Where precise BN takes its statistics: clean (evaluation-style) or weakly augmented batches.
BN_DATA = ("clean", "weak")
# The paper's window: epochs 85-90 of 90 on evaluation-style training images.
PAPER_FINAL_EPOCHS_SHARE = 5.0 / 90.0
_BATCH_NORMS = (nn.BatchNorm, GhostBatchNorm)


def uses_final_epochs(mode: str) -> bool:
  return mode in ("final_epochs", "both")


def uses_precise_bn(mode: str) -> bool:
  return mode in ("precise_bn", "both")


def check_polish_config(polish: Mapping[str, Any]) -> None:
  """Raises ValueError/TypeError naming the `config.polish` field at fault."""
  check_choice("config.polish.mode", polish["mode"], POLISH_MODES)
  check_choice("config.polish.bn_data", polish["bn_data"], BN_DATA)
  check_type("config.polish.batches", polish["batches"], int, what="a positive int")
  check_range("config.polish.batches", polish["batches"], low=1)
  if polish["epochs"] is not None:
    check_range("config.polish.epochs", polish["epochs"], low=0.0, low_inclusive=False)


def polish_window(polish: Mapping[str, Any], steps_per_epoch: int, num_train_steps: int) -> int:
  """The number of final steps trained on evaluation-style data (0 without final epochs).

  `polish.epochs` None takes the paper's share (5 of 90 epochs) of the run's
  `num_train_steps`; the window is at least one step.

  Example:
    >>> polish_window({"mode": "final_epochs", "epochs": 1.0}, 100, 1000)
    100
    >>> polish_window({"mode": "both", "epochs": None}, 100, 900)
    50
  """
  if not uses_final_epochs(polish["mode"]):
    return 0
  epochs = polish["epochs"]
  exact = (PAPER_FINAL_EPOCHS_SHARE * num_train_steps if epochs is None
           else epochs * steps_per_epoch)
  steps = max(1, math.ceil(exact - 1e-9))  # 5/90 of 900 is 50, not 51 after rounding
  if steps >= num_train_steps:
    raise ValueError(f"config.polish.epochs={epochs} covers {steps} steps, the whole run of "
                     f"{num_train_steps} steps: the final epochs must be a part of it.")
  return steps


def bn_input_moments(model: nn.Module, params: Any, batch_stats: Any, *,
                     inputs: jax.Array) -> dict[tuple[str, ...], tuple[jax.Array, jax.Array]]:
  """Every BN layer's input mean and mean of squares (per channel) on one batch.

  The model runs in training mode, as during training: each BN layer
  normalises with its batch (or ghost-group) statistics, so the layers after
  it see training-mode activations. A method interceptor reads each BN
  layer's input on its way in; nothing depends on the BN momentum.

  Returns:
    {module path: (mean, mean of squares)}, float32, over every axis but the last.
  """
  moments = {}

  def record_input(next_fun, args, kwargs, context):
    if isinstance(context.module, _BATCH_NORMS) and context.method_name == "__call__":
      x = jnp.asarray(args[0], jnp.float32)
      axes = tuple(range(x.ndim - 1))
      moments[context.module.path] = (x.mean(axes), jnp.square(x).mean(axes))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record_input):
    model.apply({"params": params, "batch_stats": batch_stats}, inputs, train=True,
                mutable=["batch_stats"])
  return moments


def polish_batch_stats(model: nn.Module, state: TrainState, batches: Iterable[Mapping[str, Any]],
                       *, mesh: jax.sharding.Mesh) -> TrainState:
  """Precise BN: each BN layer's statistics set to the exact moments of its inputs.

  Weights stay as they are (bit for bit). Over all the examples of `batches`,
  each BN layer's running mean becomes the mean of its inputs and its running
  variance their (biased) variance, E[x²] − E[x]², the form `flax.linen.BatchNorm`
  normalises with. The forward passes are data-parallel over `mesh`, with
  the model's own (ghost) batch-norm groups.

  Example:
    >>> batches = statistics_batches(dataset, 1024, num_batches=50, seed=0)
    >>> state = polish_batch_stats(model, state, batches, mesh=mesh)

  Args:
    model: the Flax model `state` was trained with.
    state: a trained `TrainState` (e.g. restored from a checkpoint), replicated
      over `mesh` or on the host.
    batches: this process's slices of the global batches (dicts with "inputs"),
      as `Dataset.train_batch` gives them; see `statistics_batches`.
    mesh: the data-parallel mesh (`parallel.make_mesh()`).

  Returns:
    `state` with new `batch_stats` (unchanged if the model has no batch norm).
  """
  if not state.batch_stats:
    return state
  moments_fn = jax.jit(functools.partial(_weighted_moments, model),
                       out_shardings=parallel.replicated(mesh))
  totals, count = None, 0
  for local in batches:
    batch = parallel.global_batch({"inputs": local["inputs"]}, mesh)
    size = batch["inputs"].shape[0]
    sums = moments_fn(state.params, state.batch_stats, batch["inputs"], size)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    count += size
  if totals is None:
    raise ValueError("polish_batch_stats: `batches` yielded no batch.")
  return state.replace(batch_stats=_as_batch_stats(state.batch_stats, totals, count))


def _weighted_moments(model, params, batch_stats, inputs, size):
  # Sums weighted by the batch size: batches of any size pool exactly.
  return {path: (mean * size, square * size)
          for path, (mean, square) in bn_input_moments(model, params, batch_stats,
                                                       inputs=inputs).items()}


def _as_batch_stats(batch_stats: Any, totals: dict, count: int) -> Any:
  """`batch_stats` with each BN layer's mean and variance replaced by the pooled moments."""
  stats = dict(batch_stats)  # copied level by level below: the input stays as it was
  for path, (mean_sum, square_sum) in totals.items():
    layer = stats
    for name in path:
      layer[name] = dict(layer[name])
      layer = layer[name]
    mean = mean_sum / count
    layer["mean"] = mean
    layer["var"] = jnp.maximum(square_sum / count - jnp.square(mean), 0.0)
  return stats


def statistics_batches(dataset: Dataset, batch_size: int, num_batches: int, *, seed: int,
                       bn_data: str = "clean", start_step: int = 0):
  """This process's slices of `num_batches` training batches for precise BN.

  Example:
    >>> batches = statistics_batches(dataset, 1024, 50, seed=0, bn_data="weak")
  """
  check_choice("bn_data", bn_data, BN_DATA)
  return dataset.train_iterator(batch_size, seed=seed, start_step=start_step,
                                process_index=jax.process_index(),
                                process_count=jax.process_count(),
                                augment="none" if bn_data == "clean" else "weak",
                                num_steps=num_batches)
