"""Epochs and optimizer steps: the one converter every layer uses.

The recipe, the schedules and the input pipeline all count epochs with these
two functions, so they agree on where an epoch ends. This module imports
nothing but the argument checks, so the data layer can use it without loading
the optimizer layers.
"""

from __future__ import annotations

import math

from dateopt.validation import check_range


def steps_per_epoch(
    num_examples: int, batch_size: int, *, drop_remainder: bool = True
) -> int:
  """Number of optimizer steps in one pass over `num_examples` examples.

  Args:
    num_examples: examples in the training set (> 0).
    batch_size: global batch size (> 0).
    drop_remainder: True drops the last partial batch (floor), False keeps it
      as a smaller step (ceil).

  Example:
    >>> steps_per_epoch(1_281_167, 1024), steps_per_epoch(1_281_167, 1024, drop_remainder=False)
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
    epochs: float, num_examples: int, batch_size: int, *, drop_remainder: bool = True
) -> int:
  """Converts a (possibly fractional) number of epochs to optimizer steps.

  Rounding halves up::

      steps = round(epochs · steps_per_epoch(num_examples, batch_size, drop_remainder))

  Every epoch→step conversion in dateopt goes through this function.

  Example:
    >>> epochs_to_steps(0.3125, 1_281_167, 1024)   # 0.3125 · 1251 = 390.9
    391
  """
  check_range("epochs", epochs, low=0.0)
  per_epoch = steps_per_epoch(num_examples, batch_size, drop_remainder=drop_remainder)
  return int(math.floor(float(epochs) * per_epoch + 0.5))
