"""Orbax checkpoints: keep N, save every N steps and at the end, resume from the latest.

Orbax writes each checkpoint to a temporary directory and renames it when
complete, so a run killed mid-save resumes from the last finished one.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """A thin wrapper over `ocp.CheckpointManager` for one `TrainState`.

  Example:
    >>> ckpt = Checkpointer("/tmp/run/checkpoints", keep=3)
    >>> state = ckpt.restore_or(state)     # the latest checkpoint, or `state` itself
    >>> ckpt.save(int(state.step), state)
  """

  def __init__(self, directory: str, *, keep: int = 3):
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any) -> None:
    self._manager.save(step, args=ocp.args.StandardSave(state))

  def restore_or(self, state: Any) -> Any:
    """The latest checkpoint laid out like `state` (same shardings), or `state`."""
    step = self.latest_step()
    if step is None:
      return state
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
