"""Learning-rate schedules and batch-size scaling rules.

Every schedule here is a plain optax schedule: a function `step -> learning rate`
built from `jnp` operations on the step, so it runs under `jax.jit` and inside
any optax optimizer (`optax.sgd(schedule)`, `dateopt.lars(schedule)`, ...).

Shapes are a linear warmup joined to a decay (polynomial, cosine, exponential,
multi-step, constant). Factories that speak in epochs convert through one
function, `epochs_to_steps`, so a trainer, a `Recipe` and a schedule always
agree on where an epoch ends.

Scaling rules for a batch grown k-fold from a tuned baseline:
  * linear (Goyal et al. 2017): peak LR x k, 5-epoch warmup.
  * sqrt: peak LR x sqrt(k), warmup unchanged.
  * LEGW (You et al., "Large-Batch Training for LSTM and Beyond", SC'19):
    peak LR x sqrt(k) and warmup x k epochs: the same warmup in steps for
    every k.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax.numpy as jnp
import optax

from dateopt.validation import check_choice, check_range

Schedule = Callable[[jnp.ndarray | int], jnp.ndarray]

SCALING_RULES = ("linear", "sqrt", "none")
DECAYS = ("polynomial", "cosine", "exponential", "multistep", "constant")

# Goyal et al. 2017: a 5-epoch gradual warmup and x0.1 at epochs 30, 60, 80.
GOYAL_WARMUP_EPOCHS = 5.0
GOYAL_DECAY_EPOCHS = (30.0, 60.0, 80.0)


# --------------------------------------------------------------------------
# Batch-size scaling rules.
# --------------------------------------------------------------------------


def _check_batch_sizes(base_batch_size, batch_size) -> None:
  check_range("base_batch_size", base_batch_size, low=0, low_inclusive=False)
  check_range("batch_size", batch_size, low=0, low_inclusive=False)


def scale_learning_rate(
    base_lr: float, base_batch_size: int, batch_size: int, rule: str = "linear"
) -> float:
  """Scales a learning rate tuned at `base_batch_size` to `batch_size`.

  With k = batch_size / base_batch_size: "linear" returns k·base_lr (Goyal et
  al. 2017, "Accurate, Large Minibatch SGD"), "sqrt" returns √k·base_lr (the
  SGD step's covariance is lr²Σ/B, so holding it fixed needs lr ∝ √B; the
  peak rule of LEGW, You et al. SC'19), "none" returns base_lr.

  Args:
    base_lr: the learning rate tuned at the baseline batch size.
    base_batch_size: the baseline batch size (> 0).
    batch_size: the target batch size (> 0).
    rule: "linear", "sqrt" or "none".

  Returns:
    The scaled learning rate, a Python float.

  Example:
    >>> scale_learning_rate(0.1, 256, 8192, "linear")
    3.2
  """
  check_range("base_lr", base_lr, low=0.0)
  _check_batch_sizes(base_batch_size, batch_size)
  check_choice("rule", rule, SCALING_RULES)
  k = batch_size / base_batch_size
  factor = {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[rule]
  return float(base_lr) * factor


def legw_warmup_epochs(
    base_warmup_epochs: float, base_batch_size: int, batch_size: int
) -> float:
  """LEGW's warmup length: k·base_warmup_epochs epochs for a k-fold batch.

  In steps this is base_warmup_epochs·N/base_batch_size for every k (You et
  al., "Large-Batch Training for LSTM and Beyond", SC'19).

  Example:
    >>> legw_warmup_epochs(0.3125, 1024, 32768)
    10.0
  """
  check_range("base_warmup_epochs", base_warmup_epochs, low=0.0)
  _check_batch_sizes(base_batch_size, batch_size)
  return float(base_warmup_epochs) * batch_size / base_batch_size


# --------------------------------------------------------------------------
# Epochs and steps: the one converter.
# --------------------------------------------------------------------------


def steps_per_epoch(
    num_examples: int, batch_size: int, drop_remainder: bool = True
) -> int:
  """Number of optimizer steps in one pass over `num_examples` examples.

  Args:
    num_examples: examples in the training set (> 0).
    batch_size: global batch size (> 0).
    drop_remainder: True drops the last partial batch (floor), False keeps it
      as a smaller step (ceil).

  Example:
    >>> steps_per_epoch(1_281_167, 1024), steps_per_epoch(1_281_167, 1024, False)
    (1251, 1252)
  """
  check_range("num_examples", num_examples, low=0, low_inclusive=False)
  check_range("batch_size", batch_size, low=0, low_inclusive=False)
  if drop_remainder:
    steps = num_examples // batch_size
  else:
    steps = -(-num_examples // batch_size)
  if steps < 1:
    raise ValueError(
        f"batch_size must be <= num_examples when drop_remainder is True; got "
        f"batch_size={batch_size}, num_examples={num_examples}.")
  return int(steps)


def epochs_to_steps(
    epochs: float, num_examples: int, batch_size: int, drop_remainder: bool = True
) -> int:
  """Converts a (possibly fractional) number of epochs to optimizer steps.

  steps = round(epochs · steps_per_epoch(num_examples, batch_size,
  drop_remainder)), rounding halves up. Every epoch→step conversion in dateopt
  goes through this function.

  Example:
    >>> epochs_to_steps(0.3125, 1_281_167, 1024)   # 0.3125 · 1251 = 390.9
    391
  """
  check_range("epochs", epochs, low=0.0)
  per_epoch = steps_per_epoch(num_examples, batch_size, drop_remainder)
  return int(math.floor(float(epochs) * per_epoch + 0.5))


# --------------------------------------------------------------------------
# Building blocks: warmup shapes and decays (a decay's step 0 is the end of
# the warmup).
# --------------------------------------------------------------------------


def _as_float(step) -> jnp.ndarray:
  return jnp.asarray(step, dtype=jnp.float32)


def linear_warmup(
    peak_value: float, warmup_steps: int, init_value: float = 0.0
) -> Schedule:
  """Linear ramp from `init_value` at step 0 to `peak_value` at `warmup_steps`.

  Goyal et al. 2017 ramp from the small-batch LR; the TPU reference code and
  LEGW ramp from 0: `init_value` chooses. Held at `peak_value` afterwards.

  Example:
    >>> float(linear_warmup(1.0, 10)(5))
    0.5
  """
  check_range("warmup_steps", warmup_steps, low=0)
  if warmup_steps == 0:
    return constant(peak_value)

  def schedule(step):
    fraction = jnp.clip(_as_float(step) / warmup_steps, 0.0, 1.0)
    return jnp.float32(init_value) + (peak_value - init_value) * fraction

  return schedule


def constant(value: float) -> Schedule:
  """The constant schedule `step -> value` (float32).

  Example:
    >>> float(constant(0.1)(1000))
    0.1...
  """
  return lambda step: jnp.full((), value, dtype=jnp.float32)


def polynomial_decay(
    peak_value: float, decay_steps: int, power: float = 1.0, end_value: float = 0.0
) -> Schedule:
  """end + (peak − end)·(1 − min(t, D)/D)^power for t = step, D = decay_steps.

  The form of TF's `polynomial_decay` and `optax.polynomial_schedule`.

  Example:
    >>> float(polynomial_decay(1.0, 10, power=2.0)(5))
    0.25
  """
  check_range("decay_steps", decay_steps, low=1)
  check_range("power", power, low=0.0, low_inclusive=False)

  def schedule(step):
    t = jnp.clip(_as_float(step), 0.0, decay_steps)
    return end_value + (peak_value - end_value) * (1.0 - t / decay_steps) ** power

  return schedule


def cosine_decay(
    peak_value: float, decay_steps: int, end_value: float = 0.0
) -> Schedule:
  """end + (peak − end)·½(1 + cos(π·min(t, D)/D)) for t = step, D = decay_steps.

  Example:
    >>> round(float(cosine_decay(1.0, 10)(5)), 6)
    0.5
  """
  check_range("decay_steps", decay_steps, low=1)

  def schedule(step):
    t = jnp.clip(_as_float(step), 0.0, decay_steps)
    cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * t / decay_steps))
    return end_value + (peak_value - end_value) * cosine

  return schedule


def exponential_decay(
    peak_value: float,
    transition_steps: int,
    rate: float,
    staircase: bool = False,
    end_value: float = 0.0,
) -> Schedule:
  """peak·rate^(t/transition_steps), floored at `end_value`.

  With `staircase` the exponent is floor(t/transition_steps) (e.g. ×0.97
  every 2.4 epochs in the MobileNet/EfficientNet recipes).

  Example:
    >>> float(exponential_decay(1.0, 10, 0.5)(20))
    0.25
  """
  check_range("transition_steps", transition_steps, low=1)
  check_range("rate", rate, low=0.0, high=1.0, low_inclusive=False)

  def schedule(step):
    exponent = jnp.maximum(_as_float(step), 0.0) / transition_steps
    if staircase:  # static Python flag, not a traced value
      exponent = jnp.floor(exponent)
    return jnp.maximum(peak_value * jnp.float32(rate) ** exponent, end_value)

  return schedule


def multistep_decay(
    peak_value: float, boundaries: Sequence[int], rate: float = 0.1
) -> Schedule:
  """peak·rate^(number of boundaries ≤ step): multiply by `rate` at each boundary.

  Example:
    >>> float(multistep_decay(1.0, [10, 20], 0.1)(15))
    0.1...
  """
  check_range("rate", rate, low=0.0, low_inclusive=False)
  bounds = jnp.asarray(sorted(int(b) for b in boundaries), dtype=jnp.float32)

  def schedule(step):
    passed = jnp.sum(_as_float(step) >= bounds)
    return jnp.float32(peak_value) * jnp.float32(rate) ** passed

  return schedule


def join_warmup(warmup: Schedule, decay: Schedule, warmup_steps: int) -> Schedule:
  """`warmup(step)` before `warmup_steps`, then `decay(step − warmup_steps)`.

  Example:
    >>> s = join_warmup(linear_warmup(1.0, 10), cosine_decay(1.0, 90), 10)
    >>> float(s(10))
    1.0
  """
  if warmup_steps == 0:
    return decay
  return optax.join_schedules([warmup, decay], [int(warmup_steps)])


# --------------------------------------------------------------------------
# Warmup + decay in steps, and the MLPerf LARS schedule.
# --------------------------------------------------------------------------


def warmup_decay_schedule(
    peak_value: float,
    warmup_steps: int,
    total_steps: int,
    decay: str = "cosine",
    *,
    warmup_init_value: float = 0.0,
    power: float = 2.0,
    end_value: float = 0.0,
    boundaries: Sequence[int] = (),
    rate: float = 0.1,
    transition_steps: int = 1,
    staircase: bool = False,
) -> Schedule:
  """A linear warmup to `peak_value` joined to a decay over the remaining steps.

  Decays (t counts steps since the end of the warmup, T_w = warmup_steps,
  T = total_steps):
    * "polynomial": end + (peak − end)·(1 − t/(T − T_w + 1))^power, the MLPerf
      LARS form (the "+1" is theirs: the LR stays just above `end_value`).
    * "cosine": cosine from peak to `end_value` over T − T_w steps.
    * "exponential": peak·rate^(t/transition_steps), floored at `end_value`.
    * "multistep": ×rate at each of `boundaries` (absolute steps, after the
      warmup).
    * "constant": the peak.

  Args:
    peak_value: the LR at the end of the warmup.
    warmup_steps: steps of linear warmup (0 for none); must be < total_steps.
    total_steps: the length of training in steps.
    decay: one of `DECAYS`.
    warmup_init_value: the LR at step 0.
    power: polynomial power.
    end_value: polynomial/cosine end value, exponential floor.
    boundaries: multistep boundaries in absolute steps.
    rate: multistep factor, or exponential rate per `transition_steps`.
    transition_steps: exponential decay period.
    staircase: exponential decay in whole periods.

  Returns:
    An optax schedule.

  Example:
    >>> s = warmup_decay_schedule(1.0, 10, 100, "cosine")
    >>> float(s(5)), float(s(10))
    (0.5, 1.0)
  """
  check_range("total_steps", total_steps, low=1)
  check_range("warmup_steps", warmup_steps, low=0, high=total_steps,
              high_inclusive=False)
  check_choice("decay", decay, DECAYS)
  decay_steps = total_steps - warmup_steps
  if decay == "polynomial":
    decay_fn = polynomial_decay(peak_value, decay_steps + 1, power, end_value)
  elif decay == "cosine":
    decay_fn = cosine_decay(peak_value, decay_steps, end_value)
  elif decay == "exponential":
    decay_fn = exponential_decay(peak_value, transition_steps, rate, staircase,
                                 end_value)
  elif decay == "multistep":
    for i, boundary in enumerate(boundaries):
      check_range(f"boundaries[{i}]", boundary, low=warmup_steps, high=total_steps)
    decay_fn = multistep_decay(peak_value, [b - warmup_steps for b in boundaries],
                               rate)
  else:
    decay_fn = constant(peak_value)
  warmup = linear_warmup(peak_value, warmup_steps, warmup_init_value)
  return join_warmup(warmup, decay_fn, warmup_steps)


def warmup_polynomial_decay(
    peak_value: float,
    warmup_steps: int,
    total_steps: int,
    power: float = 2.0,
    end_value: float = 1e-4,
) -> Schedule:
  """The MLPerf LARS schedule (REFERENCE.md §1/§3, You et al. 2017).

  lr(t) = peak·t/T_w for t < T_w, then
  end + (peak − end)·(1 − (t − T_w)/(T − T_w + 1))^power; power 2, end 1e-4 by
  default.

  Example:
    >>> s = warmup_polynomial_decay(17.0, 780, 6552)
    >>> float(s(390)), float(s(780))
    (8.5, 17.0)
  """
  return warmup_decay_schedule(peak_value, warmup_steps, total_steps,
                               "polynomial", power=power, end_value=end_value)


# --------------------------------------------------------------------------
# Schedules in epochs, and the LEGW and Goyal factories.
# --------------------------------------------------------------------------


def epoch_schedule(
    peak_value: float,
    warmup_epochs: float,
    num_epochs: float,
    num_examples: int,
    batch_size: int,
    decay: str = "cosine",
    *,
    drop_remainder: bool = True,
    warmup_init_value: float = 0.0,
    power: float = 2.0,
    end_value: float = 0.0,
    decay_epochs: Sequence[float] = (),
    rate: float = 0.1,
    decay_every_epochs: float = 1.0,
    staircase: bool = False,
) -> Schedule:
  """`warmup_decay_schedule` with every length given in epochs.

  Epochs become steps through `epochs_to_steps(…, num_examples, batch_size,
  drop_remainder)`. `decay_epochs` are the multistep milestones (absolute
  epochs); `decay_every_epochs` the exponential period.

  Example:
    >>> s = epoch_schedule(0.4, 5, 90, 1_281_167, 1024, "multistep",
    ...                    decay_epochs=(30, 60, 80))
    >>> round(float(s(40 * 1251)), 6)
    0.04
  """
  check_range("num_epochs", num_epochs, low=0.0, low_inclusive=False)
  check_range("warmup_epochs", warmup_epochs, low=0.0, high=num_epochs,
              high_inclusive=False)

  def to_steps(epochs):
    return epochs_to_steps(epochs, num_examples, batch_size, drop_remainder)

  return warmup_decay_schedule(
      peak_value, to_steps(warmup_epochs), to_steps(num_epochs), decay,
      warmup_init_value=warmup_init_value, power=power, end_value=end_value,
      boundaries=[to_steps(e) for e in decay_epochs], rate=rate,
      transition_steps=max(1, to_steps(decay_every_epochs)), staircase=staircase)


def legw_schedule(
    base_lr: float,
    base_batch_size: int,
    batch_size: int,
    base_warmup_epochs: float,
    num_epochs: float,
    num_examples: int,
    decay: str = "polynomial",
    *,
    drop_remainder: bool = True,
    end_value: float = 0.0,
    **decay_kwargs,
) -> Schedule:
  """LEGW, linear-epoch gradual warmup (You et al., SC'19).

  For k = batch_size/base_batch_size: peak √k·base_lr, a linear warmup from 0
  over k·base_warmup_epochs epochs (the same number of steps for every k),
  then the baseline's `decay` over the rest of the same `num_epochs`. "Scale
  the period of the LR curve (in epochs) by k and its amplitude by √k": the
  baseline's `end_value` is scaled by √k too.

  Args:
    base_lr: the baseline's peak LR.
    base_batch_size: the baseline batch size.
    batch_size: the target batch size.
    base_warmup_epochs: the baseline's warmup, in epochs.
    num_epochs: training length in epochs (unchanged by LEGW).
    num_examples: training-set size.
    decay: the baseline's decay, one of `DECAYS`.
    drop_remainder: last partial batch policy for epochs→steps.
    end_value: the baseline's end LR.
    **decay_kwargs: the other decay parameters of `epoch_schedule` (power,
      decay_epochs, rate, decay_every_epochs, staircase).

  Example:
    >>> s = legw_schedule(2**2.5, 1024, 32768, 0.3125, 90, 1_281_167)
    >>> round(float(s(390)), 3)   # warmup ends after 10 epochs = 390 steps
    32.0
  """
  return epoch_schedule(
      scale_learning_rate(base_lr, base_batch_size, batch_size, "sqrt"),
      legw_warmup_epochs(base_warmup_epochs, base_batch_size, batch_size),
      num_epochs, num_examples, batch_size, decay,
      drop_remainder=drop_remainder,
      end_value=scale_learning_rate(end_value, base_batch_size, batch_size, "sqrt"),
      **decay_kwargs)


def goyal_schedule(
    base_lr: float,
    base_batch_size: int,
    batch_size: int,
    num_epochs: float,
    num_examples: int,
    *,
    warmup_epochs: float = GOYAL_WARMUP_EPOCHS,
    warmup_init_value: float | None = None,
    decay: str = "multistep",
    decay_epochs: Sequence[float] = GOYAL_DECAY_EPOCHS,
    rate: float = 0.1,
    drop_remainder: bool = True,
    **decay_kwargs,
) -> Schedule:
  """Linear scaling with gradual warmup (Goyal et al. 2017).

  Peak k·base_lr, reached by a linear warmup over 5 epochs that starts from
  base_lr (the paper; pass `warmup_init_value=0.0` for the TPU code's ramp
  from 0), then ×0.1 at epochs 30, 60 and 80.

  Example:
    >>> s = goyal_schedule(0.1, 256, 8192, 90, 1_281_167)
    >>> round(float(s(0)), 6), round(float(s(5 * 156)), 6)
    (0.1, 3.2)
  """
  if warmup_init_value is None:
    warmup_init_value = base_lr
  return epoch_schedule(
      scale_learning_rate(base_lr, base_batch_size, batch_size, "linear"),
      warmup_epochs, num_epochs, num_examples, batch_size, decay,
      drop_remainder=drop_remainder, warmup_init_value=warmup_init_value,
      decay_epochs=decay_epochs, rate=rate, **decay_kwargs)
