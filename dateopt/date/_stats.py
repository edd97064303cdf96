"""Training statistics for DATE's dynamic part: what a trainer logs on log steps.

Cheap, jit-safe numbers: the global gradient norm, a min/median/max summary of
the per-layer LARS trust ratios, and the update-to-parameter norm ratio.
`track_statistics(tx)` wraps an optimizer and keeps them in its state;
`statistics(opt_state)` reads them back, with the gradient noise scale of
whichever `dateopt.date._noise` EMAs the state holds (`date.adaptive` or
`measure_noise_scale`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dateopt import masks, transforms
from dateopt.date._divergence import as_optax_state
from dateopt.date._noise import NoiseScaleState, noise_scale, tree_sq_norm
from dateopt.validation import check_range

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
  """

  grad_norm: jax.Array
  update_norm: jax.Array
  param_norm: jax.Array
  update_to_param_ratio: jax.Array
  trust_ratio_min: jax.Array
  trust_ratio_median: jax.Array
  trust_ratio_max: jax.Array


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
      param_sq[i], grad_sq[i], weight_decay=weight_decay, trust_coefficient=trust_coefficient)
      for i in chosen])
  return jnp.min(ratios), jnp.median(ratios), jnp.max(ratios)


def compute_statistics(
    grads: Any, updates: Any, params: Any, *, trust_coefficient: float = 0.001, weight_decay: float = 0.0,
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
  return TrainingStatistics(grad_norm, update_norm, param_norm,
                            update_norm / param_norm, trust_min, trust_median,
                            trust_max)


class StatisticsState(NamedTuple):
  """State of `track_statistics`: the inner state and the last recorded step's stats."""

  inner_state: Any
  stats: TrainingStatistics


def track_statistics(
    inner: optax.GradientTransformation,
    *,
    trust_coefficient: float = 0.001,
    weight_decay: float = 0.0,
    mask: masks.MaskLike = masks.exclude_bias_and_norm,
) -> optax.GradientTransformationExtraArgs:
  """Wraps `inner` and records `TrainingStatistics` in the state.

  The update is `inner`'s, unchanged. The extra argument `record=` (a traced
  bool) computes the statistics only on the steps that log them: on the
  others the state keeps the last ones and the step skips their norms.
  Without it they are computed every step. Other extra arguments (e.g.
  `value=` for `divergence_guard`, `grad_sq_norms=` for `date.adaptive`)
  are passed on to `inner`. Read the numbers with `statistics(opt_state)`.

  Args:
    inner: the optimizer to observe.
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
  # The logged ratios are LARS's: η > 0 and β ≥ 0, as `transforms.lars` takes them.
  check_range("trust_coefficient", trust_coefficient, low=0.0, low_inclusive=False)
  check_range("weight_decay", weight_decay, low=0.0)
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    nan = jnp.full((), jnp.nan, jnp.float32)
    return StatisticsState(inner.init(params),
                           TrainingStatistics(*[nan] * len(TrainingStatistics._fields)))

  def update_fn(updates, state, params=None, *, record=None, **extra_args):
    if params is None:
      raise ValueError("track_statistics needs params: call update(updates, state, params).")
    new_updates, inner_state = inner.update(updates, state.inner_state, params,
                                            **extra_args)

    def current():
      return compute_statistics(updates, new_updates, params,
                                trust_coefficient=trust_coefficient,
                                weight_decay=weight_decay, mask=mask)

    stats = current() if record is None else jax.lax.cond(record, current,
                                                          lambda: state.stats)
    return new_updates, StatisticsState(inner_state, stats)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def statistics(opt_state: Any) -> dict[str, jax.Array]:
  """The latest statistics found anywhere in `opt_state`, as a flat dict.

  `TrainingStatistics` fields (from `track_statistics`) and `noise_scale`
  (B_noise from the noise EMAs of `date.adaptive` or `measure_noise_scale`),
  whichever the state holds; an empty dict when it holds neither. `opt_state`
  may be a Flax nnx `Optimizer` or its `opt_state` (`as_optax_state`).

  Example:
    >>> tx = track_statistics(optax.sgd(0.1))
    >>> sorted(statistics(tx.init({"w": jnp.ones(2)})))[:2]
    ['grad_norm', 'param_norm']
  """
  out, opt_state = {}, as_optax_state(opt_state)
  stats = optax.tree.get(opt_state, "stats")
  if stats is not None:
    out.update(stats._asdict())
  noise = optax.tree.get(opt_state, NoiseScaleState.__name__)
  if noise is not None:
    out["noise_scale"] = noise_scale(noise)
  return out
