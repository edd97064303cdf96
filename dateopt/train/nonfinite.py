"""Non-finite training steps: the run stops, or the divergence guard skips them and says so.

A NaN or inf in a batch (or a step that diverges) makes the loss and the
gradient non-finite. Without the divergence guard (`config.guard=False`) the
update would turn every parameter into NaN and the run would go on learning
nothing, to exit 0: so it stops at the first non-finite loss, naming the step,
before that state is checkpointed. With the guard, such a step is skipped (no
update; the LR backs off), the run goes on, and a warning names the skipped
steps (`guard/num_nonfinite` in the metrics counts them). Only when
`MAX_SKIPPED_IN_A_ROW` steps in a row are skipped does it stop: no step is
getting through, and the guard has backed the LR off as far as it goes.

The checks cost the healthy run nothing per step: each step's loss (and the
guard's count) stays on the device until the trainer waits for the step
anyway (a log step, an evaluation, a checkpoint, a stop).

Example:
  >>> watch = NonFiniteWatch(guard_nonfinite_count(state.opt_state))
  >>> for step in range(1, 101):
  ...   state, metrics = train_step(state, batch)
  ...   watch.record(step, metrics)
  ...   if step % 10 == 0:
  ...     watch.check(step)        # NonFiniteError, or a warning naming skipped steps
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np
import optax
from absl import logging

from dateopt import date
from dateopt.train import parallel

# 10 back-offs in a row take the guard's LR multiplier from 1 to its default floor
# (0.5 ** 10 < 1e-3 = min_multiplier): after that it can only go on skipping.
MAX_SKIPPED_IN_A_ROW = 10

# The metric the train step reports the guard's count of skipped non-finite steps under.
GUARD_COUNT_KEY = "guard/num_nonfinite"
GUARD_MULTIPLIER_KEY = "guard/lr_multiplier"
# Steps in a row with the guard's LR multiplier at its floor before the run is stopped: from
# the floor, 14 accepted steps lift it past AT_FLOOR (a run that recovers is never stopped).
MAX_AT_FLOOR = 20
AT_FLOOR = 1.1  # × the floor


class NonFiniteError(Exception):
  """A run stopped because its steps were non-finite; the checkpoints saved predate them.

  Attributes:
    step: the first non-finite step.
  """

  exit_code = 1

  def __init__(self, step: int, message: str):
    super().__init__(message)
    self.step = step


def guard_nonfinite_count(opt_state: Any) -> int | None:
  """The divergence guard's count of non-finite steps in `opt_state`; None without a guard."""
  guard = optax.tree.get(opt_state, "DivergenceGuardState")
  return None if guard is None else int(parallel.to_host(guard.num_nonfinite))


def _ranges(steps: list[int]) -> str:
  """[3, 4, 5, 9] as "3-5, 9"."""
  spans, start = [], steps[0]
  for before, after in zip(steps, steps[1:] + [None]):
    if after != before + 1:
      spans.append(f"{start}" if start == before else f"{start}-{before}")
      start = after
  return ", ".join(spans)


class NonFiniteWatch:
  """Finds the non-finite steps of a run from each step's metrics, at the trainer's pace.

  Args:
    guard_count: the guard's count of non-finite steps before the first
      recorded step (`guard_nonfinite_count`); None for a run without the guard.
    warn: whether to log the skipped steps (process 0 only, on several hosts).
    lr_floor: the guard's `min_multiplier`: a run whose LR multiplier sits
      there `MAX_AT_FLOOR` steps in a row, or ends there, has stopped learning.
  """

  def __init__(self, guard_count: int | None, *, warn: bool = True,
               lr_floor: float | None = None):
    self._guarded = guard_count is not None
    self._guard_count = guard_count or 0
    self._warn = warn
    self._lr_floor = lr_floor if self._guarded else None
    self._pending: list[tuple[int, jax.Array, jax.Array | None, jax.Array | None]] = []
    self._in_a_row: list[int] = []  # the skipped steps since the last accepted one
    self._at_floor: list[int] = []  # the steps at the LR floor since the last one above

  # A run that neither logs, evaluates nor saves for this many steps is still looked at:
  # the pending losses stay bounded and a NaN without the guard is found this soon.
  MAX_PENDING = 100

  @property
  def due(self) -> bool:
    """Whether `check` should run now, whatever else the step does."""
    return len(self._pending) >= self.MAX_PENDING

  def record(self, step: int, metrics: Mapping[str, jax.Array]) -> None:
    """Keeps step `step`'s loss and guard count (device arrays: no transfer, no wait)."""
    self._pending.append((step, metrics["loss"], metrics.get(GUARD_COUNT_KEY),
                          metrics.get(GUARD_MULTIPLIER_KEY)))

  def check(self, last_step: int) -> None:
    """Looks at the steps recorded up to `last_step` (those after it are an adaptive run's
    idle steps, which change nothing).

    Raises:
      NonFiniteError: without the guard, a step's loss was non-finite; with
        it, `MAX_SKIPPED_IN_A_ROW` steps in a row were skipped, or the LR
        multiplier sat at its floor `MAX_AT_FLOOR` steps in a row.
    """
    pending = [entry for entry in self._pending if entry[0] <= last_step]
    self._pending = []
    if not pending:
      return
    steps = [entry[0] for entry in pending]
    losses = np.asarray(jax.device_get([_local(entry[1]) for entry in pending]), np.float64)
    if not self._guarded:
      self._check_losses(steps, losses)
      return
    counts = np.asarray(jax.device_get([_local(entry[2]) for entry in pending]), np.int64)
    skipped = np.diff(counts, prepend=self._guard_count) > 0
    self._guard_count = int(counts[-1])
    self._check_skipped(steps, losses, skipped)
    if self._lr_floor is not None and pending[0][3] is not None:
      multipliers = np.asarray(jax.device_get([_local(entry[3]) for entry in pending]))
      self._check_floor(steps, multipliers)

  def finish(self) -> None:
    """After the last `check`: raises NonFiniteError if the run ended at the LR floor."""
    if self._at_floor:
      self._stop_at_floor("ended")

  def _check_floor(self, steps: list[int], multipliers: np.ndarray) -> None:
    for step, multiplier in zip(steps, multipliers):
      if multiplier < AT_FLOOR * self._lr_floor:
        self._at_floor.append(step)
      else:
        self._at_floor = []
    if len(self._at_floor) >= MAX_AT_FLOOR:
      self._stop_at_floor("stopped learning")

  def _stop_at_floor(self, how: str) -> None:
    first, last = self._at_floor[0], self._at_floor[-1]
    raise NonFiniteError(first, (
        f"stopped: the run {how} with the divergence guard's LR multiplier at its floor "
        f"({self._lr_floor:g}) from step {first} to {last}: it backed the learning rate off "
        f"as far as it goes ({self._guard_count} non-finite steps skipped in all), so the "
        f"run is no longer learning. Check the input data for NaN or inf, or lower the "
        f"learning rate."))

  def _check_losses(self, steps: list[int], losses: np.ndarray) -> None:
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
      step, loss = steps[bad[0]], losses[bad[0]]
      raise NonFiniteError(step, (
          f"stopped: the training loss was {loss} at step {step} (a NaN or inf in its batch, "
          f"or a diverged step), and without the divergence guard (config.guard=False) its "
          f"update makes the parameters non-finite. The checkpoints saved so far predate it. "
          f"Check the input data, or set config.guard=True to skip such steps."))

  def _check_skipped(self, steps: list[int], losses: np.ndarray, skipped: np.ndarray) -> None:
    for step, bad in zip(steps, skipped):
      if bad:
        self._in_a_row.append(step)
      else:
        self._in_a_row = []
    if len(self._in_a_row) >= MAX_SKIPPED_IN_A_ROW:  # and still skipping at this check
      first, last = self._in_a_row[0], self._in_a_row[-1]
      raise NonFiniteError(first, (
          f"stopped: the divergence guard skipped every step from {first} to {last} "
          f"({len(self._in_a_row)} in a row) for a non-finite loss or gradient, and has backed "
          f"the learning rate off as far as it goes. Check the input data for NaN or inf, or "
          f"lower the learning rate."))
    skipped_steps = [step for step, bad in zip(steps, skipped) if bad]
    if skipped_steps and self._warn:
      losses_bad = all(not np.isfinite(loss) for loss, bad in zip(losses, skipped) if bad)
      logging.warning("the divergence guard skipped %s %s: non-finite %s (%d skipped so far; "
                      "%s in the metrics).", "steps" if len(skipped_steps) > 1 else "step",
                      _ranges(skipped_steps), "loss" if losses_bad else "gradient",
                      self._guard_count, GUARD_COUNT_KEY)


def _local(value: jax.Array) -> jax.Array:
  """A replicated array's copy on this process's first device (any array of a multi-host
  run can be read there)."""
  return value.addressable_data(0) if isinstance(value, jax.Array) else value
