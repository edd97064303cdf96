"""DATE's adaptive mode: scale-invariant progress driven by the measured noise scale.

A tuned baseline (batch B0) has a learning-rate schedule lr0(τ) over T0 of its
own steps. At batch B = k·B0 one step is worth r_t baseline steps, with r_t
AdaScale's gain (Johnson et al. 2020, "AdaScale SGD: A User-Friendly Algorithm
for Distributed Training"), computed every step from the gradient noise scale
measured online (McCandlish et al. 2018, `dateopt.date.noise`):

    r_t   = (tr Σ/B0 + |G|²) / (tr Σ/B + |G|²)        ∈ [1, k]
    lr_t  = ramp_t · r_t^p · lr0(max(τ_t, W))          p = 1 ("linear") or ½ ("sqrt")
    τ_t+1 = τ_t + ramp_t · r_t                         progress, in baseline steps

Training ends when τ reaches T0, so the run chooses its own number of steps:
about T0/k below the noise scale, about T0 far above it.

The warmup is LEGW's (You et al., "Large-Batch Training for LSTM and Beyond",
SC'19): as many steps as the baseline's warmup W, a linear ramp from 0,
ramp_t = min(1, (t+1)/W); it replaces the baseline's own warmup, so lr0 is
read at max(τ, W). A step at a fraction of the target LR is credited that
fraction of its gain.

`adaptive` is a plain optax transformation: any training loop can use it,
passing the step's `GradientSqNorms` as `update(..., grad_sq_norms=...)`, the
way `divergence_guard` takes `value=`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dateopt.date.noise import (
    GradientSqNorms,
    NoiseScaleState,
    gain_from_estimates,
    init_noise_scale,
    update_noise_scale,
)
from dateopt.date.recipe import GAIN_RULES
from dateopt.validation import check_choice, check_range


class AdaptiveState(NamedTuple):
  """State of `adaptive`.

  Attributes:
    inner_state: the wrapped optimizer's state (an `optax.inject_hyperparams`
      state whose `learning_rate` this transformation sets every step).
    progress: τ, the baseline steps covered so far (float32).
    count: steps taken at the large batch (updates applied).
    noise: the gradient-noise-scale EMAs the gain comes from.
  """

  inner_state: Any
  progress: jax.Array
  count: jax.Array
  noise: NoiseScaleState


def _gain_multiplier(gain: jax.Array, gain_rule: str) -> jax.Array:
  return gain if gain_rule == "linear" else jnp.sqrt(gain)


def adaptive(
    make_optimizer: Callable[..., optax.GradientTransformation],
    base_schedule: optax.Schedule,
    *,
    base_batch_size: int,
    batch_size: int,
    base_steps: int,
    warmup_steps: int = 0,
    gain_rule: str = "linear",
    noise_decay: float = 0.99,
) -> optax.GradientTransformationExtraArgs:
  """The baseline's schedule, walked at the pace the measured noise scale allows.

  Args:
    make_optimizer: `make_optimizer(learning_rate) -> GradientTransformation`,
      the baseline's optimizer family (e.g. `lambda learning_rate:
      optax.adam(learning_rate)`); its first argument must be called
      `learning_rate`. It is wrapped in `optax.inject_hyperparams`.
    base_schedule: the baseline's LR schedule, in baseline steps.
    base_batch_size: B0, the batch the baseline was tuned at.
    batch_size: B, the batch this run trains at (≥ B0).
    base_steps: T0, the baseline's number of steps: training is done when
      the progress τ reaches it.
    warmup_steps: W, the baseline's warmup in steps (LEGW keeps it in steps).
    gain_rule: "linear" (lr × r, AdaScale's rule for SGD) or "sqrt" (lr × √r).
    noise_decay: EMA decay of the noise-scale estimates, per measurement. The
      default 0.99 (a ~100-measurement horizon) is measured: with 0.95 a
      64x Adam run on MNIST-1D read a passing loss bump as pure noise, its gain
      jumped from 18 to 48 and the run diverged; with 0.99 the same seed
      reached the baseline's accuracy (notes/step4_date_dynamic.md).

  Returns:
    A `GradientTransformationExtraArgs` with state `AdaptiveState`. Call
    `update(grads, state, params, grad_sq_norms=sq_norms)` with the step's
    `GradientSqNorms` (`grouped_value_and_grad`, `cross_replica_sq_norms`,
    or `no_measurement` on steps that do not measure). Once τ ≥ T0 every
    update is zero: check `progress_done(state, base_steps)` to stop.

  Example:
    >>> base = optax.cosine_decay_schedule(1e-2, 1000)
    >>> tx = adaptive(lambda learning_rate: optax.adam(learning_rate), base,
    ...               base_batch_size=32, batch_size=512, base_steps=1000)
    >>> params = {"w": jnp.ones(3)}
    >>> state = tx.init(params)
    >>> # |G|² = 1, tr Σ = 320 (B_noise = 320): r = (10 + 1)/(0.625 + 1)
    >>> sq = GradientSqNorms(1 + 320 / 64, 1 + 320 / 512, 64, 512)
    >>> updates, state = tx.update({"w": jnp.ones(3)}, state, params, grad_sq_norms=sq)
    >>> round(float(state.progress), 3)
    6.769
  """
  check_range("base_batch_size", base_batch_size, low=1)
  check_range("batch_size", batch_size, low=base_batch_size)
  check_range("base_steps", base_steps, low=1)
  check_range("warmup_steps", warmup_steps, low=0, high=base_steps, high_inclusive=False)
  check_choice("gain_rule", gain_rule, GAIN_RULES)
  check_range("noise_decay", noise_decay, low=0.0, high=1.0, high_inclusive=False)
  inner = optax.inject_hyperparams(make_optimizer)(learning_rate=0.0)

  def init_fn(params):
    return AdaptiveState(inner.init(params), jnp.zeros((), jnp.float32),
                         jnp.zeros((), jnp.int32), init_noise_scale())

  def update_fn(updates, state, params=None, *, grad_sq_norms: GradientSqNorms | None = None,
                **extra_args):
    noise = state.noise
    if grad_sq_norms is not None:  # static: either always given or never
      noise = update_noise_scale(noise, grad_sq_norms, noise_decay)
    gain = gain_from_estimates(noise, base_batch_size, batch_size)
    ramp = (jnp.minimum(1.0, (state.count + 1).astype(jnp.float32) / warmup_steps)
            if warmup_steps else jnp.float32(1.0))
    lr = ramp * _gain_multiplier(gain, gain_rule) * base_schedule(
        jnp.maximum(state.progress, float(warmup_steps)))

    def step():
      inner_state = optax.tree.set(state.inner_state, learning_rate=lr)
      new_updates, new_inner = inner.update(updates, inner_state, params, **extra_args)
      return new_updates, AdaptiveState(new_inner, state.progress + ramp * gain,
                                        state.count + 1, noise)

    def done():  # the baseline's schedule is covered: nothing more to apply
      return (jax.tree.map(jnp.zeros_like, updates),
              AdaptiveState(state.inner_state, state.progress, state.count, noise))

    return jax.lax.cond(state.progress >= base_steps, done, step)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def progress_done(opt_state: Any, base_steps: int) -> jax.Array:
  """Whether the `adaptive` optimizer somewhere in `opt_state` has covered `base_steps`."""
  return optax.tree.get(opt_state, "progress") >= base_steps
