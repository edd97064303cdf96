"""Gradient accumulation: one optimizer step on a global batch taken in k micro-batches.

A global batch too large for the devices' memory (32K–64K images) is split
into `k = config.grad_accum_steps` micro-batches that one jitted train step
runs through sequentially with `jax.lax.scan`, averaging what each returns
(loss, gradients, aux). The optimizer then sees the full-batch gradient and
the full-batch loss once, so the optimizer, LR schedule, step counter,
divergence guard and DATE statistics advance once per global batch, exactly
as without accumulation. Only one micro-batch's activations are live at a
time; the carry holds one gradient (G of them when measuring the noise scale
over G groups).

Layout (`split_microbatches`): row i of the batch goes to micro-batch i mod k.
Two things follow. Each device's shard of the batch (rows sharded on the
`data` axis) holds an equal part of every micro-batch, so the split needs no
communication and every micro-batch runs on all devices. And slicing every
micro-batch into G equal groups puts, for each g, rows of one group of the
whole batch only: the g-th slices of the k micro-batches together are rows
[g·B/G, (g+1)·B/G), the g-th group without accumulation. Averaging the
per-group gradients over micro-batches (`date.per_group_value_and_grad`) thus
gives the full batch's G group gradients, and the noise scale's two squared
norms (`date._noise.combine_group_grads`) are those of a step without accumulation.

Batch norm: a model with batch statistics normalises each micro-batch on its
own (each group of it, when grouped), like ghost batch norm over B/k examples;
with `bn_group_size` dividing the micro-batch (or micro-group) size, it is
ghost BN of the same size as without accumulation. The running statistics
are the average of the k micro-batches' updates, each made from the same old
value: m·old + (1 − m)·mean of the micro-batches' moments, one EMA step per
optimizer step as without accumulation (not k chained steps, which would
shorten the EMA's horizon k-fold).

Example (in a train step; `train_step(..., grad_accum_steps=4)` does this):

    grad_fn = mean_over_microbatches(jax.value_and_grad(loss_fn), 4)
    loss, grads = grad_fn(params, batch)  # jax.value_and_grad(loss_fn) on the whole batch
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


def split_microbatches(batch: Any, num_microbatches: int) -> Any:
  """Every leaf (B, ...) as (k, B/k, ...), with row i in micro-batch i mod k.

  Example:
    >>> split_microbatches({"x": jnp.arange(6)}, 2)["x"].tolist()
    [[0, 2, 4], [1, 3, 5]]
  """
  def split(x):
    rows = x.shape[0] // num_microbatches
    return jnp.swapaxes(x.reshape((rows, num_microbatches) + x.shape[1:]), 0, 1)

  return jax.tree.map(split, batch)


def microbatch_index(batch_size: int, num_microbatches: int) -> jax.Array:
  """The micro-batch each row of the batch goes to (`split_microbatches`'s layout).

  Example:
    >>> microbatch_index(6, 2).tolist()
    [0, 1, 0, 1, 0, 1]
  """
  return jnp.arange(batch_size) % num_microbatches


def mean_over_microbatches(fn: Callable[..., Any], num_microbatches: int) -> Callable[..., Any]:
  """`fn(params, batch, *args)` run on k micro-batches in turn, outputs averaged.

  For a `fn` that averages over its batch (a mean loss, its gradient, a
  per-group gradient stack), the result is `fn` on the whole batch up to
  float rounding, with one micro-batch's activations live at a time: the
  micro-batches are a `jax.lax.scan`. k = 1 returns `fn` itself.

  Args:
    fn: `fn(params, batch, *args) -> outputs` (any tree of float arrays).
    num_microbatches: k; must divide the batch size.

  Example:
    >>> loss = lambda w, b: jnp.mean((b["x"] * w - b["y"]) ** 2)
    >>> batch = {"x": jnp.arange(8.0), "y": jnp.ones(8)}
    >>> value, grad = mean_over_microbatches(jax.value_and_grad(loss), 4)(2.0, batch)
    >>> float(value), float(grad)  # as on the whole batch
    (57.0, 63.0)
  """
  if num_microbatches == 1:
    return fn

  def accumulated(params, batch, *args):
    microbatches = split_microbatches(batch, num_microbatches)
    first = jax.tree.map(lambda x: x[0], microbatches)
    out_shapes = jax.eval_shape(fn, params, first, *args)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_shapes)

    def add_microbatch(total, microbatch):
      return jax.tree.map(jnp.add, total, fn(params, microbatch, *args)), None

    total, _ = jax.lax.scan(add_microbatch, zeros, microbatches)
    return jax.tree.map(lambda t: (t / num_microbatches).astype(t.dtype), total)

  return accumulated
