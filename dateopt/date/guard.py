"""A divergence guard: skip bad steps, back the learning rate off, recover it."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dateopt.validation import check_range


class DivergenceGuardState(NamedTuple):
  """State of `divergence_guard`.

  Attributes:
    inner_state: the wrapped optimizer's state (unchanged by skipped steps).
    lr_multiplier: the factor applied to the inner updates, in (0, 1].
    loss_ema: running average of accepted losses.
    num_accepted: accepted steps so far.
    consecutive_skips: skipped steps since the last accepted one.
    num_skipped: every trigger (non-finite or spike) so far.
    num_nonfinite: triggers caused by a non-finite gradient, update or loss.
    num_spikes: triggers caused by a loss spike.
  """

  inner_state: Any
  lr_multiplier: jax.Array
  loss_ema: jax.Array
  num_accepted: jax.Array
  consecutive_skips: jax.Array
  num_skipped: jax.Array
  num_nonfinite: jax.Array
  num_spikes: jax.Array


def _all_finite(tree: Any) -> jax.Array:
  leaves = jax.tree.leaves(tree)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves \
      else jnp.array(True)


def _select(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def divergence_guard(
    inner: optax.GradientTransformation,
    *,
    spike_factor: float = 2.0,
    loss_ema_decay: float = 0.99,
    backoff: float = 0.5,
    recovery_steps: int = 100,
    patience: int = 3,
    min_multiplier: float = 1e-3,
) -> optax.GradientTransformationExtraArgs:
  """Wraps `inner`: skips diverging steps and scales the LR down, then back up.

  The loss comes through optax's extra-arguments convention:
  `update(grads, state, params, value=loss)`, also inside `optax.chain`. A step
  is skipped (zero update, inner state kept) when the gradient, the inner
  update or the loss is non-finite, or when the loss exceeds `spike_factor`
  times its running average. Each trigger multiplies the LR multiplier by
  `backoff` (floored at `min_multiplier`); each accepted step multiplies it by
  backoff^(-1/recovery_steps), up to 1, so one back-off is undone after
  `recovery_steps` good steps. Accepted updates are the inner ones times the
  multiplier (for SGD-like optimizers, a scaled learning rate).

  The loss is measured at the current parameters, so a spike that persists
  (the previous step already damaged them) is not a bad batch: after
  `patience` consecutive spike skips the running average restarts from the
  current loss and training continues at the backed-off rate. Non-finite steps
  are always skipped. Without `value=` only non-finite steps are caught.

  Args:
    inner: the optimizer to guard.
    spike_factor: a loss above spike_factor × running average is a spike.
    loss_ema_decay: decay of the loss running average.
    backoff: multiplier applied to the LR multiplier at each trigger.
    recovery_steps: accepted steps that undo one back-off.
    patience: spike skips in a row before the running average restarts.
    min_multiplier: floor of the LR multiplier.

  Example:
    >>> tx = divergence_guard(optax.sgd(0.1))
    >>> params = {"w": jnp.ones(2)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.array([jnp.nan, 1.0])}, state, params,
    ...                            value=jnp.float32(1.0))
    >>> updates["w"].tolist(), int(state.num_skipped), float(state.lr_multiplier)
    ([0.0, 0.0], 1, 0.5)
  """
  check_range("spike_factor", spike_factor, low=1.0, low_inclusive=False)
  check_range("loss_ema_decay", loss_ema_decay, low=0.0, high=1.0, high_inclusive=False)
  check_range("backoff", backoff, low=0.0, high=1.0, low_inclusive=False,
              high_inclusive=False)
  check_range("recovery_steps", recovery_steps, low=1)
  check_range("patience", patience, low=0)
  check_range("min_multiplier", min_multiplier, low=0.0, high=1.0, low_inclusive=False)
  inner = optax.with_extra_args_support(inner)
  growth = backoff ** (-1.0 / recovery_steps)

  def init_fn(params):
    zero = jnp.zeros((), jnp.int32)
    return DivergenceGuardState(inner.init(params), jnp.ones((), jnp.float32),
                                jnp.zeros((), jnp.float32), zero, zero, zero, zero, zero)

  def update_fn(updates, state, params=None, *, value=None, **extra_args):
    new_updates, new_inner = inner.update(updates, state.inner_state, params,
                                          value=value, **extra_args)
    loss = jnp.float32(0.0) if value is None else jnp.asarray(value, jnp.float32)
    finite = _all_finite(updates) & _all_finite(new_updates) & jnp.isfinite(loss)
    spike = finite & (state.num_accepted > 0) & (loss > spike_factor * state.loss_ema)
    if value is None:  # static: no loss, no spike test
      spike = jnp.array(False)
    # A spike that outlasts `patience` skips is the new level, not a bad batch.
    rebase = spike & (state.consecutive_skips >= patience)
    skip = ~finite | (spike & ~rebase)

    multiplier = state.lr_multiplier
    scaled = jax.tree.map(lambda u: (u * multiplier).astype(u.dtype), new_updates)
    out = _select(skip, jax.tree.map(jnp.zeros_like, new_updates), scaled)
    next_multiplier = jnp.where(
        skip, jnp.maximum(multiplier * backoff, min_multiplier),
        jnp.where(rebase, multiplier, jnp.minimum(multiplier * growth, 1.0)))
    ema = jnp.where(state.num_accepted > 0,
                    loss_ema_decay * state.loss_ema + (1.0 - loss_ema_decay) * loss, loss)
    ema = jnp.where(skip, state.loss_ema, jnp.where(rebase, loss, ema))
    as_int = lambda b: b.astype(jnp.int32)
    new_state = DivergenceGuardState(
        inner_state=_select(skip, state.inner_state, new_inner),
        lr_multiplier=next_multiplier,
        loss_ema=ema,
        num_accepted=state.num_accepted + as_int(~skip),
        consecutive_skips=jnp.where(skip, state.consecutive_skips + 1, 0),
        num_skipped=state.num_skipped + as_int(skip),
        num_nonfinite=state.num_nonfinite + as_int(~finite),
        num_spikes=state.num_spikes + as_int(spike & ~rebase),
    )
    return out, new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
