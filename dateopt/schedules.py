"""Learning-rate schedules and batch-size scaling rules.

Every schedule here is an `optax.Schedule` (`step -> learning rate`) assembled
from `optax.schedules`, so it runs under `jax.jit` and inside any optax
optimizer (`optax.sgd(schedule)`, `dateopt.lars(schedule)`, ...).

`warmup_decay_schedule` joins a linear warmup to a decay (polynomial, cosine,
exponential, multi-step, constant); `warmup_polynomial_decay` is the MLPerf LARS
schedule; `epoch_schedule` takes every length in epochs and converts them
through one function, `epochs_to_steps`, so a trainer, a `Recipe` and a
schedule always agree on where an epoch ends.

Scaling rules for a batch grown k-fold from a tuned baseline:
  * linear (Goyal et al. 2017): peak LR x k, 5-epoch warmup.
  * sqrt: peak LR x sqrt(k), warmup unchanged.
  * LEGW (You et al., "Large-Batch Training for LSTM and Beyond", SC'19):
    peak LR x sqrt(k) and warmup x k epochs: the same warmup in steps for
    every k.
Here they are numbers (`scale_learning_rate`, `legw_warmup_epochs`); the
schedule they imply comes from `dateopt.date.plan` + `dateopt.date.build_schedule`.
"""

from __future__ import annotations

import collections
import math
from typing import Sequence

import optax

from dateopt.validation import check_choice, check_range

#: The batch-size scaling rules `scale_learning_rate` knows.
SCALING_RULES = ("linear", "sqrt", "none")
#: The decays `warmup_decay_schedule` can join to its warmup.
DECAYS = ("polynomial", "cosine", "exponential", "multistep", "constant")

#: Goyal et al. 2017's gradual warmup, in epochs.
GOYAL_WARMUP_EPOCHS = 5.0
#: The epochs of Goyal et al. 2017's step decay, where the LR is multiplied by 0.1.
GOYAL_DECAY_EPOCHS = (30.0, 60.0, 80.0)


# --------------------------------------------------------------------------
# Batch-size scaling rules.
# --------------------------------------------------------------------------


def _check_batch_sizes(base_batch_size, batch_size) -> None:
  check_range("base_batch_size", base_batch_size, low=0, low_inclusive=False)
  check_range("batch_size", batch_size, low=0, low_inclusive=False)


def scale_learning_rate(
    base_lr: float, base_batch_size: int, batch_size: int, *, rule: str = "linear"
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
    >>> scale_learning_rate(0.1, 256, 8192, rule="linear")
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


# Epochs and steps: the one converter lives in `dateopt.epochs` (the data layer
# counts epochs with it too); it is re-exported here as part of this API.
from dateopt.epochs import epochs_to_steps, steps_per_epoch  # noqa: E402,F401


# --------------------------------------------------------------------------
# Warmup + decay in steps, and the MLPerf LARS schedule.
# --------------------------------------------------------------------------


def warmup_decay_schedule(
    peak_value: float,
    warmup_steps: int,
    total_steps: int,
    *,
    decay: str = "cosine",
    init_value: float = 0.0,
    power: float = 2.0,
    end_value: float = 0.0,
    boundaries: Sequence[int] = (),
    decay_rate: float = 0.1,
    transition_steps: int = 1,
    staircase: bool = False,
) -> optax.Schedule:
  """A linear warmup to `peak_value` joined to a decay over the remaining steps.

  The warmup is `optax.linear_schedule` from `init_value` to `peak_value` over
  `warmup_steps`. Decays (t counts steps since the end of the warmup,
  T_w = warmup_steps, T = total_steps):
    * "polynomial": end + (peak − end)·(1 − t/(T − T_w + 1))^power, the MLPerf
      LARS form (the "+1" is theirs: the LR stays just above `end_value`).
    * "cosine": end + (peak − end)·½(1 + cos(π·t/(T − T_w))).
    * "exponential": peak·decay_rate^(t/transition_steps), floored at
      `end_value`; `staircase` floors the exponent.
    * "multistep": ×decay_rate at each of `boundaries` (absolute steps, after
      the warmup).
    * "constant": the peak.

  Args:
    peak_value: the LR at the end of the warmup.
    warmup_steps: steps of linear warmup (0 for none); must be < total_steps.
    total_steps: the length of training in steps.
    decay: one of `DECAYS`.
    init_value: the LR at step 0.
    power: polynomial power (> 0).
    end_value: polynomial/cosine end value, exponential floor.
    boundaries: multistep boundaries in absolute steps, in
      [warmup_steps, total_steps].
    decay_rate: multistep factor (> 0), or exponential rate per
      `transition_steps` (in (0, 1]).
    transition_steps: exponential decay period (>= 1).
    staircase: exponential decay in whole periods.

  Returns:
    An optax schedule.

  Example:
    >>> s = warmup_decay_schedule(1.0, 10, 100, decay="cosine")
    >>> float(s(5)), float(s(10))
    (0.5, 1.0)
    >>> s = warmup_decay_schedule(1.0, 10, 100, decay="multistep", init_value=0.5,
    ...                           boundaries=(50,), decay_rate=0.1)
    >>> float(s(0)), round(float(s(49)), 6), round(float(s(50)), 6)
    (0.5, 1.0, 0.1)
  """
  check_range("total_steps", total_steps, low=1)
  check_range("warmup_steps", warmup_steps, low=0, high=total_steps,
              high_inclusive=False)
  check_choice("decay", decay, DECAYS)
  check_range("peak_value", peak_value, low=0.0)  # first: the others are bounded by it
  # A warmup that starts, or a "decay" that ends, above its peak would run the wrong way.
  check_range("init_value", init_value, low=0.0, high=peak_value)
  check_range("end_value", end_value, low=0.0, high=peak_value)
  decay_steps = total_steps - warmup_steps
  if decay == "polynomial":
    check_range("power", power, low=0.0, low_inclusive=False)
    after = optax.polynomial_schedule(peak_value, end_value, power,
                                      transition_steps=decay_steps + 1)
  elif decay == "cosine":
    # optax's floor is `alpha`, a fraction of the peak (0 for a zero peak, as
    # in optax.warmup_cosine_decay_schedule).
    alpha = 0.0 if peak_value == 0.0 else end_value / peak_value
    after = optax.cosine_decay_schedule(peak_value, decay_steps, alpha=alpha)
  elif decay == "exponential":
    check_range("transition_steps", transition_steps, low=1)
    check_range("decay_rate", decay_rate, low=0.0, high=1.0, low_inclusive=False)
    # optax reads end_value as a ceiling when decay_rate >= 1: give it the
    # floor only when the schedule actually decays.
    after = optax.exponential_decay(
        peak_value, int(transition_steps), decay_rate, staircase=staircase,
        end_value=end_value if decay_rate < 1.0 else None)
  elif decay == "multistep":
    check_range("decay_rate", decay_rate, low=0.0, low_inclusive=False)
    for i, boundary in enumerate(boundaries):
      check_range(f"boundaries[{i}]", boundary, low=warmup_steps, high=total_steps)
    # A dict keeps one scale per step: repeated boundaries multiply.
    repeats = collections.Counter(int(b) - warmup_steps for b in boundaries)
    after = optax.piecewise_constant_schedule(
        peak_value, {b: decay_rate ** n for b, n in repeats.items()})
  else:
    after = optax.constant_schedule(peak_value)
  if warmup_steps == 0:
    return after
  warmup = optax.linear_schedule(init_value, peak_value, warmup_steps)
  return optax.join_schedules([warmup, after], [int(warmup_steps)])


def warmup_polynomial_decay(
    peak_value: float,
    warmup_steps: int,
    total_steps: int,
    *,
    power: float = 2.0,
    end_value: float = 1e-4,
) -> optax.Schedule:
  """The MLPerf LARS schedule (docs/papers.md §1/§3, You et al. 2017).

  With T_w the warmup steps and T the total steps::

      lr(t) = peak·t/T_w                                               for t < T_w
      lr(t) = end + (peak − end)·(1 − (t − T_w)/(T − T_w + 1))^power   for t ≥ T_w

  `power` is 2 and `end` (`end_value`) 1e-4 by default.

  Example:
    >>> s = warmup_polynomial_decay(17.0, 780, 6552)
    >>> float(s(390)), float(s(780))
    (8.5, 17.0)
  """
  return warmup_decay_schedule(peak_value, warmup_steps, total_steps,
                               decay="polynomial", power=power, end_value=end_value)


# --------------------------------------------------------------------------
# Schedules in epochs.
# --------------------------------------------------------------------------


def epoch_schedule(
    peak_value: float,
    warmup_epochs: float,
    num_epochs: float,
    *,
    num_examples: int,
    batch_size: int,
    decay: str = "cosine",
    drop_remainder: bool = True,
    init_value: float = 0.0,
    power: float = 2.0,
    end_value: float = 0.0,
    decay_epochs: Sequence[float] = (),
    decay_rate: float = 0.1,
    decay_every_epochs: float = 1.0,
    staircase: bool = False,
) -> optax.Schedule:
  """`warmup_decay_schedule` with every length given in epochs.

  Epochs become steps through `epochs_to_steps(…, num_examples, batch_size,
  drop_remainder)`. `decay_epochs` are the multistep milestones (absolute
  epochs, in [warmup_epochs, num_epochs]); `decay_every_epochs` the exponential
  period (at least one step).

  Example:
    >>> s = epoch_schedule(0.4, 5, 90, num_examples=1_281_167, batch_size=1024,
    ...                    decay="multistep", decay_epochs=(30, 60, 80))
    >>> round(float(s(40 * 1251)), 6)
    0.04
  """
  check_range("num_epochs", num_epochs, low=0.0, low_inclusive=False)
  check_range("warmup_epochs", warmup_epochs, low=0.0, high=num_epochs,
              high_inclusive=False)
  check_range("decay_every_epochs", decay_every_epochs, low=0.0)

  def to_steps(epochs):
    return epochs_to_steps(epochs, num_examples, batch_size, drop_remainder=drop_remainder)

  boundaries = ()
  if decay == "multistep":  # milestones mean nothing to the other decays
    for i, epoch in enumerate(decay_epochs):
      check_range(f"decay_epochs[{i}]", epoch, low=warmup_epochs, high=num_epochs)
    boundaries = [to_steps(e) for e in decay_epochs]
  return warmup_decay_schedule(
      peak_value, to_steps(warmup_epochs), to_steps(num_epochs), decay=decay,
      init_value=init_value, power=power, end_value=end_value,
      boundaries=boundaries, decay_rate=decay_rate,
      transition_steps=max(1, to_steps(decay_every_epochs)), staircase=staircase)
