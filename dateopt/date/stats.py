"""Training statistics for DATE's dynamic part, and the gradient noise scale.

Cheap, jit-safe numbers a trainer logs every step: the global gradient norm,
a min/median/max summary of the per-layer LARS trust ratios, the
update-to-parameter norm ratio, and the gradient noise scale B_noise of
McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training"),
estimated from per-replica and global squared gradient norms and smoothed with
an EMA. `track_statistics(tx)` wraps an optimizer and keeps them in its state.

With |G_s|² the squared norm of a per-replica gradient (batch B_small) and
|G_b|² that of the cross-replica mean (batch B_big), E|G_B|² = |G|² + tr(Σ)/B
for a batch-B gradient (Σ: per-example gradient covariance), so

    |G|²   ≈ (B_big·|G_b|² − B_small·|G_s|²) / (B_big − B_small)
    tr(Σ)  ≈ (|G_s|² − |G_b|²) / (1/B_small − 1/B_big)
    B_noise = tr(Σ)/|G|²

Both estimates are noisy; their EMAs are smoothed separately and B_noise is the
ratio of the EMAs (as McCandlish et al. do).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dateopt import masks, transforms
from dateopt.validation import check_range

# --------------------------------------------------------------------------
# Squared norms and the gradient noise scale.
# --------------------------------------------------------------------------


class GradientSqNorms(NamedTuple):
  """Squared gradient norms at two batch sizes, the input of the noise scale.

  Attributes:
    small: |G_s|², the squared norm of a batch-`small_batch_size` gradient
      (averaged over replicas: each replica's value is an estimate).
    big: |G_b|², the squared norm of the batch-`big_batch_size` gradient.
    small_batch_size: the per-replica batch size.
    big_batch_size: the global batch size.
  """

  small: jax.Array
  big: jax.Array
  small_batch_size: Any
  big_batch_size: Any


def tree_sq_norm(tree: Any) -> jax.Array:
  """Σ of squared entries over every leaf, accumulated in float32."""
  return sum((transforms.sum_of_squares(x) for x in jax.tree.leaves(tree)),
             jnp.zeros((), jnp.float32))


def noise_estimates(sq_norms: GradientSqNorms) -> tuple[jax.Array, jax.Array]:
  """Unbiased estimates (|G|², tr Σ) from squared norms at two batch sizes.

  McCandlish et al. 2018, appendix A (REFERENCE.md §6).

  Example:
    >>> # |G|² = 2, tr Σ = 30: E|G_10|² = 2 + 3, E|G_80|² = 2 + 0.375
    >>> [float(x) for x in noise_estimates(GradientSqNorms(5.0, 2.375, 10, 80))]
    [2.0, 30.0]
  """
  b_small = jnp.asarray(sq_norms.small_batch_size, jnp.float32)
  b_big = jnp.asarray(sq_norms.big_batch_size, jnp.float32)
  small = jnp.asarray(sq_norms.small, jnp.float32)
  big = jnp.asarray(sq_norms.big, jnp.float32)
  grad_sq = (b_big * big - b_small * small) / (b_big - b_small)
  trace = (small - big) / (1.0 / b_small - 1.0 / b_big)
  return grad_sq, trace


def cross_replica_sq_norms(
    local_grads: Any, axis_name: Any, local_batch_size: int
) -> tuple[Any, GradientSqNorms]:
  """Averages per-replica gradients across `axis_name` and measures both norms.

  For a data-parallel step under `jax.shard_map` or `jax.pmap`: the
  per-replica squared norm costs one extra scalar `pmean` next to the gradient
  all-reduce. Under `shard_map` with `check_vma=True`, gradients with respect
  to replicated params come back already summed; take them with respect to
  `jax.lax.pcast(params, axis_name, to="varying")` to get per-replica ones.

  Args:
    local_grads: this replica's gradient (mean over its `local_batch_size`
      examples).
    axis_name: the data-parallel mapped axis.
    local_batch_size: examples per replica.

  Returns:
    `(grads, sq_norms)`: the cross-replica mean gradient, and the
    `GradientSqNorms` for `noise_estimates` / `track_statistics`.

  Example:
    >>> # inside a shard_map'd train step over axis "data":
    >>> # grads, sq_norms = cross_replica_sq_norms(local_grads, "data", 32)
  """
  small = jax.lax.pmean(tree_sq_norm(local_grads), axis_name)
  grads = jax.lax.pmean(local_grads, axis_name)
  num_replicas = jax.lax.psum(1, axis_name)
  return grads, GradientSqNorms(small, tree_sq_norm(grads), local_batch_size,
                                local_batch_size * num_replicas)


def grouped_value_and_grad(
    loss_fn: Callable[..., Any], num_groups: int, *, has_aux: bool = False
) -> Callable[..., tuple[Any, Any, GradientSqNorms]]:
  """`jax.value_and_grad` over `num_groups` equal slices of the batch.

  The `jax.jit` + `Mesh` counterpart of `cross_replica_sq_norms`: the batch
  (leading axis) is split into groups, one gradient per group is taken with
  `vmap`, and the mean gradient plus the squared norms at group and full batch
  size come back. With `num_groups` equal to the number of devices on the data
  axis, each device holds one group's gradient, as in any data-parallel step.
  `loss_fn` must average over its batch; losses and aux are averaged over
  groups.

  Args:
    loss_fn: `loss_fn(params, batch, *args) -> loss` (or `(loss, aux)`).
    num_groups: how many slices; must divide the batch size.
    has_aux: as in `jax.value_and_grad`.

  Returns:
    `fn(params, batch, *args) -> (value, grads, sq_norms)`.

  Example:
    >>> loss = lambda w, b: jnp.mean((b["x"] @ w - b["y"]) ** 2)
    >>> batch = {"x": jnp.ones((8, 2)), "y": jnp.zeros(8)}
    >>> value, grads, sq = grouped_value_and_grad(loss, 4)(jnp.ones(2), batch)
    >>> float(value), sq.small_batch_size, sq.big_batch_size
    (4.0, 2, 8)
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
    values, group_grads = jax.vmap(grad_fn, in_axes=in_axes)(params, groups, *args)
    small = jnp.mean(jax.vmap(tree_sq_norm)(group_grads))
    grads = jax.tree.map(lambda g: jnp.mean(g, axis=0), group_grads)
    value = jax.tree.map(lambda v: jnp.mean(v, axis=0), values)
    return value, grads, GradientSqNorms(small, tree_sq_norm(grads), group_size,
                                         batch_size)

  return fn


class NoiseScaleState(NamedTuple):
  """EMAs (not bias-corrected) of the |G|² and tr Σ estimates, and their count."""

  grad_sq_ema: jax.Array
  trace_ema: jax.Array
  count: jax.Array


def init_noise_scale() -> NoiseScaleState:
  """An empty noise-scale state (no measurement yet)."""
  zero = jnp.zeros((), jnp.float32)
  return NoiseScaleState(zero, zero, jnp.zeros((), jnp.int32))


def update_noise_scale(
    state: NoiseScaleState, sq_norms: GradientSqNorms, decay: float = 0.99
) -> NoiseScaleState:
  """Folds one measurement into the EMAs; non-finite measurements are ignored.

  Example:
    >>> s = update_noise_scale(init_noise_scale(), GradientSqNorms(5.0, 2.375, 10, 80))
    >>> round(float(noise_scale(s)), 4)   # 30 / 2
    15.0
  """
  grad_sq, trace = noise_estimates(sq_norms)
  ok = jnp.isfinite(grad_sq) & jnp.isfinite(trace)
  ema = lambda old, new: jnp.where(ok, decay * old + (1.0 - decay) * new, old)
  return NoiseScaleState(ema(state.grad_sq_ema, grad_sq), ema(state.trace_ema, trace),
                         state.count + ok.astype(jnp.int32))


def noise_scale(state: NoiseScaleState) -> jax.Array:
  """B_noise = tr Σ / |G|² from the EMAs (NaN before the first measurement).

  The EMAs' bias corrections are equal and cancel in the ratio. Late in
  training |G|² is small and its unbiased estimate can average to <= 0: the
  noise then dominates the signal, the limit of the ratio, +inf, is returned
  rather than a meaningless negative batch size.
  """
  ratio = state.trace_ema / jnp.where(state.grad_sq_ema > 0, state.grad_sq_ema, 1.0)
  ratio = jnp.where(state.grad_sq_ema > 0, ratio, jnp.inf)
  return jnp.where(state.count > 0, ratio, jnp.nan)


# --------------------------------------------------------------------------
# What a noise scale predicts for a larger batch.
# --------------------------------------------------------------------------


def adascale_gain(noise_scale: float, base_batch_size: int, batch_size: int) -> float:
  """AdaScale's gain of `batch_size` over `base_batch_size` (Johnson et al. 2020).

  r = (tr Σ_0 + |G|²)/(tr Σ_0/S + |G|²) with S = batch_size/base_batch_size
  and Σ_0 = Σ/base_batch_size the covariance of a baseline-batch gradient, i.e.
  r = (1 + B_noise/B0)/(1 + B_noise/B): how many baseline steps one step at the
  larger batch is worth (McCandlish et al. 2018). r ≈ S below the noise scale,
  r ≈ 1 far above it.

  Example:
    >>> adascale_gain(1000.0, 100, 1000)
    5.5
  """
  check_range("noise_scale", noise_scale, low=0.0, low_inclusive=False)
  check_range("base_batch_size", base_batch_size, low=0, low_inclusive=False)
  check_range("batch_size", batch_size, low=0, low_inclusive=False)
  noise_scale = float(noise_scale)
  return (1.0 + noise_scale / base_batch_size) / (1.0 + noise_scale / batch_size)


def expected_efficiency(noise_scale: float, base_batch_size: int, batch_size: int) -> float:
  """gain(S)/S: the fraction of the S-fold speed-up per step a larger batch delivers.

  1.0 means perfect scaling (S× fewer steps); 1/S means no fewer steps at all.

  Example:
    >>> expected_efficiency(1000.0, 100, 1000)
    0.55
  """
  gain = adascale_gain(noise_scale, base_batch_size, batch_size)
  return gain * base_batch_size / batch_size


# --------------------------------------------------------------------------
# Per-step statistics and the wrapper that keeps them in the optimizer state.
# --------------------------------------------------------------------------


class TrainingStatistics(NamedTuple):
  """One step's statistics (float32 scalars), for logging.

  Attributes:
    grad_norm: global L2 norm of the gradient.
    update_norm: global L2 norm of the update the optimizer returned.
    param_norm: global L2 norm of the parameters before the update.
    update_to_param_ratio: update_norm / param_norm.
    trust_ratio_min: smallest LARS trust ratio η‖w‖/(‖g‖+β‖w‖) over the masked-in
      layers (1.0 for a layer whose norms are 0).
    trust_ratio_median: their median.
    trust_ratio_max: their largest.
    noise_scale: EMA-smoothed B_noise (NaN until squared norms are supplied).
  """

  grad_norm: jax.Array
  update_norm: jax.Array
  param_norm: jax.Array
  update_to_param_ratio: jax.Array
  trust_ratio_min: jax.Array
  trust_ratio_median: jax.Array
  trust_ratio_max: jax.Array
  noise_scale: jax.Array


def trust_ratio_summary(
    grads: Any, params: Any, *, trust_coefficient: float = 0.001,
    weight_decay: float = 0.0, mask: masks.MaskLike = masks.exclude_bias_and_norm,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(min, median, max) of the LARS trust ratios of the layers `mask` selects.

  The paper denominator of `dateopt.transforms.lars_trust_ratios`. Falls back
  to every layer when the mask selects none.

  Example:
    >>> g, w = {"w": jnp.array([[0.8, -0.6]])}, {"w": jnp.array([[3.0, 4.0]])}
    >>> [round(float(x), 6) for x in trust_ratio_summary(g, w, weight_decay=0.1)]
    [0.003333, 0.003333, 0.003333]
  """
  flags = jax.tree.leaves(masks.resolve(mask, params))
  return _summarise_trust_ratios(_leaf_sq_norms(grads), _leaf_sq_norms(params), flags,
                                 trust_coefficient=trust_coefficient,
                                 weight_decay=weight_decay)


def _leaf_sq_norms(tree: Any) -> list[jax.Array]:
  return [transforms.sum_of_squares(x) for x in jax.tree.leaves(tree)]


def _summarise_trust_ratios(grad_sq, param_sq, flags, *, trust_coefficient, weight_decay):
  """(min, median, max) of λ over the flagged leaves (every leaf if none is flagged)."""
  chosen = [i for i, f in enumerate(flags) if f is True] or range(len(flags))
  ratios = jnp.stack([transforms.lars_ratio_from_sq_norms(
      param_sq[i], grad_sq[i], None, weight_decay, trust_coefficient, 0.0, "paper")
      for i in chosen])
  return jnp.min(ratios), jnp.median(ratios), jnp.max(ratios)


def compute_statistics(
    grads: Any, updates: Any, params: Any, *, noise: NoiseScaleState | None = None,
    trust_coefficient: float = 0.001, weight_decay: float = 0.0,
    mask: masks.MaskLike = masks.exclude_bias_and_norm,
) -> TrainingStatistics:
  """The `TrainingStatistics` of one step, from its gradient, update and params.

  Example:
    >>> p, g = {"w": jnp.ones((2, 2))}, {"w": jnp.full((2, 2), 0.5)}
    >>> s = compute_statistics(g, {"w": -0.1 * g["w"]}, p)
    >>> float(s.grad_norm), round(float(s.update_to_param_ratio), 6)
    (1.0, 0.05)
  """
  # Each leaf's squared norm once: the global norms and the trust ratios share them.
  grad_sq, param_sq = _leaf_sq_norms(grads), _leaf_sq_norms(params)
  grad_norm = jnp.sqrt(sum(grad_sq))
  update_norm = jnp.sqrt(tree_sq_norm(updates))
  param_norm = jnp.sqrt(sum(param_sq))
  trust_min, trust_median, trust_max = _summarise_trust_ratios(
      grad_sq, param_sq, jax.tree.leaves(masks.resolve(mask, params)),
      trust_coefficient=trust_coefficient, weight_decay=weight_decay)
  b_noise = noise_scale(noise) if noise is not None else jnp.float32(jnp.nan)
  return TrainingStatistics(grad_norm, update_norm, param_norm,
                            update_norm / param_norm, trust_min, trust_median,
                            trust_max, b_noise)


class StatisticsState(NamedTuple):
  """State of `track_statistics`: the inner state, last step's stats, noise EMAs."""

  inner_state: Any
  stats: TrainingStatistics
  noise: NoiseScaleState


def track_statistics(
    inner: optax.GradientTransformation,
    *,
    noise_decay: float = 0.99,
    trust_coefficient: float = 0.001,
    weight_decay: float = 0.0,
    mask: masks.MaskLike = masks.exclude_bias_and_norm,
) -> optax.GradientTransformationExtraArgs:
  """Wraps `inner` and records `TrainingStatistics` in the state every step.

  The update is `inner`'s, unchanged. Pass the step's `GradientSqNorms` (from
  `cross_replica_sq_norms` or `grouped_value_and_grad`) as the extra argument
  `grad_sq_norms=` to update the noise-scale EMAs (McCandlish et al. 2018);
  without it the noise scale is left as it was. The extra argument `record=`
  (a traced bool) computes the statistics only on the steps that log them: on
  the others the state keeps the last ones, and the step skips their norms
  (the noise EMAs still update every step). Other extra arguments (e.g.
  `value=` for `divergence_guard`) are passed on to `inner`. Read the numbers
  from `state.stats`, or `statistics(opt_state)` anywhere in a nested state.

  Args:
    inner: the optimizer to observe.
    noise_decay: EMA decay of the noise-scale estimates.
    trust_coefficient: η of the logged LARS trust ratios.
    weight_decay: β of the logged LARS trust ratios.
    mask: layers that count in the trust-ratio summary.

  Example:
    >>> tx = track_statistics(optax.sgd(0.1))
    >>> params = {"w": jnp.ones((2, 2))}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.ones((2, 2))}, state, params)
    >>> float(state.stats.grad_norm)
    2.0
  """
  check_range("noise_decay", noise_decay, low=0.0, high=1.0, high_inclusive=False)
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    nan = jnp.full((), jnp.nan, jnp.float32)
    return StatisticsState(inner.init(params), TrainingStatistics(*[nan] * 8),
                           init_noise_scale())

  def update_fn(updates, state, params=None, *, grad_sq_norms=None, record=None,
                **extra_args):
    if params is None:
      raise ValueError("track_statistics needs params: call update(updates, state, params).")
    new_updates, inner_state = inner.update(updates, state.inner_state, params,
                                            **extra_args)
    noise = state.noise
    if grad_sq_norms is not None:  # static: either always given or never
      noise = update_noise_scale(noise, grad_sq_norms, noise_decay)

    def current():
      return compute_statistics(updates, new_updates, params, noise=noise,
                                trust_coefficient=trust_coefficient,
                                weight_decay=weight_decay, mask=mask)

    def previous():  # the last recorded step's, with today's noise estimate
      return state.stats._replace(noise_scale=noise_scale(noise))

    stats = current() if record is None else jax.lax.cond(record, current, previous)
    return new_updates, StatisticsState(inner_state, stats, noise)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def statistics(opt_state: Any) -> dict[str, jax.Array]:
  """The latest `TrainingStatistics` found anywhere in `opt_state`, as a dict.

  Example:
    >>> tx = track_statistics(optax.sgd(0.1))
    >>> sorted(statistics(tx.init({"w": jnp.ones(2)})))[:2]
    ['grad_norm', 'noise_scale']
  """
  found = [s for s in jax.tree.leaves(opt_state,
                                      is_leaf=lambda x: isinstance(x, StatisticsState))
           if isinstance(s, StatisticsState)]
  if not found:
    raise ValueError("opt_state holds no StatisticsState: wrap the optimizer "
                     "with track_statistics.")
  return found[0].stats._asdict()
