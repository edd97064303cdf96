"""The gradient noise scale, AdaScale's gain, and the step count they predict.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training"): with
|G_s|² the squared norm of a gradient over B_small examples and |G_b|² that
over B_big examples, E|G_B|² = |G|² + tr(Σ)/B (Σ: per-example gradient
covariance), so::

    |G|²   ≈ (B_big·|G_b|² − B_small·|G_s|²) / (B_big − B_small)
    tr(Σ)  ≈ (|G_s|² − |G_b|²) / (1/B_small − 1/B_big)
    B_noise = tr(Σ)/|G|²

Both estimates are noisy: their EMAs are kept separately and B_noise is the
ratio of the EMAs. AdaScale (Johnson et al. 2020) turns them into the gain of
a batch k times the baseline's, r = (1 + B_noise/B0)/(1 + B_noise/B): how
many baseline steps one large-batch step is worth (docs/papers.md §6).

This module is the estimator only: `measure_noise_scale` keeps the EMAs in an
optimizer state; `grouped_value_and_grad` (or its two halves,
`per_group_value_and_grad` and `combine_group_grads`, for accumulated
micro-batches) and `cross_replica_sq_norms` produce the `GradientSqNorms` it
takes. The planner uses the plain-number functions (`adascale_gain`,
`predicted_steps`) without any optimizer machinery.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dateopt import transforms
from dateopt.date._engine_config import EngineConfig, engine_config
from dateopt.validation import as_int, check_range

# --------------------------------------------------------------------------
# Measuring: squared gradient norms at two batch sizes.
# --------------------------------------------------------------------------


class GradientSqNorms(NamedTuple):
  """Squared gradient norms at two batch sizes, the input of the noise scale.

  Attributes:
    small: |G_s|², the squared norm of a batch-`small_batch_size` gradient
      (averaged over replicas or groups: each one's value is an estimate).
    big: |G_b|², the squared norm of the batch-`big_batch_size` gradient.
    small_batch_size: the per-replica (per-group) batch size.
    big_batch_size: the global batch size.
  """

  small: jax.Array
  big: jax.Array
  small_batch_size: Any
  big_batch_size: Any


def check_batch_sizes(small_batch_size: Any, big_batch_size: Any) -> None:
  """The readings' batch sizes, checked where they are concrete: whole numbers with
  1 ≤ small < big (the estimates divide by both and by their difference).

  Traced sizes (a `GradientSqNorms` passed through `jax.jit`) are not checked.

  Example:
    >>> check_batch_sizes(8, 64)
    >>> check_batch_sizes(8, 8)   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: big_batch_size must be greater than small_batch_size=8 ...
  """
  small = as_int("small_batch_size", small_batch_size, low=1)
  big = as_int("big_batch_size", big_batch_size, low=1)
  if isinstance(small, int) and isinstance(big, int) and big <= small:
    raise ValueError(f"big_batch_size must be greater than small_batch_size={small} (the noise "
                     f"scale compares the two batches); got {big}.")


def tree_sq_norm(tree: Any, leaf_scales: Any = None) -> jax.Array:
  """Σ of squared entries over every leaf, accumulated in float32.

  With `leaf_scales` (a tree of one scalar s_l per leaf of `tree`): Σ_l s_l²·|x_l|²,
  the squared norm of the tree with each leaf scaled by its s_l. A leaf's
  scale may also be an array of the leaf's shape (Adam's per-coordinate
  preconditioner): Σ (s ⊙ x)².
  """
  leaves = jax.tree.leaves(tree)
  scales = [1.0] * len(leaves) if leaf_scales is None else jax.tree.leaves(leaf_scales)
  return sum((_scaled_sq_norm(x, s) for x, s in zip(leaves, scales, strict=True)),
             jnp.zeros((), jnp.float32))


def _scaled_sq_norm(x: jax.Array, scale: Any) -> jax.Array:
  scale = jnp.asarray(scale, jnp.float32)
  if scale.ndim == 0:
    return jnp.square(scale) * transforms.sum_of_squares(x)
  return transforms.sum_of_squares(scale * x.astype(jnp.float32))


def _scales_of(leaf_scales: Callable[[Any], Any] | None, grads: Any) -> Any:
  """The step's per-leaf scales (no gradient flows through them), or None."""
  return None if leaf_scales is None else jax.lax.stop_gradient(leaf_scales(grads))


def cross_replica_sq_norms(
    local_grads: Any, axis_name: Any, local_batch_size: int, *,
    leaf_scales: Callable[[Any], Any] | None = None,
) -> tuple[Any, GradientSqNorms]:
  """Averages per-replica gradients across `axis_name` and measures both norms.

  For a data-parallel step under `jax.shard_map` or `jax.pmap`: the
  per-replica squared norm costs one extra scalar `pmean` next to the gradient
  all-reduce. Under `shard_map` with `check_vma=True`, gradients with respect
  to replicated params come back already summed; take them with respect to
  `jax.lax.pcast(params, axis_name, to="varying")` (`jax.lax.pvary` in
  jax 0.8) to get per-replica ones.

  Args:
    local_grads: this replica's gradient (mean over its `local_batch_size`
      examples).
    axis_name: the data-parallel mapped axis.
    local_batch_size: examples per replica.
    leaf_scales: as in `combine_group_grads`: the norms of the step the
      optimizer takes, each leaf scaled by its factor (LARS's trust ratios).

  Returns:
    `(grads, sq_norms)`: the cross-replica mean gradient, and the
    `GradientSqNorms` for `measure_noise_scale` or `date.adaptive`.

  Example:
    >>> # inside a shard_map'd train step over axis "data":
    >>> # grads, sq_norms = cross_replica_sq_norms(local_grads, "data", 32)
  """
  as_int("local_batch_size", local_batch_size, low=1)
  grads = jax.lax.pmean(local_grads, axis_name)
  scales = _scales_of(leaf_scales, grads)
  small = jax.lax.pmean(tree_sq_norm(local_grads, scales), axis_name)
  num_replicas = jax.lax.psum(1, axis_name)
  return grads, GradientSqNorms(small, tree_sq_norm(grads, scales), local_batch_size,
                                local_batch_size * num_replicas)


def grouped_value_and_grad(
    loss_fn: Callable[..., Any], num_groups: int, *, has_aux: bool = False,
    leaf_scales: Callable[[Any], Callable[[Any], Any] | None] | None = None,
) -> Callable[..., tuple[Any, Any, GradientSqNorms]]:
  """`jax.value_and_grad` over `num_groups` equal slices of the batch.

  The `jax.jit` + `Mesh` counterpart of `cross_replica_sq_norms`: the batch
  (leading axis) is split into groups, one gradient per group is taken with
  `vmap`, and the mean gradient plus the squared norms at group and full batch
  size come back. `loss_fn` must average over its batch; losses and aux are
  averaged over groups. It is `per_group_value_and_grad` followed by
  `combine_group_grads`; a step that accumulates micro-batches averages the
  per-group outputs over them in between.

  Args:
    loss_fn: `loss_fn(params, batch, *args) -> loss` (or `(loss, aux)`).
    num_groups: how many slices; must divide the batch size.
    has_aux: as in `jax.value_and_grad`.
    leaf_scales: `leaf_scales(params)` gives `combine_group_grads`'s
      `leaf_scales=` for the step at `params` (or None): e.g.
      `functools.partial(dateopt.date._builder.noise_leaf_scales, recipe)` measures the noise
      of the step a LARS recipe takes. None: the gradient's.

  Returns:
    `fn(params, batch, *args) -> (value, grads, sq_norms)`.

  Example:
    >>> loss = lambda w, b: jnp.mean((b["x"] @ w - b["y"]) ** 2)
    >>> batch = {"x": jnp.ones((8, 2)), "y": jnp.zeros(8)}
    >>> value, grads, sq = grouped_value_and_grad(loss, 4)(jnp.ones(2), batch)
    >>> float(value), sq.small_batch_size, sq.big_batch_size
    (4.0, 2, 8)
  """
  per_group_fn = per_group_value_and_grad(loss_fn, num_groups, has_aux=has_aux)

  def fn(params, batch, *args):
    values, group_grads = per_group_fn(params, batch, *args)
    return combine_group_grads(values, group_grads, jax.tree.leaves(batch)[0].shape[0],
                               leaf_scales=None if leaf_scales is None else leaf_scales(params))

  return fn


def per_group_value_and_grad(
    loss_fn: Callable[..., Any], num_groups: int, *, has_aux: bool = False
) -> Callable[..., tuple[Any, Any]]:
  """Values and gradients of `num_groups` equal slices of the batch, stacked.

  Slice g is rows [g·n/G, (g+1)·n/G) of the batch (n rows, G groups); every
  output leaf gains a leading axis of size G. Averaging these outputs over
  micro-batches (each one split the same way) gives the full batch's group
  gradients, which `combine_group_grads` turns into the noise scale's norms.

  Example:
    >>> loss = lambda w, b: jnp.mean((b["x"] @ w - b["y"]) ** 2)
    >>> batch = {"x": jnp.ones((8, 2)), "y": jnp.zeros(8)}
    >>> values, group_grads = per_group_value_and_grad(loss, 4)(jnp.ones(2), batch)
    >>> values.shape, group_grads.shape
    ((4,), (4, 2))
  """
  check_range("num_groups", num_groups, low=2)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=has_aux)

  def fn(params, batch, *args):
    batch_size = jax.tree.leaves(batch)[0].shape[0]
    if batch_size % num_groups:
      raise ValueError(
          f"batch size {batch_size} must be divisible by num_groups={num_groups}.")
    group_size = batch_size // num_groups
    groups = jax.tree.map(
        lambda x: x.reshape((num_groups, group_size) + x.shape[1:]), batch)
    in_axes = (None, 0) + (None,) * len(args)
    return jax.vmap(grad_fn, in_axes=in_axes)(params, groups, *args)

  return fn


def combine_group_grads(values: Any, group_grads: Any, batch_size: int, *,
                        leaf_scales: Callable[[Any], Any] | None = None
                        ) -> tuple[Any, Any, GradientSqNorms]:
  """(mean value, mean gradient, squared norms) from stacked per-group outputs.

  Args:
    values: per-group values (leading axis: groups), averaged over groups.
    group_grads: per-group gradients (leading axis: groups), each one the
      mean over `batch_size / num_groups` examples.
    batch_size: examples in all groups together (the big batch): a whole
      number the groups divide.
    leaf_scales: None (the gradient's norms), or `fn(mean_grads) -> tree` of
      one scalar per leaf: the factor the optimizer puts on each leaf's
      gradient (LARS's trust ratios: `dateopt.date._builder.noise_leaf_scales`). The norms, and the
      noise scale and gain taken from them, are then those of the step the
      optimizer takes. The factors come from the mean gradient, as the
      optimizer's do, and carry no gradient.

  Example:
    >>> grads = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # two groups of 4
    >>> value, mean, sq = combine_group_grads(jnp.zeros(2), grads, 8)
    >>> float(sq.small), float(sq.big), sq.small_batch_size
    (1.0, 0.5, 4)
  """
  num_groups = jax.tree.leaves(group_grads)[0].shape[0]
  batch_size = as_int("batch_size", batch_size, low=1)
  if isinstance(batch_size, int) and batch_size % num_groups:
    raise ValueError(f"batch_size={batch_size} must be divisible by num_groups={num_groups} "
                     f"(the leading axis of group_grads).")
  grads = jax.tree.map(lambda g: jnp.mean(g, axis=0), group_grads)
  scales = _scales_of(leaf_scales, grads)
  small = jnp.mean(jax.vmap(lambda g: tree_sq_norm(g, scales))(group_grads))
  value = jax.tree.map(lambda v: jnp.mean(v, axis=0), values)
  return value, grads, GradientSqNorms(small, tree_sq_norm(grads, scales),
                                       batch_size // num_groups, batch_size)


def no_measurement(small_batch_size: int, big_batch_size: int) -> GradientSqNorms:
  """A `GradientSqNorms` that carries nothing (NaN): the EMAs skip it.

  A train step that measures only every N steps passes this on the others,
  so the optimizer's call signature (and its compiled program) stays the same.
  """
  check_batch_sizes(small_batch_size, big_batch_size)
  nan = jnp.full((), jnp.nan, jnp.float32)
  return GradientSqNorms(nan, nan, small_batch_size, big_batch_size)


# --------------------------------------------------------------------------
# Estimating: unbiased estimates, their EMAs, and B_noise.
# --------------------------------------------------------------------------


def noise_estimates(sq_norms: GradientSqNorms) -> tuple[jax.Array, jax.Array]:
  """Unbiased estimates (|G|², tr Σ) from squared norms at two batch sizes.

  McCandlish et al. 2018, appendix A (docs/papers.md §6).

  Example:
    >>> # |G|² = 2, tr Σ = 30: E|G_10|² = 2 + 3, E|G_80|² = 2 + 0.375
    >>> [float(x) for x in noise_estimates(GradientSqNorms(5.0, 2.375, 10, 80))]
    [2.0, 30.0]
  """
  check_batch_sizes(sq_norms.small_batch_size, sq_norms.big_batch_size)
  b_small = jnp.asarray(sq_norms.small_batch_size, jnp.float32)
  b_big = jnp.asarray(sq_norms.big_batch_size, jnp.float32)
  small = jnp.asarray(sq_norms.small, jnp.float32)
  big = jnp.asarray(sq_norms.big, jnp.float32)
  grad_sq = (b_big * big - b_small * small) / (b_big - b_small)
  trace = (small - big) / (1.0 / b_small - 1.0 / b_big)
  return grad_sq, trace


class NoiseScaleState(NamedTuple):
  """EMAs (not bias-corrected) of the |G|² and tr Σ estimates, and their count."""

  grad_sq_ema: jax.Array
  trace_ema: jax.Array
  count: jax.Array


def init_noise_scale() -> NoiseScaleState:
  """An empty noise-scale state (no measurement yet)."""
  zero = jnp.zeros((), jnp.float32)
  return NoiseScaleState(zero, zero, jnp.zeros((), jnp.int32))


def corrected_estimates(state: NoiseScaleState, decay: float) -> tuple[jax.Array, jax.Array]:
  """The EMAs' bias-corrected (|G|², tr Σ): an EMA started at 0 reads low by decay^count.

  Example:
    >>> s = update_noise_scale(init_noise_scale(), GradientSqNorms(5.0, 2.375, 10, 80), 0.9)
    >>> [round(float(x), 3) for x in corrected_estimates(s, 0.9)]
    [2.0, 30.0]
  """
  correction = _ema_bias(decay, jnp.maximum(state.count, 1).astype(jnp.float32))
  return state.grad_sq_ema / correction, state.trace_ema / correction


def _ema_bias(decay, count):
  """1 - decay^count: the weight an EMA started at 0 has given its `count` readings."""
  return 1.0 - decay ** count


def clip_readings(state: NoiseScaleState, grad_sq: jax.Array, trace: jax.Array, *,
                  big_batch_size: Any, decay: float, clip: float, clip_after: int
                  ) -> tuple[jax.Array, jax.Array]:
  """Winsorizes one measurement's (|G|², tr Σ) against the EMAs' bias-corrected values.

  tr Σ is clipped to ±`clip` × its EMA, and |G|² (a difference of two squared
  norms, each about |G|² + tr Σ/b) to ±`clip` × the expected |G_B|² = |G|² +
  tr Σ/B. One reading then moves an EMA at most a few percent, so a loss
  spike's readings cannot run the noise scale, and with it the gain, away within
  a growth interval (the evidence: docs/results/engine_rules.md, 'The winsorized
  readings'); a noise scale that grows tenfold over a thousand steps is followed
  as before.
  Before `clip_after` measurements nothing is clipped. DATE's engine clips at
  `EngineConfig.reading_clip` (4) after `EngineConfig.warm_in` (10): a reading then
  moves an EMA of decay 0.99 at most ~3%.

  Example:
    >>> s = init_noise_scale()
    >>> for _ in range(10):
    ...   s = update_noise_scale(s, GradientSqNorms(5.0, 2.375, 10, 80), 0.9)
    >>> # EMAs: |G|² 2, tr Σ 30; expected |G_80|² = 2.375
    >>> clipped = clip_readings(s, jnp.float32(-50.0), jnp.float32(500.0), big_batch_size=80,
    ...                         decay=0.9, clip=4.0, clip_after=10)
    >>> [round(float(x), 3) for x in clipped]
    [-9.5, 120.0]
  """
  grad_sq_now, trace_now = map(jnp.abs, corrected_estimates(state, decay))
  spread = grad_sq_now + trace_now / jnp.asarray(big_batch_size, jnp.float32)
  settled = state.count >= max(clip_after, 1)  # EMAs with no reading expect nothing
  return (jnp.where(settled, jnp.clip(grad_sq, -clip * spread, clip * spread), grad_sq),
          jnp.where(settled, jnp.clip(trace, -clip * trace_now, clip * trace_now), trace))


def update_noise_scale(
    state: NoiseScaleState, sq_norms: GradientSqNorms, decay: float, *,
    signal_decay: float | None = None, clip: float | None = None, clip_after: int = 0
) -> NoiseScaleState:
  """Folds one measurement into the EMAs, winsorized at `clip` after `clip_after`
  measurements (`clip_readings`; `clip=None`: as read); non-finite measurements are ignored.

  `signal_decay` (default: `decay`) gives the |G|² EMA a horizon of its own. |G|²
  falls tenfold and more in training while tr Σ moves slowly, and an EMA lags a
  moving value by about its horizon: at a gain r, a 100-step horizon spans
  100·r baseline steps, and B_noise reads low (the evidence:
  docs/results/engine_rules.md, 'The EMA horizons'). The
  state keeps its format: `grad_sq_ema` holds the faster EMA
  rescaled to the bias of `decay`'s, so `noise_scale`, `gain_from_estimates` and
  `corrected_estimates` read it as before.

  Example:
    >>> s = update_noise_scale(init_noise_scale(), GradientSqNorms(5.0, 2.375, 10, 80), 0.99)
    >>> round(float(noise_scale(s)), 4)   # 30 / 2
    15.0
    >>> s = update_noise_scale(s, GradientSqNorms(3.5, 0.875, 10, 80), 0.99, signal_decay=0.5)
    >>> # |G|² reads 2 then 0.5: (0.25·2 + 0.5·0.5)/0.75 = 1 at decay 0.5; tr Σ stays 30
    >>> [round(float(x), 3) for x in corrected_estimates(s, 0.99)]
    [1.0, 30.0]
  """
  grad_sq, trace = noise_estimates(sq_norms)
  ok = jnp.isfinite(grad_sq) & jnp.isfinite(trace)
  if clip is not None:  # static
    grad_sq, trace = clip_readings(state, grad_sq, trace, big_batch_size=sq_norms.big_batch_size,
                                   decay=decay, clip=clip, clip_after=clip_after)
  ema = lambda old, new: jnp.where(ok, decay * old + (1.0 - decay) * new, old)
  count = state.count + ok.astype(jnp.int32)
  if signal_decay is None or signal_decay == decay:  # static: one horizon, bit for bit
    grad_sq_ema = ema(state.grad_sq_ema, grad_sq)
  else:
    grad_sq_ema = _signal_ema(state, grad_sq, ok, count, decay=decay, signal_decay=signal_decay)
  return NoiseScaleState(grad_sq_ema, ema(state.trace_ema, trace), count)


def _signal_ema(state, grad_sq, ok, count, *, decay, signal_decay):
  """The |G|² EMA at `signal_decay`, stored rescaled to `decay`'s bias (`_ema_bias`)."""
  before_n, after_n = state.count.astype(jnp.float32), count.astype(jnp.float32)
  before = jnp.where(before_n > 0, state.grad_sq_ema * _ema_bias(signal_decay, before_n)
                     / jnp.where(before_n > 0, _ema_bias(decay, before_n), 1.0), 0.0)
  after = jnp.where(ok, signal_decay * before + (1.0 - signal_decay) * grad_sq, before)
  return jnp.where(after_n > 0, after * _ema_bias(decay, after_n)
                   / jnp.where(after_n > 0, _ema_bias(signal_decay, after_n), 1.0), 0.0)


def noise_scale(state: NoiseScaleState) -> jax.Array:
  """B_noise = tr Σ / |G|² from the EMAs (NaN before the first measurement).

  The EMAs' bias corrections are equal and cancel in the ratio. Late in
  training |G|² is small and its unbiased estimate can average to <= 0: the
  noise then dominates the signal, and the limit of the ratio, +inf, is
  returned rather than a meaningless negative batch size.
  """
  ratio = state.trace_ema / jnp.where(state.grad_sq_ema > 0, state.grad_sq_ema, 1.0)
  ratio = jnp.where(state.grad_sq_ema > 0, ratio, jnp.inf)
  return jnp.where(state.count > 0, ratio, jnp.nan)


def gain_from_estimates(state: NoiseScaleState, base_batch_size: int,
                        batch_size: int) -> jax.Array:
  """AdaScale's gain r ∈ [1, k] straight from the EMAs (jit-safe).

  r = (tr Σ/B0 + |G|²) / (tr Σ/B + |G|²), k = B/B0, with both EMAs clipped at
  0 first: a non-positive |G|² is pure noise (r = k), a non-positive tr Σ no
  noise (r = 1). Before the first measurement r = 1, the baseline's pace.

  Example:
    >>> s = update_noise_scale(init_noise_scale(), GradientSqNorms(5.0, 2.375, 10, 80), 0.0)
    >>> round(float(gain_from_estimates(s, 10, 160)), 4)  # (3 + 2)/(0.1875 + 2)
    2.2857
  """
  k = batch_size / base_batch_size
  trace = jnp.maximum(state.trace_ema, 0.0)
  grad_sq = jnp.maximum(state.grad_sq_ema, 0.0)
  denominator = trace / batch_size + grad_sq
  gain = (trace / base_batch_size + grad_sq) / jnp.where(denominator > 0, denominator, 1.0)
  gain = jnp.where(denominator > 0, gain, 1.0)
  return jnp.where(state.count > 0, jnp.clip(gain, 1.0, k), 1.0)


class NoiseMeasurementState(NamedTuple):
  """State of `measure_noise_scale`: the inner state and the noise EMAs."""

  inner_state: Any
  noise: NoiseScaleState


def measure_noise_scale(
    inner: optax.GradientTransformation, *,
    config: EngineConfig | Mapping[str, Any] | None = None,
    measure_every_steps: int = 1
) -> optax.GradientTransformationExtraArgs:
  """Wraps `inner` and keeps the gradient-noise-scale EMAs in its state.

  Pass the step's `GradientSqNorms` as the extra argument `grad_sq_norms=`;
  a non-finite one (`no_measurement`) leaves the EMAs as they were. The
  updates are `inner`'s, unchanged. The EMAs are those of `date.adaptive` with the
  same `config` (`EngineConfig`: decays, winsorizing), so a baseline's logged profile
  reads as the engine will; `measure_every_steps`: one step in that many is measured
  (the horizons stay in steps). `date.adaptive` keeps the same EMAs itself, so a run
  with the adaptive engine does not need this wrapper.

  Example:
    >>> tx = measure_noise_scale(optax.sgd(0.1))
    >>> params = {"w": jnp.ones(2)}
    >>> state = tx.init(params)
    >>> _, state = tx.update({"w": jnp.ones(2)}, state, params,
    ...                      grad_sq_norms=GradientSqNorms(5.0, 2.375, 10, 80))
    >>> round(float(noise_scale(state.noise)), 4)
    15.0
  """
  config = engine_config(config, "config")
  noise_decay, signal_decay = config.decays(measure_every_steps)
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    return NoiseMeasurementState(inner.init(params), init_noise_scale())

  def update_fn(updates, state, params=None, *, grad_sq_norms=None, **extra_args):
    new_updates, inner_state = inner.update(updates, state.inner_state, params, **extra_args)
    noise = state.noise
    if grad_sq_norms is not None:  # static: either always given or never
      noise = update_noise_scale(noise, grad_sq_norms, noise_decay, signal_decay=signal_decay,
                                 clip=config.reading_clip, clip_after=config.warm_in)
    return new_updates, NoiseMeasurementState(inner_state, noise)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# --------------------------------------------------------------------------
# Predicting: what a noise scale means for a larger batch (plain numbers).
# --------------------------------------------------------------------------


def _check_law_args(noise_scale, base_batch_size, batch_size) -> float:
  if not isinstance(noise_scale, numbers.Real) or isinstance(noise_scale, bool):
    raise TypeError(f"noise_scale must be a number (examples); got {noise_scale!r}.")
  check_range("noise_scale", noise_scale, low=0.0, finite=False)  # inf: the gain is k
  check_range("base_batch_size", base_batch_size, low=0, low_inclusive=False)
  check_range("batch_size", batch_size, low=0, low_inclusive=False)
  return float(noise_scale)


def adascale_gain(noise_scale: float, base_batch_size: int, batch_size: int) -> float:
  """AdaScale's gain of `batch_size` over `base_batch_size` (Johnson et al. 2020).

  r = (1 + B_noise/B0)/(1 + B_noise/B): how many baseline steps one step at
  the larger batch is worth (McCandlish et al. 2018). r ≈ k = B/B0 below the
  noise scale, r ≈ 1 far above it; B_noise = inf gives k.

  Example:
    >>> adascale_gain(1000.0, 100, 1000)
    5.5
  """
  noise_scale = _check_law_args(noise_scale, base_batch_size, batch_size)
  if math.isinf(noise_scale):
    return batch_size / base_batch_size
  return (1.0 + noise_scale / base_batch_size) / (1.0 + noise_scale / batch_size)


def law_steps(steps_at_base: float, noise_scale: float, *, base_batch_size: int,
              batch_size: float) -> float:
  """McCandlish et al. 2018: the steps to a target at `batch_size`, anchored at the baseline's.

  S(B) = S(B0)·(1 + B_noise/B)/(1 + B_noise/B0) = S(B0)/gain: the law
  `adascale_gain` is written with, in steps.

  Example:
    >>> law_steps(1000, 100.0, base_batch_size=10, batch_size=1000)   # 1000 · (1 + 0.1) / (1 + 10)
    100.0
  """
  return steps_at_base / adascale_gain(noise_scale, base_batch_size, batch_size)


def expected_efficiency(noise_scale: float, base_batch_size: int, batch_size: int) -> float:
  """gain(k)/k: the fraction of the k-fold speed-up per step a larger batch delivers.

  1.0 means perfect scaling (k× fewer steps); 1/k means no fewer steps at all.

  Example:
    >>> expected_efficiency(1000.0, 100, 1000)
    0.55
  """
  gain = adascale_gain(noise_scale, base_batch_size, batch_size)
  return gain * base_batch_size / batch_size


def predicted_steps(noise_scale: float, *, base_batch_size: int, batch_size: int,
                    base_steps: int, warmup_steps: int = 0) -> int:
  """Steps DATE's adaptive mode needs at `batch_size` to cover `base_steps`.

  McCandlish et al.'s law, S(B) = S_min(1 + B_noise/B), gives the steps at B
  relative to B0 as 1/gain: after a warmup of `warmup_steps` W (the LR, and
  so the progress, ramps linearly: (W + 1)/2 gains in all), the rest of the
  baseline's steps go at `gain` per step.

  Example:
    >>> predicted_steps(1000.0, base_batch_size=100, batch_size=1000, base_steps=5500)
    1000
  """
  gain = adascale_gain(noise_scale, base_batch_size, batch_size)
  as_int("base_steps", base_steps, low=1)
  check_range("warmup_steps", warmup_steps, low=0)
  warmup_progress = gain * (warmup_steps + 1) / 2.0 if warmup_steps else 0.0
  if warmup_progress >= base_steps:  # the baseline ends inside the ramp: n(n+1) ≥ 2TW/r
    n = (math.sqrt(1.0 + 8.0 * base_steps * warmup_steps / gain) - 1.0) / 2.0
    return max(1, math.ceil(n - 1e-9))
  return warmup_steps + math.ceil((base_steps - warmup_progress) / gain - 1e-9)
