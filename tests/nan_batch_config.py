"""The tiny config with NaN in the training batches of some steps (tests/test_faults.py).

`--config tests/nan_batch_config.py:7,8` poisons the batches of steps 7 and 8;
`:3-` those of step 3 and every step after it; `:3-%2` those of every other step
from step 3 (3, 5, 7, ...). One input value of the batch is NaN, as a corrupt
record would make it.
"""

import os
import sys

import numpy as np

from dateopt.data import base

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the CLI loads us by path
import tiny_config  # tests/tiny_config.py  # pylint: disable=wrong-import-position


def _poisoned_steps(spec: str):
  """"7,8" -> steps 7 and 8; "3-" -> step 3 and every later step; "3-%2" -> 3, 5, 7, ..."""
  if "-" in spec:
    first, _, every = spec.partition("-")
    first, every = int(first), int(every.lstrip("%") or 1)
    return lambda step: step >= first and (step - first) % every == 0
  steps = {int(s) for s in spec.split(",")}
  return lambda step: step in steps


def get_config(spec: str = "7"):
  poisoned = _poisoned_steps(spec)
  clean_batch = base.Dataset.train_batch

  def train_batch(self, data_step, *args, **kwargs):
    batch = clean_batch(self, data_step, *args, **kwargs)
    if poisoned(data_step + 1):  # the batch of data step s trains step s + 1
      batch = dict(batch, inputs=batch["inputs"].copy())
      batch["inputs"].flat[0] = np.nan
    return batch

  base.Dataset.train_batch = train_batch  # this process is the CLI run of this config only
  return tiny_config.get_config()
