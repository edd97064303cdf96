"""Orbax checkpoints: keep N, save every N steps and at the end, resume from the newest that loads.

Orbax writes each checkpoint to a temporary directory and renames it when
complete, so a run killed mid-save resumes from the last finished one. A
finished one can still be damaged later (a truncated copy, a deleted file, a
full disk): `restore_or` reports it, keeps it aside, and falls back to the
next older one. The directory is local or a bucket (`gs://bucket/run/checkpoints`),
all through `etils.epath` (see `workdirs`).
"""

from __future__ import annotations

import errno
import gc
import logging as logging_lib
import os
import sys
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from dateopt.train import workdirs

DAMAGED_SUFFIX = ".damaged"  # not a step name to orbax, which then ignores the directory


# Orbax's name for a save in progress; the rename to `<step>` marks it finished.
UNFINISHED_MARK = ".orbax-checkpoint-tmp"


def remove_unfinished_saves(directory: epath.Path) -> list[str]:
  """Deletes the saves a killed run left unfinished in `directory`, with a one-line note.

  Orbax never loads them and never deletes them: each holds a whole state's
  bytes. Call it while no save runs (the trainer does, under the workdir lock).
  Returns the names removed.
  """
  if not directory.exists():
    return []
  stale = sorted(p for p in directory.iterdir() if UNFINISHED_MARK in p.name)
  for path in stale:
    path.rmtree() if path.is_dir() else path.unlink()
  if stale:
    logging.warning("removed %d unfinished checkpoint save(s) left by an interrupted run "
                    "in %s: %s", len(stale), directory, ", ".join(p.name for p in stale))
  return [p.name for p in stale]


class NoUsableCheckpointError(RuntimeError):
  """Checkpoints exist, but none of them loads into the state."""


class Checkpointer:
  """A thin wrapper over `ocp.CheckpointManager` for one `TrainState`.

  Example:
    >>> ckpt = Checkpointer("/tmp/run/checkpoints", keep=3)   # or "gs://bucket/run/checkpoints"
    >>> state = ckpt.restore_or(state)     # the newest checkpoint that loads, or `state`
    >>> ckpt.save(int(state.step), state)
    >>> ckpt.close()
  """

  def __init__(self, directory: str | os.PathLike, *, keep: int = 3):
    self.directory = workdirs.as_path(directory)  # orbax wants a local path absolute
    if jax.process_index() == 0:
      remove_unfinished_saves(self.directory)
    self._options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=self._options)
    self._quiet = _ClosedLoopNoiseFilter(str(self.directory))
    self._no_space_noise = _NoSpaceNoiseFilter()
    logging_lib.getLogger("absl").addFilter(self._no_space_noise)  # until close

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """The steps of the finished checkpoints, oldest first."""
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any) -> None:
    """Saves `state` as `step` (asynchronously; `close` waits for it)."""
    # force: orbax would otherwise skip, without a word, a step its policy declines.
    self._manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore_or(self, state: Any) -> Any:
    """The newest checkpoint that loads, laid out like `state` (same shardings), or `state`.

    A checkpoint that fails to load is reported (step and error) and the next
    older one is tried. Once one loads, the damaged newer ones are renamed
    `<step>.damaged`, never deleted: kept for a look, and out of the way of
    the saves of those steps to come.

    Raises:
      NoUsableCheckpointError: there are checkpoints but none loads; then
        nothing is renamed (a changed config is likelier than all of them
        damaged).
    """
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    failures = []
    self._quiet.install()
    for step in sorted(self._manager.all_steps(), reverse=True):
      restored, reason = self._try_restore(step, abstract)
      if reason is None:
        self._set_aside([failed for failed, _ in failures])
        if not failures:  # else late callbacks of a failed restore may still come
          self._quiet.uninstall()
        return restored
      logging.warning("checkpoint of step %d in %s does not load (%s); trying an older one.",
                      step, self.directory, reason)
      failures.append((step, reason))
    if failures:
      reasons = "; ".join(f"step {step}: {reason}" for step, reason in failures)
      raise NoUsableCheckpointError(
          f"no checkpoint in {self.directory} loads ({reasons}). If the config changed, use a "
          f"new --workdir; to start over here, move {self.directory} away.")
    self._quiet.uninstall()
    return state

  def _try_restore(self, step: int, abstract: Any) -> tuple[Any, str | None]:
    """(the restored state, None), or (None, why it failed here or on another process)."""
    restored, reason = None, None
    try:
      restored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
    except Exception as error:  # orbax and tensorstore raise many kinds, even bare Exception
      reason = _why(error, self.directory / str(step))
    if reason is not None:
      self._reopen()  # a failed restore can leave the manager's async machinery unusable
      gc.collect()  # its abandoned reads end now, while the noise filter is on
    loaded_everywhere = _on_every_process(reason is None)  # every process must ask
    if reason is None and not loaded_everywhere:
      reason = "it does not load on another process"
    return (restored, None) if reason is None else (None, reason)

  def _set_aside(self, steps: list[int]) -> None:
    """Renames the damaged `steps` out of orbax's sight (process 0, all processes done)."""
    if not steps:
      return
    _sync("dateopt_checkpoint_set_aside")
    if jax.process_index() == 0:
      for step in steps:
        source = self.directory / str(step)
        target = _free_name(source.with_name(source.name + DAMAGED_SUFFIX))
        source.rename(target)  # on GCS a copy and a delete: done once, after the restore
        logging.warning("kept the damaged checkpoint of step %d as %s.", step, target)
    _sync("dateopt_checkpoint_set_aside_done")
    self._reopen()  # the manager lists its steps once; it must forget the renamed ones

  def _reopen(self) -> None:
    try:
      self._manager.close()
    except Exception:  # pylint: disable=broad-except  # a broken manager is replaced anyway
      pass
    self._manager = ocp.CheckpointManager(self.directory, options=self._options)

  def close(self) -> None:
    """Waits for the last save to finish; safe to call twice.

    Raises:
      OSError: a save failed for want of space (a full disk, a quota): one
        error naming the directory, orbax's own reports of it left out.
    """
    if self._manager is not None:
      manager, self._manager = self._manager, None
      try:
        manager.wait_until_finished()
        manager.close()
      except OSError as error:
        if error.errno not in _NO_SPACE:
          raise
        raise OSError(error.errno, f"a checkpoint save in {self.directory} failed: "
                      f"{error.strerror}") from error
      finally:
        logging_lib.getLogger("absl").removeFilter(self._no_space_noise)
    self._quiet.uninstall()


# The errors of a full disk or quota: `close` reports them once, in one line.
_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class _NoSpaceNoiseFilter(logging_lib.Filter):
  """Drops orbax's logged tracebacks of a save that failed for want of space.

  Each background thread of a failed save logs the error with its traceback
  (about 200 lines for one save); `Checkpointer.close` raises it once instead.
  """

  def filter(self, record: logging_lib.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    from_orbax = f"{os.sep}orbax{os.sep}" in (record.pathname or "")
    return not (from_orbax and isinstance(error, OSError) and error.errno in _NO_SPACE)


class _ClosedLoopNoiseFilter(logging_lib.Filter):
  """Drops the noise a failed orbax restore leaves behind, while installed.

  When one read of a restore fails, orbax closes its event loop while the
  other tensorstore reads are still in flight. As each ends, its callback
  finds the loop closed ("RuntimeError: Event loop is closed"), and the
  abandoned read coroutines fail again when collected: Python prints each
  through `sys.unraisablehook`, a traceback per array. The failed reads'
  futures, collected later, are logged by asyncio ("Future exception was
  never retrieved", with a traceback) whenever the garbage collector gets to
  them. The failure itself is reported once by `restore_or`; any other
  unraisable error or asyncio record goes through as before.
  """

  def __init__(self, directory: str):
    super().__init__()
    self._directory = directory  # asyncio records are dropped only if they name it
    self._previous = None

  def install(self) -> None:
    if self._previous is None:
      self._previous = sys.unraisablehook
      sys.unraisablehook = self._hook
      logging_lib.getLogger("asyncio").addFilter(self)

  def uninstall(self) -> None:
    if self._previous is not None:
      if sys.unraisablehook == self._hook:  # leave a hook installed after ours alone
        sys.unraisablehook = self._previous
      self._previous = None
      logging_lib.getLogger("asyncio").removeFilter(self)

  def _hook(self, unraisable) -> None:
    error, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
      return
    if code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename:
      return  # an abandoned orbax read coroutine, collected
    (self._previous or sys.__unraisablehook__)(unraisable)

  def filter(self, record: logging_lib.LogRecord) -> bool:
    """False (drop) for asyncio's report of a collected failed read of this directory."""
    message = record.getMessage()
    if "exception was never retrieved" not in message:
      return True
    error = record.exc_info[1] if record.exc_info else None
    return self._directory not in f"{message} {error}"


def _why(error: Exception, step_dir: epath.Path) -> str:
  """The first line of a restore error, with orbax's puzzling cases said plainly."""
  item = step_dir / "default"  # orbax's directory for a single unnamed item
  if step_dir.is_dir() and not item.is_dir():
    return f"its item directory {item} is missing"
  lines = str(error).strip().splitlines()
  first = lines[0] if lines else ""
  if len(first) > 200:
    first = first[:200] + "..."
  return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _free_name(path: epath.Path) -> epath.Path:
  """`path`, or `path-2`, `path-3`, ... the first that does not exist."""
  candidate, n = path, 1
  while candidate.exists():
    n += 1
    candidate = path.with_name(f"{path.name}-{n}")
  return candidate


def _on_every_process(flag: bool) -> bool:
  if jax.process_count() == 1:
    return flag
  return bool(multihost_utils.process_allgather(np.int32(flag)).min())


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)
