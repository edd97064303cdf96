"""The training batches of a run, at a fixed batch or at the batch DATE asks for.

A fixed-batch run reads epoch-aligned batches indexed by step
(`Dataset.train_iterator`). A growing run (DATE's `grow_batch`) reads the
example stream from its position, the examples served so far
(`Dataset.stream_iterator`), and reopens it there at each new rung: a
pipeline that prefetches never serves a batch of the old size after the
change, and nothing is skipped or repeated within an epoch. Both are pure
functions of (seed, where the run stands), so a resumed run reads exactly
the batches an uninterrupted one would.

The feed keeps `DEVICE_PREFETCH` batches on their way to the devices: the
host-to-device copy of step t+1 is issued before step t runs (jax dispatches
both asynchronously), as flax's `prefetch_to_device` does for pmap, here for
`jit` with the batch's `NamedSharding`.

Example:
  >>> feed = TrainFeed(dataset, mesh, seed=0, batch_size=32, grows=True, position=0)
  >>> batch = feed.next()          # 32 examples on the mesh; feed.position is 32
  >>> feed.resize(64)              # the next batch: the following 64 examples
  >>> feed.close()
"""

from __future__ import annotations

import collections

import jax
from jax.sharding import Mesh

from dateopt import data as data_lib
from dateopt.train import parallel

# Batches on their way to the devices: the one the step takes and the next.
DEVICE_PREFETCH = 2


class TrainFeed:
  """This process's training batches from where the run stands; `clean` for Final Polishing.

  Args:
    dataset: the run's dataset.
    mesh: the devices the batches are sharded over (`parallel.global_batch`).
    seed: the data seed.
    batch_size: the global batch of the next step.
    grows: read the example stream by position (a growing batch) rather than
      epoch-aligned batches by step.
    start_step: steps already taken (the fixed-batch index).
    position: examples already served (the growing-batch index).
    clean: evaluation-style preprocessing (Final Polishing's final epochs).
  """

  def __init__(self, dataset: data_lib.Dataset, mesh: Mesh, *, seed: int, batch_size: int,
               grows: bool, start_step: int = 0, position: int = 0, clean: bool = False):
    self._dataset, self._mesh, self._seed, self._grows = dataset, mesh, seed, grows
    self.batch_size, self.step, self.position, self.clean = batch_size, start_step, position, clean
    self._ahead: collections.deque[dict[str, jax.Array]] = collections.deque()
    self._batches = self._open()

  def _open(self):
    where = dict(seed=self._seed, process_index=jax.process_index(),
                 process_count=jax.process_count(), augment=not self.clean)
    if self._grows:
      return self._dataset.stream_iterator(self.batch_size, start_position=self.position, **where)
    return self._dataset.train_iterator(self.batch_size, start_step=self.step, **where)

  def next(self) -> dict[str, jax.Array]:
    """The next step's global batch, on the mesh; the one after it is sent on its way."""
    while len(self._ahead) < DEVICE_PREFETCH:
      self._ahead.append(parallel.global_batch(next(self._batches), self._mesh))
    self.step += 1
    self.position += self.batch_size
    return self._ahead.popleft()

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
    self._ahead.clear()  # sent ahead at the old size or preprocessing: never served
    for name, value in changes.items():
      setattr(self, name, value)
    self._batches = self._open()

  def close(self) -> None:
    """Stops the current pipeline's prefetch threads (a grain iterator or a generator)."""
    close = getattr(self._batches, "close", None)
    if close is not None:
      close()
