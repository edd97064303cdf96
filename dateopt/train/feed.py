"""The training batches of a run, at a fixed batch or at the batch DATE asks for.

A fixed-batch run reads epoch-aligned batches indexed by step
(`Dataset.train_iterator`). A growing run (DATE's `grow_batch`) reads the
example stream from its position, the examples served so far
(`Dataset.stream_iterator`), and reopens it there at each new rung: a
pipeline that prefetches never serves a batch of the old size after the
change, and nothing is skipped or repeated within an epoch. Both are pure
functions of (seed, where the run stands), so a resumed run reads exactly
the batches an uninterrupted one would.

Example:
  >>> feed = TrainFeed(dataset, seed=0, batch_size=32, grows=True, position=0)
  >>> batch = feed.next()          # 32 examples; feed.position is 32
  >>> feed.resize(64)              # the next batch: the following 64 examples
  >>> feed.close()
"""

from __future__ import annotations

from typing import Any

import jax

from dateopt import data as data_lib


class TrainFeed:
  """This process's training batches from where the run stands; `clean` for Final Polishing.

  Args:
    dataset: the run's dataset.
    seed: the data seed.
    batch_size: the global batch of the next step.
    grows: read the example stream by position (a growing batch) rather than
      epoch-aligned batches by step.
    start_step: steps already taken (the fixed-batch index).
    position: examples already served (the growing-batch index).
    clean: evaluation-style preprocessing (Final Polishing's final epochs).
  """

  def __init__(self, dataset: data_lib.Dataset, *, seed: int, batch_size: int, grows: bool,
               start_step: int = 0, position: int = 0, clean: bool = False):
    self._dataset, self._seed, self._grows = dataset, seed, grows
    self.batch_size, self.step, self.position, self.clean = batch_size, start_step, position, clean
    self._batches = self._open()

  def _open(self):
    where = dict(seed=self._seed, process_index=jax.process_index(),
                 process_count=jax.process_count(), augment=not self.clean)
    if self._grows:
      return self._dataset.stream_iterator(self.batch_size, start_position=self.position, **where)
    return self._dataset.train_iterator(self.batch_size, start_step=self.step, **where)

  def next(self) -> dict[str, Any]:
    """The next step's batch (this process's rows)."""
    batch = next(self._batches)
    self.step += 1
    self.position += self.batch_size
    return batch

  def resize(self, batch_size: int) -> None:
    """Serves `batch_size` examples per step from the current position on (growing only)."""
    if batch_size == self.batch_size:
      return
    if not self._grows:
      raise ValueError(f"a fixed-batch feed cannot change its batch ({self.batch_size} -> "
                       f"{batch_size}).")
    self._reopen(batch_size=batch_size)

  def switch_to_clean(self) -> None:
    """Evaluation-style batches from here on (Final Polishing's final epochs)."""
    self._reopen(clean=True)

  def _reopen(self, **changes) -> None:
    self.close()  # its prefetch threads stop before the new pipeline starts
    for name, value in changes.items():
      setattr(self, name, value)
    self._batches = self._open()

  def close(self) -> None:
    """Stops the current pipeline's prefetch threads (a grain iterator or a generator)."""
    close = getattr(self._batches, "close", None)
    if close is not None:
      close()
