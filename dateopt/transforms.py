"""Large-batch optax gradient transformations: LARS and LAMB trust ratios.

Every function returns an `optax.GradientTransformation` with a NamedTuple state,
so each drops into `optax.chain`, `optax.masked`, `optax.inject_hyperparams`,
`optax.MultiSteps`, `optax.apply_if_finite`, a Flax `TrainState` and an
`nnx.Optimizer`. The aliases `lars` and `lamb` are `optax.chain` calls over the
public building blocks below, so a user can re-compose them.

Norms are accumulated in float32 whatever the parameter dtype. With `axis_name`
set, squared norms are summed across that mapped axis (`jax.shard_map` or
`jax.pmap` with parameters sharded along it) in a single collective.

References:
  You, Gitman, Ginsburg, "Large Batch Training of Convolutional Networks"
  (LARS), arXiv 1708.03888, 2017.
  You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
  minutes" (LAMB), arXiv 1904.00962, 2019.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import optax

from dateopt import masks as masks_lib
from dateopt.validation import check_choice, check_range

ScalarOrSchedule = optax.ScalarOrSchedule  # optax's own alias, not a second one
#: A mapped axis name, or several, over which squared norms are summed; None for unsharded
#: parameters.
AxisName = Optional[Union[str, Sequence[str]]]

#: The trust-ratio denominators of `scale_by_lars_trust_ratio`, "paper" (‖g‖ + β‖w‖) and
#: "optax" (‖g + βw‖).
LARS_MODES = ("paper", "optax")


# ----------------------------------------------------------------------------
# Shared helpers.
# ----------------------------------------------------------------------------


def _value_at(value: ScalarOrSchedule, count: jax.Array) -> jax.Array:
  """A hyper-parameter's value at step `count` (schedules are called)."""
  return value(count) if callable(value) else value


def sum_of_squares(x: jax.Array) -> jax.Array:
  """Squared L2 norm in float32 (bf16/fp16 params would lose the sum).

  Example:
    >>> float(sum_of_squares(jnp.array([3.0, 4.0], jnp.bfloat16)))
    25.0
  """
  x = x.astype(jnp.float32)
  return jnp.sum(x * x)


def _paired_sq_norms(firsts: list[jax.Array], seconds: list[jax.Array],
                     axis_name: AxisName) -> tuple[jax.Array, jax.Array]:
  """Float32 squared norms of two lists of leaves, as two vectors.

  Stacking the scalars lets the per-leaf ratio arithmetic run as one small
  vector op instead of a handful of scalar kernels per leaf, and sums the
  shards' partial norms in one collective.
  """
  first_sq = jnp.stack([sum_of_squares(x) for x in firsts])
  second_sq = jnp.stack([sum_of_squares(x) for x in seconds])
  if axis_name is not None:
    first_sq, second_sq = jax.lax.psum((first_sq, second_sq), axis_name)
  return first_sq, second_sq


def _require_params(params: Any, who: str) -> None:
  if params is None:
    raise ValueError(f"{who} needs the current params: call update(updates, state, params).")


def _check_learning_rate(learning_rate: ScalarOrSchedule) -> None:
  check_range("learning_rate", learning_rate, low=0.0, allow_none=False)


def _check_momentum(momentum: Any) -> None:
  check_range("momentum", momentum, low=0.0, high=1.0, high_inclusive=False,
              allow_none=False)


def _check_mask_arg(mask: Any) -> None:
  """Masks must be static: reject numbers and arrays early (they are no masks)."""
  if isinstance(mask, (int, float)) and not isinstance(mask, bool):
    raise ValueError(
        f"mask must be None, a bool, a dateopt.masks.Mask, a regex string, a callable "
        f"or a bool pytree; got {mask!r}.")
  if isinstance(mask, str):
    masks_lib.from_name(mask)  # a misspelt mask name fails here, at construction


def _split_by_mask(mask: masks_lib.MaskLike, params: Any, *trees: Any):
  """Flattens `trees` (same structure as params) and returns (treedef, leaves..., flags)."""
  flags, treedef = jax.tree.flatten(masks_lib.resolve(mask, params))
  leaves = [treedef.flatten_up_to(t) for t in trees]
  return treedef, leaves, flags


# ----------------------------------------------------------------------------
# LARS.
# ----------------------------------------------------------------------------


class LarsTrustRatioState(NamedTuple):
  """State of `scale_by_lars_trust_ratio`: the step count (drives schedules)."""

  count: jax.Array


def lars_ratio_from_sq_norms(w_sq, grad_sq, *, weight_decay, trust_coefficient, eps=0.0,
                             mode="paper"):
  """λ = η‖w‖ / denominator from squared norms; 1 where ‖w‖ or the gradient norm is 0.

  `grad_sq` is ‖g‖² in mode "paper" (denominator ‖g‖ + β‖w‖ + eps) and
  ‖g + βw‖² in mode "optax" (denominator ‖g + βw‖ + eps).

  Example:
    >>> round(float(lars_ratio_from_sq_norms(25.0, 1.0, weight_decay=0.1,
    ...                                      trust_coefficient=0.001)), 6)  # 0.005/1.5
    0.003333
  """
  w_norm, grad_norm = jnp.sqrt(w_sq), jnp.sqrt(grad_sq)
  if mode == "paper":
    denominator = grad_norm + weight_decay * w_norm + eps
  else:  # "optax": the norm of the decayed gradient.
    denominator = grad_norm + eps
  ratio = trust_coefficient * w_norm / jnp.where(denominator > 0, denominator, 1.0)
  return jnp.where((w_norm > 0) & (grad_norm > 0), ratio, 1.0)


def _lars_leaf_ratios(grads, params, flags, *, weight_decay, trust_coefficient, eps,
                      mode, axis_name, clip_learning_rate=None):
  """Trust ratios of the selected leaves as (indices, float32 vector of λ)."""
  selected = [i for i, f in enumerate(flags) if f]
  if not selected:
    return selected, None
  if mode == "paper":
    others = [grads[i] for i in selected]
  else:  # "optax": the norm of the decayed gradient.
    others = [grads[i].astype(jnp.float32) + weight_decay * params[i].astype(jnp.float32)
              for i in selected]
  w_sq, other_sq = _paired_sq_norms([params[i] for i in selected], others, axis_name)
  ratios = lars_ratio_from_sq_norms(w_sq, other_sq, weight_decay=weight_decay,
                                    trust_coefficient=trust_coefficient, eps=eps, mode=mode)
  if clip_learning_rate is not None:
    ratios = _clip_to_learning_rate(ratios, clip_learning_rate)
  return selected, ratios


def lars_trust_ratios(
    grads: Any,
    params: Any,
    *,
    weight_decay: float = 0.0,
    trust_coefficient: float = 0.001,
    eps: float = 0.0,
    mode: str = "paper",
    mask: masks_lib.MaskLike = None,
    axis_name: AxisName = None,
) -> Any:
  """The LARS local LR λ of every leaf (float32 scalars; 1.0 where masked out).

  For logging and analysis: the same arithmetic `scale_by_lars_trust_ratio` uses.

  Example:
    >>> import jax.numpy as jnp
    >>> lars_trust_ratios({"w": jnp.array([0.8, -0.6])}, {"w": jnp.array([3., 4.])},
    ...                   weight_decay=0.1)["w"]   # 0.001 * 5 / (1 + 0.5)
    Array(0.00333333, dtype=float32)
  """
  check_choice("mode", mode, LARS_MODES)
  treedef, (g, w), flags = _split_by_mask(mask, params, grads, params)
  selected, ratios = _lars_leaf_ratios(g, w, flags, weight_decay=weight_decay,
                                       trust_coefficient=trust_coefficient, eps=eps, mode=mode,
                                       axis_name=axis_name)
  out = [jnp.ones((), jnp.float32)] * len(flags)
  for j, i in enumerate(selected):
    out[i] = ratios[j]
  return treedef.unflatten(out)


def scale_by_lars_trust_ratio(
    weight_decay: ScalarOrSchedule = 0.0,
    *,
    trust_coefficient: float = 0.001,
    eps: float = 0.0,
    mode: str = "paper",
    mask: masks_lib.MaskLike = masks_lib.exclude_bias_and_norm,
    axis_name: AxisName = None,
    clip_learning_rate: Optional[ScalarOrSchedule] = None,
) -> optax.GradientTransformation:
  """Scales each selected leaf's decayed gradient by the LARS trust ratio.

  For a selected leaf with weights w and gradient g (You et al. 2017, eq. 6)::

      λ = η·‖w‖ / (‖g‖ + β·‖w‖ + eps)      mode="paper" (default)
      λ = η·‖w‖ / (‖g + β·w‖ + eps)        mode="optax" (as optax.lars)
      output = λ · (g + β·w)

  λ = 1 where ‖w‖ or the gradient norm is 0. Leaves the mask leaves out (by
  default biases and normalisation parameters) pass through unchanged: no trust
  ratio, no weight decay. With `clip_learning_rate` (LARC, "trust_clip"),
  λ ← min(λ / lr, 1), so the local LR never exceeds the global one.

  Args:
    weight_decay: β, scalar or schedule.
    trust_coefficient: η > 0.
    eps: added to the denominator.
    mode: "paper" or "optax" denominator.
    mask: which leaves get the trust ratio and the decay (see `dateopt.masks`).
    axis_name: mapped axis to sum squared norms over when parameters are sharded.
    clip_learning_rate: the global LR (scalar or schedule) to clip against, or None.

  Example:
    >>> import optax, dateopt
    >>> tx = optax.chain(dateopt.scale_by_lars_trust_ratio(weight_decay=1e-4),
    ...                  optax.scale_by_learning_rate(0.1), optax.trace(0.9))
  """
  # None is no default here: it would reach the norm arithmetic and fail inside JAX.
  check_range("weight_decay", weight_decay, low=0.0, allow_none=False)
  check_range("trust_coefficient", trust_coefficient, low=0.0, low_inclusive=False,
              allow_none=False)
  check_range("eps", eps, low=0.0, allow_none=False)
  check_choice("mode", mode, LARS_MODES)
  _check_mask_arg(mask)
  if clip_learning_rate is not None:
    _check_learning_rate(clip_learning_rate)

  def init_fn(params):
    masks_lib.resolve(mask, params)  # validates the mask against the tree early.
    return LarsTrustRatioState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    _require_params(params, "scale_by_lars_trust_ratio")
    decay = _value_at(weight_decay, state.count)
    treedef, (g, w), flags = _split_by_mask(mask, params, updates, params)
    clip_lr = (None if clip_learning_rate is None
               else _value_at(clip_learning_rate, state.count))
    selected, ratios = _lars_leaf_ratios(g, w, flags, weight_decay=decay,
                                         trust_coefficient=trust_coefficient, eps=eps,
                                         mode=mode, axis_name=axis_name,
                                         clip_learning_rate=clip_lr)
    out = list(g)
    for j, i in enumerate(selected):
      out[i] = (ratios[j] * (g[i] + decay * w[i])).astype(g[i].dtype)
    return treedef.unflatten(out), LarsTrustRatioState(
        count=optax.safe_increment(state.count))

  return optax.GradientTransformation(init_fn, update_fn)


def _clip_to_learning_rate(ratio: jax.Array, lr: jax.Array) -> jax.Array:
  """LARC: min(λ/lr, 1); where lr is 0 the update is 0 anyway, keep λ finite."""
  lr = jnp.asarray(lr, jnp.float32)
  return jnp.where(lr > 0, jnp.minimum(ratio / jnp.where(lr > 0, lr, 1.0), 1.0), 1.0)


class MomentumState(NamedTuple):
  """State of `scale_by_momentum`.

  `trace` is the momentum buffer in the sign of the emitted step: −v with
  `flip_sign` (the default), so without Nesterov it equals the last update.
  """

  count: jax.Array
  trace: Any
  last_learning_rate: jax.Array


def scale_by_momentum(
    momentum: float = 0.9,
    nesterov: bool = False,
    *,
    correction_learning_rate: Optional[ScalarOrSchedule] = None,
    flip_sign: bool = True,
    accumulator_dtype: Optional[Any] = None,
) -> optax.GradientTransformation:
  """Heavy-ball momentum on already LR-scaled updates, emitting −v (paper order).

  ::

      v ← m·c·v + u          u: the LR-and-trust-scaled update
      out = −v               (Nesterov: −(u + m·v))

  `c` is 1, or with `correction_learning_rate` (NVIDIA's MLPerf "momentum
  correction") lr_t / lr_{t−1}, which keeps the buffer consistent when the LR
  changes. The buffer is kept in the sign of the emitted step (−v with
  `flip_sign`), so without Nesterov the update IS the new buffer: no separate
  sign-flip pass over every leaf (as `optax.sgd` makes). A jitted update alone
  returns the buffer and a plain copy of it; inside a train step the apply
  reads the buffer directly.

  Args:
    momentum: m in [0, 1).
    nesterov: Nesterov momentum.
    correction_learning_rate: the schedule (or scalar) whose ratio rescales v.
    flip_sign: emit −v (a descent step) rather than v.
    accumulator_dtype: dtype of v (default: the update's dtype).

  Example:
    >>> import optax, dateopt
    >>> tx = optax.chain(optax.scale_by_learning_rate(0.1, flip_sign=False),
    ...                  dateopt.scale_by_momentum(0.9))
  """
  _check_momentum(momentum)
  if correction_learning_rate is not None:
    _check_learning_rate(correction_learning_rate)
  sign = -1.0 if flip_sign else 1.0

  def init_fn(params):
    trace = jax.tree.map(
        lambda p: jnp.zeros_like(p, dtype=accumulator_dtype or p.dtype), params)
    return MomentumState(count=jnp.zeros([], jnp.int32), trace=trace,
                         last_learning_rate=jnp.zeros([], jnp.float32))

  def update_fn(updates, state, params=None):
    del params
    decay = momentum
    lr = jnp.zeros([], jnp.float32)
    if correction_learning_rate is not None:
      lr = jnp.asarray(_value_at(correction_learning_rate, state.count), jnp.float32)
      last = state.last_learning_rate
      decay = momentum * jnp.where(last > 0, lr / jnp.where(last > 0, last, 1.0), 1.0)

    # Flatten rather than tree.map into pairs: optax.masked's MaskedNode is a tuple too.
    u_leaves, treedef = jax.tree.flatten(updates)
    trace = treedef.flatten_up_to(state.trace)
    # b = sign·v, so b ← m·c·b + sign·u and (Nesterov) out = sign·u + m·b.
    new_trace = [(decay * b + sign * u).astype(b.dtype) for u, b in zip(u_leaves, trace)]
    steps = [sign * u + momentum * b if nesterov else b for u, b in zip(u_leaves, new_trace)]
    out = [s.astype(u.dtype) for s, u in zip(steps, u_leaves)]
    return treedef.unflatten(out), MomentumState(
        count=optax.safe_increment(state.count), trace=treedef.unflatten(new_trace),
        last_learning_rate=lr)

  return optax.GradientTransformation(init_fn, update_fn)


def lars(
    learning_rate: ScalarOrSchedule,
    *,
    momentum: float = 0.9,
    weight_decay: ScalarOrSchedule = 0.0,
    trust_coefficient: float = 0.001,
    eps: float = 0.0,
    nesterov: bool = False,
    mode: str = "paper",
    trust_clip: bool = False,
    momentum_correction: bool = False,
    mask: masks_lib.MaskLike = masks_lib.exclude_bias_and_norm,
    axis_name: AxisName = None,
) -> optax.GradientTransformation:
  """LARS: layer-wise adaptive rate scaling, in the paper's order (You et al. 2017).

  For each selected leaf l (global LR γ_t, momentum m, weight decay β, trust η)::

      λ_l = η‖w_l‖ / (‖g_l‖ + β‖w_l‖ + eps)        (mode="optax": η‖w‖/(‖g+βw‖+eps))
      v_l ← m·v_l + γ_t·λ_l·(g_l + β·w_l)          LR and trust ratio BEFORE momentum
      w_l ← w_l − v_l                              (Nesterov: − (γλ(g+βw) + m·v_l))

  Leaves the mask leaves out (default: batch-norm scale/bias and every bias, as
  in the MLPerf recipes) get plain momentum: v ← m·v + γ_t·g, no decay, no trust
  ratio. With `mask=None` and `mode="optax"` this equals `optax.lars`.

  Args:
    learning_rate: γ_t, a scalar or an optax schedule.
    momentum: m in [0, 1).
    weight_decay: β >= 0 (scalar or schedule).
    trust_coefficient: η > 0.
    eps: added to the trust-ratio denominator.
    nesterov: Nesterov momentum.
    mode: "paper" (default) or "optax" trust-ratio denominator.
    trust_clip: LARC clipping, λ ← min(λ/γ_t, 1).
    momentum_correction: rescale the buffer by γ_t/γ_{t−1} when the LR changes.
    mask: selects the leaves that get trust ratio and decay (`dateopt.masks`).
    axis_name: mapped axis for norms of sharded params (shard_map / pmap).

  Example:
    >>> import jax.numpy as jnp, optax, dateopt
    >>> tx = dateopt.lars(learning_rate=optax.linear_schedule(0.0, 8.0, 100),
    ...                   weight_decay=1e-4)
    >>> params = {"Dense_0": {"kernel": jnp.ones((4, 2)), "bias": jnp.zeros(2)}}
    >>> state = tx.init(params)
  """
  _check_learning_rate(learning_rate)
  _check_momentum(momentum)
  return optax.chain(
      scale_by_lars_trust_ratio(
          weight_decay=weight_decay, trust_coefficient=trust_coefficient, eps=eps,
          mode=mode, mask=mask, axis_name=axis_name,
          clip_learning_rate=learning_rate if trust_clip else None),
      optax.scale_by_learning_rate(learning_rate, flip_sign=False),
      scale_by_momentum(
          momentum, nesterov,
          correction_learning_rate=learning_rate if momentum_correction else None),
  )


# ----------------------------------------------------------------------------
# LAMB.
# ----------------------------------------------------------------------------


def scale_by_lamb_trust_ratio(
    trust_bounds: Optional[tuple[float, float]] = None,
    mask: masks_lib.MaskLike = masks_lib.exclude_bias_and_norm,
    axis_name: AxisName = None,
) -> optax.GradientTransformation:
  """Scales each selected leaf's update r by φ(‖w‖)/‖r‖ (LAMB, You et al. 2019).

  φ is the identity, or with `trust_bounds=(lo, hi)` a clip of ‖w‖ to [lo, hi].
  The ratio is 1 where either norm is 0; unselected leaves pass unchanged.

  Example:
    >>> import optax, dateopt
    >>> tx = optax.chain(optax.scale_by_adam(), dateopt.scale_by_lamb_trust_ratio())
  """
  _check_trust_bounds(trust_bounds)
  _check_mask_arg(mask)

  def init_fn(params):
    masks_lib.resolve(mask, params)
    return optax.EmptyState()  # the ratio needs no state

  def update_fn(updates, state, params=None):
    _require_params(params, "scale_by_lamb_trust_ratio")
    treedef, (r, w), flags = _split_by_mask(mask, params, updates, params)
    selected = [i for i, f in enumerate(flags) if f]
    out = list(r)
    if selected:
      w_sq, r_sq = _paired_sq_norms([w[i] for i in selected], [r[i] for i in selected],
                                    axis_name)
      w_norm, r_norm = jnp.sqrt(w_sq), jnp.sqrt(r_sq)
      phi = w_norm if trust_bounds is None else jnp.clip(w_norm, *trust_bounds)
      ratios = jnp.where((w_norm > 0) & (r_norm > 0),
                         phi / jnp.where(r_norm > 0, r_norm, 1.0), 1.0)
      for j, i in enumerate(selected):
        out[i] = (ratios[j] * r[i]).astype(r[i].dtype)
    return treedef.unflatten(out), state

  return optax.GradientTransformation(init_fn, update_fn)


def _check_trust_bounds(trust_bounds):
  if trust_bounds is None:
    return
  ok = (isinstance(trust_bounds, (tuple, list)) and len(trust_bounds) == 2
        and 0 <= trust_bounds[0] <= trust_bounds[1])
  if not ok:
    raise ValueError(
        f"trust_bounds must be None or a pair (lo, hi) with 0 <= lo <= hi; got {trust_bounds!r}.")


def scale_by_adam_moments(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6, *,
                          bias_correction: bool = True) -> optax.GradientTransformation:
  """Adam's m̂/(√v̂ + eps); `bias_correction=False` is LAMB paper v3 / the authors' code.

  With bias correction this is `optax.scale_by_adam` itself.

  Example:
    >>> tx = scale_by_adam_moments(bias_correction=False)
  """
  check_range("b1", b1, low=0.0, high=1.0, high_inclusive=False, allow_none=False)
  check_range("b2", b2, low=0.0, high=1.0, high_inclusive=False, allow_none=False)
  check_range("eps", eps, low=0.0, allow_none=False)
  if bias_correction:
    return optax.scale_by_adam(b1=b1, b2=b2, eps=eps)

  def init_fn(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros())

  def update_fn(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda g, m: b1 * m + (1 - b1) * g, updates, state.mu)
    nu = jax.tree.map(lambda g, v: b2 * v + (1 - b2) * g * g, updates, state.nu)
    out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return out, optax.ScaleByAdamState(count=optax.safe_increment(state.count), mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def clip_by_global_norm(max_norm: float, axis_name: AxisName = None
                        ) -> optax.GradientTransformation:
  """`optax.clip_by_global_norm`, with the norm summed across `axis_name` shards.

  Example:
    >>> tx = clip_by_global_norm(1.0)
  """
  check_range("max_norm", max_norm, low=0.0, low_inclusive=False, allow_none=False)
  if axis_name is None:
    return optax.clip_by_global_norm(max_norm)

  def update_fn(updates, state, params=None):
    del params
    leaves = jax.tree.leaves(updates)
    total = jax.lax.psum(sum(sum_of_squares(x) for x in leaves), axis_name)
    norm = jnp.sqrt(total)
    scale = jnp.where(norm > max_norm, max_norm / norm, 1.0)
    return jax.tree.map(lambda u: (u * scale).astype(u.dtype), updates), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn)


def lamb(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    *,
    eps: float = 1e-6,
    weight_decay: ScalarOrSchedule = 0.0,
    bias_correction: bool = True,
    trust_bounds: Optional[tuple[float, float]] = None,
    max_grad_norm: Optional[float] = None,
    mask: masks_lib.MaskLike = masks_lib.exclude_bias_and_norm,
    axis_name: AxisName = None,
) -> optax.GradientTransformation:
  """LAMB: Adam moments, decoupled weight decay, and a layer-wise trust ratio.

  ::

      m ← β1·m + (1−β1)·g ;  v ← β2·v + (1−β2)·g²
      r = m̂/(√v̂ + eps) + λ·w                 (m̂, v̂ bias-corrected unless disabled)
      w ← w − lr · φ(‖w‖)/‖r‖ · r

  Leaves the mask leaves out get no decay and no trust ratio (Adam step only),
  as the authors' code does for norm layers and biases. With `mask=None` this
  equals `optax.lamb`. `max_grad_norm` clips gradients to that global norm first
  (the authors' code uses 1.0).

  Example:
    >>> import dateopt
    >>> tx = dateopt.lamb(learning_rate=1e-3, weight_decay=0.01, max_grad_norm=1.0)

  Reference: You et al., arXiv 1904.00962 (v5 for bias correction).
  """
  _check_learning_rate(learning_rate)
  check_range("weight_decay", weight_decay, low=0.0, allow_none=False)
  _check_mask_arg(mask)
  transforms = []
  check_range("max_grad_norm", max_grad_norm, low=0.0, low_inclusive=False)
  if max_grad_norm is not None:
    transforms.append(clip_by_global_norm(max_grad_norm, axis_name))
  transforms += [
      scale_by_adam_moments(b1, b2, eps, bias_correction=bias_correction),
      optax.add_decayed_weights(weight_decay, mask=lambda p: masks_lib.resolve(mask, p)),
      scale_by_lamb_trust_ratio(trust_bounds, mask, axis_name),
      optax.scale_by_learning_rate(learning_rate),
  ]
  return optax.chain(*transforms)
