"""A divergence guard: skip bad steps, back the learning rate off, recover it.

The guard must never touch a healthy run, so a loss "spike" is measured in
units of the loss's own noise (a running mean and standard deviation of the
accepted losses), not as a fixed factor over the mean: a batch-32 loss late in
training is routinely several times its running mean (heavy-tailed
cross-entropy), which a fixed factor reads as divergence.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dateopt.validation import check_range

# Defaults, from the per-step training losses of healthy runs with the guard
# off (`scripts/guard_check.py` re-runs the main one). The statistic is
# z = (loss - mean) / std against the running statistics of the steps before.
# Worst z seen, with loss_decay=0.99 and min_steps=50:
#   MNIST-1D LSTM, Adam, batch 32, 7,500 steps (the main job's baseline), 3 seeds:
#     7.0, 7.6, 7.7 (isolated late-phase batches at 5-8x the mean loss);
#   MNIST-1D LSTM, Adam, batch 512 (DATE's 16x plan, 450 steps): 0.2;
#   MNIST-1D LSTM, SGD momentum 0.9, batch 32: 6.6;
#   digits tiny ResNet, LARS (momentum 0.9), batch 16 / 256: 8.5 / 3.2.
# The worst healthy z is 8.5, so the default threshold 20 is a margin of more
# than 2x over it; a diverging step is far beyond it (a loss back at chance,
# log(10) = 2.3, against a late mean of 0.05 +- 0.05 is z ~ 45). Three
# consecutive healthy steps never exceeded z = 4.5 together, so `patience`=3
# is another, independent margin before the LR is ever backed off. The
# relative excess (loss above (1 + 0.5) x mean) only matters where the loss
# barely varies (full-batch or late, well-converged training), where a tiny
# wobble would otherwise be many standard deviations.
_DEFAULT_SPIKE_THRESHOLD = 30.0
_DEFAULT_SPIKE_MIN_EXCESS = 0.5


class DivergenceGuardState(NamedTuple):
  """State of `divergence_guard`.

  Attributes:
    inner_state: the wrapped optimizer's state (unchanged by skipped steps).
    lr_multiplier: the factor applied to the inner updates, in (0, 1].
    loss_mean: running (exponentially weighted) mean of the accepted losses
      since the statistics last (re)started.
    loss_var: running variance of the same losses.
    loss_count: losses in the running statistics; spikes are detected once it
      reaches `min_steps`.
    num_accepted: accepted steps so far.
    consecutive_spikes: spikes in a row (a persistent one backs the LR off).
    num_nonfinite: skipped steps with a non-finite gradient, update or loss.
    num_spikes: skipped steps whose loss was a spike.
  """

  inner_state: Any
  lr_multiplier: jax.Array
  loss_mean: jax.Array
  loss_var: jax.Array
  loss_count: jax.Array
  num_accepted: jax.Array
  consecutive_spikes: jax.Array
  num_nonfinite: jax.Array
  num_spikes: jax.Array

  @property
  def num_skipped(self) -> jax.Array:
    """Every skipped step: non-finite ones and loss spikes."""
    return self.num_nonfinite + self.num_spikes


def _all_finite(tree: Any) -> jax.Array:
  leaves = jax.tree.leaves(tree)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves \
      else jnp.array(True)


def _select(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def _check_number(name: str, value: Any, *, integer: bool = False) -> None:
  """Raises TypeError naming `name` unless `value` is a real (integer) scalar."""
  kind = numbers.Integral if integer else numbers.Real
  dtype_kind = np.integer if integer else np.number
  is_scalar_array = (hasattr(value, "dtype") and np.ndim(value) == 0
                     and np.issubdtype(value.dtype, dtype_kind))
  if isinstance(value, bool) or not (isinstance(value, kind) or is_scalar_array):
    what = "an int" if integer else "a number"
    raise TypeError(f"{name} must be {what}; got {value!r} of type {type(value).__name__}.")


def divergence_guard(
    inner: optax.GradientTransformation,
    *,
    spike_threshold: float = _DEFAULT_SPIKE_THRESHOLD,
    spike_min_excess: float = _DEFAULT_SPIKE_MIN_EXCESS,
    loss_decay: float = 0.99,
    min_steps: int = 10,
    patience: int = 3,
    backoff: float = 0.5,
    recovery_steps: int = 100,
    min_multiplier: float = 1e-3,
) -> optax.GradientTransformationExtraArgs:
  """Wraps `inner`: skips diverging steps and scales the LR down, then back up.

  The loss comes through optax's extra-arguments convention:
  `update(grads, state, params, value=loss)`, also inside `optax.chain`; other
  extra arguments go through to `inner`. A step is skipped (zero update, inner
  state kept) when

  * the gradient, the inner update or the loss is non-finite: always, and the
    LR multiplier backs off at once; or
  * the loss is a spike: more than `spike_threshold` standard deviations AND
    more than `spike_min_excess` x |mean| above the running mean of the
    accepted losses (an exponentially weighted mean and variance with decay
    `loss_decay`, Finch 2009), once `min_steps` losses are in the statistics.

  A single spike is skipped without a back-off: it may be a bad batch, and
  skipping costs one batch. Since the parameters do not move while a step is
  skipped, the next batch then tests them again: a spike that persists for
  `patience` steps in a row was caused by the parameters (an earlier update
  damaged them), not by a batch. Then the LR multiplier backs off and the
  running statistics restart from the current loss (spike detection resumes
  after `min_steps` accepted steps), so training continues from the new level
  instead of skipping forever. Non-spike losses on accepted steps update the
  statistics; skipped ones do not.

  Each back-off multiplies the LR multiplier by `backoff` (floored at
  `min_multiplier`); each accepted step multiplies it by
  backoff^(-1/recovery_steps), up to 1, so one back-off is undone after
  `recovery_steps` accepted steps. Accepted updates are the inner ones times
  the multiplier (for SGD-like optimizers, a scaled learning rate); at
  multiplier 1 they are the inner updates bit for bit. Without `value=` only
  non-finite steps are caught.

  The defaults sit far above the loss noise of healthy runs: the worst
  healthy z-score measured (batch 16 to 512; Adam, SGD momentum and LARS) is
  8.5, the threshold is 20 and three spikes in a row are needed for a
  back-off (see the comment above `_DEFAULT_SPIKE_THRESHOLD`). Skipping loss
  spikes and lowering the LR on them is how PaLM (Chowdhery et al., 2022,
  arXiv:2204.02311, section 5.1) and OPT (Zhang et al., 2022,
  arXiv:2205.01068) got through divergences in large-batch training.

  Args:
    inner: the optimizer to guard.
    spike_threshold: a spike is more than this many running standard
      deviations above the running mean, > 0.
    spike_min_excess: ... and more than this fraction of |running mean|
      above it, >= 0 (guards the near-constant-loss case).
    loss_decay: decay of the running mean and variance, in (0, 1); the first
      1/(1 - loss_decay) losses are weighted equally.
    min_steps: losses in the statistics before spikes are detected, >= 2.
    patience: spikes in a row that back the LR off and restart the
      statistics, >= 1.
    backoff: factor applied to the LR multiplier at each back-off, in (0, 1).
    recovery_steps: accepted steps that undo one back-off, >= 1.
    min_multiplier: floor of the LR multiplier, in (0, 1].

  Raises:
    TypeError: an argument is not a number (or an int where one is needed),
      or `inner` is not an optax transformation.
    ValueError: an argument is out of its range.

  Example:
    >>> tx = divergence_guard(optax.sgd(0.1))
    >>> params = {"w": jnp.ones(2)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.array([jnp.nan, 1.0])}, state, params,
    ...                            value=jnp.float32(1.0))
    >>> updates["w"].tolist(), int(state.num_skipped), float(state.lr_multiplier)
    ([0.0, 0.0], 1, 0.5)
    >>> tx = divergence_guard(optax.sgd(0.1), min_steps=4)
    >>> state = tx.init(params)
    >>> for loss in [1.0, 1.1, 0.9, 1.0, 9.0]:  # noise around 1, then a spike
    ...   updates, state = tx.update({"w": jnp.ones(2)}, state, params, value=loss)
    >>> updates["w"].tolist(), int(state.num_spikes), float(state.lr_multiplier)
    ([0.0, 0.0], 1, 1.0)
  """
  if not isinstance(inner, optax.GradientTransformation):
    raise TypeError(f"inner must be an optax.GradientTransformation; got {inner!r} "
                    f"of type {type(inner).__name__}.")
  for name, value in (("spike_threshold", spike_threshold),
                      ("spike_min_excess", spike_min_excess), ("loss_decay", loss_decay),
                      ("backoff", backoff), ("min_multiplier", min_multiplier)):
    _check_number(name, value)
  for name, value in (("min_steps", min_steps), ("patience", patience),
                      ("recovery_steps", recovery_steps)):
    _check_number(name, value, integer=True)
  check_range("spike_threshold", spike_threshold, low=0.0, low_inclusive=False)
  check_range("spike_min_excess", spike_min_excess, low=0.0)
  check_range("loss_decay", loss_decay, low=0.0, high=1.0, low_inclusive=False,
              high_inclusive=False)
  check_range("min_steps", min_steps, low=2)
  check_range("patience", patience, low=1)
  check_range("backoff", backoff, low=0.0, high=1.0, low_inclusive=False,
              high_inclusive=False)
  check_range("recovery_steps", recovery_steps, low=1)
  check_range("min_multiplier", min_multiplier, low=0.0, high=1.0, low_inclusive=False)
  inner = optax.with_extra_args_support(inner)
  growth = backoff ** (-1.0 / recovery_steps)

  def init_fn(params):
    zero, zero_f = jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32)
    return DivergenceGuardState(
        inner_state=inner.init(params), lr_multiplier=jnp.ones((), jnp.float32),
        loss_mean=zero_f, loss_var=zero_f, loss_count=zero, num_accepted=zero,
        consecutive_spikes=zero, num_nonfinite=zero, num_spikes=zero)

  def update_fn(updates, state, params=None, *, value=None, **extra_args):
    if value is not None and jnp.ndim(value) != 0:
      raise ValueError(f"divergence_guard: value= must be the scalar loss; got shape "
                       f"{jnp.shape(value)}.")
    # Accepted steps must come out bit for bit as without the guard, and XLA
    # rounds differently once a select (jnp.where) sits between the gradient
    # and the inner optimizer, or between it and `optax.apply_updates`: it
    # splits the fused multiply-adds. So the inner update is first computed only
    # to test its finiteness, a non-finite step swaps the gradient for zeros
    # through `lax.cond` (which leaves the fusion of the accepted path alone),
    # and a skip multiplies the (then finite) update by a scalar 0.
    import os; V = os.environ.get("GV", "A")
    if V in ("A", "C"):
      probe, _ = inner.update(updates, state.inner_state, params, value=value, **extra_args)
      finite = _all_finite(updates) & _all_finite(probe)
      grads = jax.lax.cond(finite, lambda g: g, lambda g: jax.tree.map(jnp.zeros_like, g),
                           updates)
    else:
      grads = updates
    new_updates, new_inner = inner.update(grads, state.inner_state, params, value=value,
                                          **extra_args)
    if V not in ("A", "C"):
      finite = _all_finite(updates) & _all_finite(new_updates)
    if value is None:  # static: no loss, no spike test
      loss = state.loss_mean
      spike = jnp.array(False)
    else:
      loss = jnp.asarray(value, jnp.float32)
      finite &= jnp.isfinite(loss)
      excess = loss - state.loss_mean
      spike = (finite & (state.loss_count >= min_steps)
               & (excess > spike_threshold * jnp.sqrt(state.loss_var))
               & (excess > spike_min_excess * jnp.abs(state.loss_mean)))
    accept = finite & ~spike
    # Non-finite steps keep the streak: the parameters have not moved either.
    streak = jnp.where(spike, state.consecutive_spikes + 1,
                       jnp.where(finite, 0, state.consecutive_spikes))
    persistent = spike & (streak >= patience)

    multiplier = state.lr_multiplier
    scale = jnp.where(accept, multiplier, 0.0)
    if V == "A":
      out = jax.tree.map(lambda u: (u * scale).astype(u.dtype), new_updates)
    elif V in ("B", "C"):
      out = jax.tree.map(lambda u: jnp.where(accept, jnp.where(multiplier == 1.0, u, (u * multiplier).astype(u.dtype)), jnp.zeros_like(u)), new_updates)
    elif V == "F":
      out = jax.tree.map(lambda u: jnp.where(~accept, jnp.zeros_like(u), jnp.where(multiplier == 1.0, u, (u * multiplier).astype(u.dtype))), new_updates)
    elif V == "G":
      out = jax.tree.map(lambda u: jnp.where(accept & (multiplier == 1.0), u, jnp.where(accept, u, jnp.zeros_like(u)) * multiplier), new_updates)
    elif V == "I":
      idx = jnp.where(accept, jnp.where(multiplier == 1.0, 1, 2), 0)
      out = jax.tree.map(lambda u: jax.lax.select_n(idx, jnp.zeros_like(u), u, (u * multiplier).astype(u.dtype)), new_updates)
    elif V == "K":
      out = jax.tree.map(lambda u: jnp.where(scale == 1.0, u, jnp.where(accept, (u * multiplier).astype(u.dtype), jnp.zeros_like(u))), new_updates)
    elif V == "M":
      keep = accept & (multiplier == 1.0)
      out = jax.tree.map(lambda u: jnp.where(keep, u, jnp.where(accept, (u * multiplier).astype(u.dtype), 0.0).astype(u.dtype)), new_updates)
    elif V == "D":
      out = jax.tree.map(lambda u: jnp.where(accept & (multiplier == 1.0), u, jnp.where(accept, (u * multiplier).astype(u.dtype), jnp.zeros_like(u))), new_updates)
    next_multiplier = jnp.where(
        ~finite | persistent, jnp.maximum(multiplier * backoff, min_multiplier),
        jnp.where(accept, jnp.minimum(multiplier * growth, 1.0), multiplier))

    # Exponentially weighted mean and variance; the first 1/(1 - loss_decay)
    # losses get equal weights, so the early estimates are not biased to 0.
    weight = jnp.maximum(1.0 - loss_decay, 1.0 / (state.loss_count + 1).astype(jnp.float32))
    delta = loss - state.loss_mean
    mean = state.loss_mean + weight * delta
    var = (1.0 - weight) * (state.loss_var + weight * delta * delta)
    update_stats = accept & (value is not None)  # without a loss: nothing to average
    mean = jnp.where(update_stats, mean, jnp.where(persistent, loss, state.loss_mean))
    var = jnp.where(update_stats, var, jnp.where(persistent, 0.0, state.loss_var))
    count = jnp.where(update_stats, state.loss_count + 1,
                      jnp.where(persistent, 1, state.loss_count))
    as_int = lambda b: b.astype(jnp.int32)
    new_state = DivergenceGuardState(
        inner_state=_select(accept, new_inner, state.inner_state),
        lr_multiplier=next_multiplier,
        loss_mean=mean,
        loss_var=var,
        loss_count=count,
        num_accepted=state.num_accepted + as_int(accept),
        consecutive_spikes=jnp.where(persistent, 0, streak),
        num_nonfinite=state.num_nonfinite + as_int(~finite),
        num_spikes=state.num_spikes + as_int(spike),
    )
    return out, new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
