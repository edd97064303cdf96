"""A divergence guard: skip bad steps, back the learning rate off, recover it.

The guard must never touch a healthy run, so a loss spike is measured in units
of the loss's own noise (a running mean and standard deviation of the accepted
losses), not as a fixed factor over the mean: a batch-32 loss late in training
is routinely several times its running mean (heavy-tailed cross-entropy),
which a fixed factor reads as divergence. `divergence_guard`'s rules:

* A step whose gradient, inner update or loss is non-finite is skipped (zero
  update, inner state kept) and backs the LR multiplier off.
* A loss is a spike when it is more than `spike_threshold` standard deviations
  AND more than `spike_min_excess` x |mean| above the reference level: the
  lowest running mean of the accepted losses, with the running standard
  deviation at that point (`running_weight`), once `min_steps` losses are in
  the statistics. Measuring from the lowest level, not the current one, keeps a
  steady divergence from hiding in statistics that follow it up.
* A single spike is accepted, and left out of the statistics: the loss is
  measured before the step, so one high batch says nothing about the
  parameters, and healthy runs have such batches. A spike that persists for
  `patience` steps in a row is the parameters' fault: that step is skipped, the
  LR multiplier backs off, and the statistics re-base on the new level (its
  mean is the current loss, its spread keeps its size relative to the mean), so
  training goes on and a divergence that keeps growing is caught again.
* Each back-off multiplies the LR multiplier by `backoff` (floored at
  `min_multiplier`); each accepted step multiplies it by
  backoff^(-1/recovery_steps), up to 1, so one back-off is undone after
  `recovery_steps` accepted steps. At multiplier 1 the update is the inner one
  as it is, so a healthy run trains exactly as without the guard.

Skipping loss spikes and lowering the LR is how PaLM (Chowdhery et al., 2022,
arXiv:2204.02311, section 5.1) and OPT (Zhang et al., 2022, arXiv:2205.01068)
got through divergences in large-batch training.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dateopt.validation import check_range, check_scalar

# A spike is a loss more than _DEFAULT_SPIKE_THRESHOLD standard deviations and
# _DEFAULT_SPIKE_MIN_EXCESS above its running level, 3 steps in a row: single spikes are
# healthy heavy tails, and the excess keeps a near-constant loss (a label-smoothing floor)
# from counting a harmless wobble as many deviations. The threshold is 3x the worst
# z-score of healthy runs with the guard off (docs/results/guard.md).
_DEFAULT_SPIKE_THRESHOLD = 20.0
_DEFAULT_SPIKE_MIN_EXCESS = 0.5
#: The floor of the divergence guard's LR multiplier: ten back-offs of 0.5 reach it (0.5**10 <
#: 1e-3).
DEFAULT_MIN_MULTIPLIER = 1e-3


class LossMoments(NamedTuple):
  """A running mean and variance of a loss: the one loss tracker of the divergence guard and
  of DATE's divergence watch (`track_loss`).

  Attributes:
    count: the losses taken in.
    mean: their running mean (`running_weight`).
    var: their running variance.
  """

  count: jax.Array
  mean: jax.Array
  var: jax.Array


def init_loss_moments() -> LossMoments:
  zero_f = jnp.zeros((), jnp.float32)
  return LossMoments(jnp.zeros((), jnp.int32), zero_f, zero_f)


def track_loss(moments: LossMoments, loss: jax.Array, decay: float, *,
               take: jax.Array | bool = True) -> LossMoments:
  """The moments after `loss` where `take`, else as they were.

  The first 1/(1 − decay) losses weigh equally, later ones exponentially
  (`running_weight`; Finch 2009, "Incremental calculation of weighted mean and
  variance").

  Example:
    >>> moments = init_loss_moments()
    >>> for loss in (1.0, 2.0, 3.0):
    ...   moments = track_loss(moments, jnp.float32(loss), 0.9)
    >>> int(moments.count), float(moments.mean), round(float(moments.var), 4)
    (3, 2.0, 0.6667)
  """
  count = moments.count + 1
  weight = running_weight(count, decay)
  delta = loss - moments.mean
  tracked = LossMoments(count, moments.mean + weight * delta,
                        (1.0 - weight) * (moments.var + weight * delta * delta))
  return jax.tree.map(lambda new, old: jnp.where(take, new, old), tracked, moments)


class DivergenceGuardState(NamedTuple):
  """State of `divergence_guard`.

  Attributes:
    inner_state: the wrapped optimizer's state (unchanged by skipped steps).
    lr_multiplier: the factor applied to the inner updates, in (0, 1].
    loss: the running mean and variance of the accepted losses, spikes left out
      (`track_loss`); spikes are detected once `min_steps` are in.
    ref_mean: the reference level spikes are measured from: the lowest running
      mean since the statistics started (or re-based).
    ref_var: the running variance at that point.
    num_accepted: accepted steps so far.
    consecutive_spikes: spikes in a row so far.
    num_nonfinite: skipped steps with a non-finite gradient, update or loss.
    num_spikes: skipped steps at which a spike had persisted for `patience`
      steps (each backed the LR off and re-based the statistics).
  """

  inner_state: Any
  lr_multiplier: jax.Array
  loss: LossMoments
  ref_mean: jax.Array
  ref_var: jax.Array
  num_accepted: jax.Array
  consecutive_spikes: jax.Array
  num_nonfinite: jax.Array
  num_spikes: jax.Array

  @property
  def num_skipped(self) -> jax.Array:
    """Every skipped step (each one backed the LR off)."""
    return self.num_nonfinite + self.num_spikes


def running_weight(count: jax.Array, decay: float) -> jax.Array:
  """The weight of the newest of `count` losses in a running mean at `decay`.

  The first 1/(1 − decay) losses weigh equally (an exact mean, not biased to 0
  as a plain EMA from 0 is), later ones exponentially (Finch 2009, "Incremental
  calculation of weighted mean and variance"). The divergence guard's loss
  statistics and the divergence watch's loss means share it.

    >>> [round(float(running_weight(jnp.int32(n), 0.9)), 2) for n in (1, 2, 5, 20)]
    [1.0, 0.5, 0.2, 0.1]
  """
  return jnp.maximum(1.0 - decay, 1.0 / jnp.maximum(count, 1).astype(jnp.float32))


def all_finite(tree: Any) -> jax.Array:
  """Whether every entry of every leaf of `tree` is finite (True for an empty tree)."""
  leaves = jax.tree.leaves(tree)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves \
      else jnp.array(True)


def _select(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def _check_number(name: str, value: Any, *, integer: bool = False) -> None:
  """Raises TypeError naming `name` unless `value` is a real (or integer) scalar."""
  kind, dtype_kind = (numbers.Integral, np.integer) if integer else (numbers.Real, np.number)
  scalar_array = (hasattr(value, "dtype") and np.ndim(value) == 0
                  and np.issubdtype(value.dtype, dtype_kind))
  if isinstance(value, bool) or not (isinstance(value, kind) or scalar_array):
    what = "an int" if integer else "a number"
    raise TypeError(f"{name} must be {what}; got {value!r} of type {type(value).__name__}.")


def _check_guard_arguments(inner: Any, *, spike_threshold: float, spike_min_excess: float,
                           patience: int, loss_decay: float, min_steps: int, backoff: float,
                           recovery_steps: int, min_multiplier: float) -> None:
  """`divergence_guard`'s arguments, each error naming its argument (see there)."""
  if not isinstance(inner, optax.GradientTransformation):
    raise TypeError(f"inner must be an optax.GradientTransformation; got {inner!r} "
                    f"of type {type(inner).__name__}.")
  for name, value in (("spike_threshold", spike_threshold),
                      ("spike_min_excess", spike_min_excess), ("loss_decay", loss_decay),
                      ("backoff", backoff), ("min_multiplier", min_multiplier)):
    _check_number(name, value)
  for name, value in (("patience", patience), ("min_steps", min_steps),
                      ("recovery_steps", recovery_steps)):
    _check_number(name, value, integer=True)
  check_range("spike_threshold", spike_threshold, low=0.0, low_inclusive=False)
  check_range("spike_min_excess", spike_min_excess, low=0.0)
  check_range("patience", patience, low=1)
  check_range("loss_decay", loss_decay, low=0.0, high=1.0, low_inclusive=False,
              high_inclusive=False)
  check_range("min_steps", min_steps, low=2)
  check_range("backoff", backoff, low=0.0, high=1.0, low_inclusive=False,
              high_inclusive=False)
  check_range("recovery_steps", recovery_steps, low=1)
  check_range("min_multiplier", min_multiplier, low=0.0, high=1.0, low_inclusive=False)


def divergence_guard(
    inner: optax.GradientTransformation,
    *,
    spike_threshold: float = _DEFAULT_SPIKE_THRESHOLD,
    spike_min_excess: float = _DEFAULT_SPIKE_MIN_EXCESS,
    patience: int = 3,
    loss_decay: float = 0.99,
    min_steps: int = 20,
    backoff: float = 0.5,
    recovery_steps: int = 100,
    min_multiplier: float = DEFAULT_MIN_MULTIPLIER,
) -> optax.GradientTransformationExtraArgs:
  """Wraps `inner`: skips diverging steps and scales the LR down, then back up.

  The loss comes as `update(grads, state, params, value=loss)` (optax's extra arguments, also
  inside `optax.chain`); without it only non-finite steps are caught. The rules (a spike, a
  back-off, the recovery) are the module's docstring's.

  Args:
    inner: the optimizer to guard.
    spike_threshold: a spike is more than this many reference standard deviations above the
      reference mean, > 0; spike_min_excess: ... and more than this share of it, >= 0.
    patience: spikes in a row that back the LR off, >= 1.
    loss_decay: the running statistics' decay, in (0, 1) (`running_weight`).
    min_steps: losses in the statistics before spikes are detected, >= 2.
    backoff: each back-off's factor on the LR multiplier, in (0, 1).
    recovery_steps: accepted steps that undo one back-off, >= 1.
    min_multiplier: floor of the LR multiplier, in (0, 1].

  Raises:
    TypeError: `inner` is not an optax transformation, or an argument is not a number (an
      int, for `patience`, `min_steps`, `recovery_steps`).
    ValueError: an argument is outside its range; at trace time, a non-scalar `value=`.

  Example:
    >>> tx = divergence_guard(optax.sgd(0.5), min_steps=4, patience=2)
    >>> params, grads = {"w": jnp.ones(2)}, {"w": jnp.ones(2)}
    >>> state = tx.init(params)
    >>> for loss in [1.0, 1.1, 0.9, 1.0, 9.0]:  # noise around 1, then a spike
    ...   updates, state = tx.update(grads, state, params, value=loss)
    >>> updates["w"].tolist(), int(state.num_skipped)  # one spike: accepted
    ([-0.5, -0.5], 0)
    >>> updates, state = tx.update(grads, state, params, value=9.0)  # it persists
    >>> updates["w"].tolist(), int(state.num_spikes), float(state.lr_multiplier)
    ([0.0, 0.0], 1, 0.5)
    >>> nan_grads = {"w": jnp.array([jnp.nan, 1.0])}
    >>> updates, state = tx.update(nan_grads, state, params, value=9.0)
    >>> updates["w"].tolist(), int(state.num_nonfinite), float(state.lr_multiplier)
    ([0.0, 0.0], 1, 0.25)
  """
  settings = _GuardSettings(spike_threshold, spike_min_excess, patience, loss_decay, min_steps,
                            backoff, recovery_steps, min_multiplier)
  _check_guard_arguments(inner, **settings._asdict())
  inner = optax.with_extra_args_support(inner)
  return optax.GradientTransformationExtraArgs(
      lambda params: _guard_init(inner, params),
      lambda updates, state, params=None, *, value=None, **extra_args: _guard_update(
          inner, settings, updates, state, params, value, extra_args))


class _GuardSettings(NamedTuple):
  """`divergence_guard`'s arguments, as one value."""
  spike_threshold: float
  spike_min_excess: float
  patience: int
  loss_decay: float
  min_steps: int
  backoff: float
  recovery_steps: int
  min_multiplier: float


def _guard_init(inner: optax.GradientTransformationExtraArgs, params) -> DivergenceGuardState:
  zero, zero_f = jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32)
  return DivergenceGuardState(
      inner_state=inner.init(params), lr_multiplier=jnp.ones((), jnp.float32),
      loss=init_loss_moments(), ref_mean=zero_f, ref_var=zero_f,
      num_accepted=zero, consecutive_spikes=zero, num_nonfinite=zero, num_spikes=zero)


def _guard_update(inner, settings: _GuardSettings, updates, state: DivergenceGuardState,
                  params, value, extra_args):
  """One guarded step: the inner update, accepted (times the LR multiplier) or skipped."""
  if value is not None:
    check_scalar("divergence_guard: value=", value, what="the scalar loss")
  # `lr_multiplier=`: the share of its LR the step gets, for `date.adaptive`'s progress.
  new_updates, new_inner = inner.update(updates, state.inner_state, params, value=value,
                                        lr_multiplier=state.lr_multiplier, **extra_args)
  finite = all_finite(updates) & all_finite(new_updates)
  loss = state.loss.mean if value is None else jnp.asarray(value, jnp.float32)
  if value is None:  # static: no loss, no spike test, no statistics
    spike = jnp.array(False)
  else:
    finite &= jnp.isfinite(loss)
    spike = finite & _is_spike(state, loss, settings)
  # Non-finite steps keep the streak: the parameters have not moved either.
  streak = jnp.where(spike, state.consecutive_spikes + 1,
                     jnp.where(finite, 0, state.consecutive_spikes))
  persistent = spike & (streak >= settings.patience)
  accept = finite & ~persistent
  averaged = accept & ~spike & (value is not None)  # spikes stay out of the statistics
  as_int = lambda b: b.astype(jnp.int32)
  statistics = _loss_statistics(state, loss, settings, averaged=averaged, rebase=persistent)
  return _scaled(new_updates, accept, state.lr_multiplier), state._replace(
      inner_state=_select(accept, new_inner, state.inner_state),
      lr_multiplier=_next_multiplier(state.lr_multiplier, accept, settings),
      **statistics,
      num_accepted=state.num_accepted + as_int(accept),
      consecutive_spikes=jnp.where(persistent, 0, streak),
      num_nonfinite=state.num_nonfinite + as_int(~finite),
      num_spikes=state.num_spikes + as_int(persistent))


def _is_spike(state: DivergenceGuardState, loss, settings: _GuardSettings) -> jax.Array:
  """A loss more than the threshold's deviations and the minimal excess above the reference,
  once the statistics hold `min_steps` losses."""
  excess = loss - state.ref_mean
  return ((state.loss.count >= settings.min_steps)
          & (excess > settings.spike_threshold * jnp.sqrt(state.ref_var))
          & (excess > settings.spike_min_excess * jnp.abs(state.ref_mean)))


def _scaled(new_updates, accept, multiplier):
  """The accepted updates times the multiplier; zeros for a skipped step.

  At multiplier 1 the inner update is selected as it is, not multiplied by 1.0: XLA then
  compiles the inner optimizer as it does without the guard, and a healthy run's parameters
  stay bit-identical (a multiply, even by 1.0, changes its fusion and the rounding of the last
  bits). Measured with schedules and `inject_hyperparams` (all of `date.build`); with a
  constant Python-float LR, XLA:CPU fuses the unguarded update into a multiply-add with
  `apply_updates`, and the last bits can differ.
  """
  return jax.tree.map(
      lambda u: jnp.where(
          accept, jnp.where(multiplier == 1.0, u, (u * multiplier).astype(u.dtype)),
          jnp.zeros_like(u)),
      new_updates)


def _next_multiplier(multiplier, accept, settings: _GuardSettings):
  """Up by backoff^(-1/recovery_steps) (to 1) after an accepted step, × backoff (to the
  floor) after a skipped one."""
  growth = settings.backoff ** (-1.0 / settings.recovery_steps)
  return jnp.where(accept, jnp.minimum(multiplier * growth, 1.0),
                   jnp.maximum(multiplier * settings.backoff, settings.min_multiplier))


def _loss_statistics(state: DivergenceGuardState, loss, settings: _GuardSettings, *,
                     averaged, rebase) -> dict[str, Any]:
  """The running moments and the reference level after the step: `averaged` takes the loss
  in (`track_loss`), `rebase` (a persistent spike) re-bases on it, the spread keeping its
  size relative to the mean; else they stay."""
  tracked = track_loss(state.loss, loss, settings.loss_decay)
  new_ref = (tracked.count <= settings.min_steps) | (tracked.mean < state.ref_mean)
  ref_mean = jnp.where(new_ref, tracked.mean, state.ref_mean)
  ref_var = jnp.where(new_ref, tracked.var, state.ref_var)
  rebased_var = state.ref_var * jnp.square(loss / jnp.maximum(jnp.abs(state.ref_mean), 1e-30))
  rebased = state.loss._replace(mean=loss, var=rebased_var)
  keep = lambda new, rebased, old: jax.tree.map(
      lambda n, r, o: jnp.where(averaged, n, jnp.where(rebase, r, o)), new, rebased, old)
  return {"loss": keep(tracked, rebased, state.loss),
          "ref_mean": keep(ref_mean, loss, state.ref_mean),
          "ref_var": keep(ref_var, rebased_var, state.ref_var)}
