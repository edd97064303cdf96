"""A growing batch's train-step programs, compiled ahead in a background thread.

A growing run (DATE's `grow_batch`) trains one program per rung of its
ladder. Compiled when the run first steps at a rung, each one stops the run
for the compiler: on an H100 the main job's grown run spent most of its wall
time compiling its rungs (docs/results/growth_study.md), and a large model's
program can take minutes. `RungPrograms` lowers and compiles every rung
above the first, one after the other in a background thread while the run
trains, through the run's own `jax.jit` object, so a rung the run reaches
finds its program in jit's cache. The loop waits only for the rung it is
about to step at, and no program is compiled twice. A rung the run never
reaches costs a compile in the background thread. A rung reached before its
program is ready still waits for it: the gain is the time the run trains
between its rungs.

`config.compile_rungs_ahead=True` turns it on; it is off by default. On an
H100 the main job's grown run waited 3-4 s at each rung without it, and
still waited at the rungs of its fast first climb with it (one rung per 20
steps of 6 ms): there its whole run was no faster (docs/results/main_job.md).
It can pay only where a run trains longer than a compile between its rungs.

Example (what `TrainLoop` does):
  >>> programs = RungPrograms(step_fn, ladder=(32, 64, 128), measure_flags=(None,))
  >>> programs.step_at(32, state, batch, record_statistics=None)  # the first step compiles 32
  >>> programs.step_at(32, state, batch, record_statistics=None)  # starts 64, then 128
  >>> programs.step_at(64, state, batch64, record_statistics=None)  # waits for 64's program
  >>> programs.close()
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

import jax

from dateopt.validation import check_type


def check_config(value: Any) -> None:
  """Raises TypeError naming `config.compile_rungs_ahead` unless `value` is a bool."""
  check_type("config.compile_rungs_ahead", value, bool, what="True or False")


def _spec(leaf: Any, batch_size: int | None = None) -> Any:
  """`leaf`'s abstract value and sharding; with `batch_size`, that many rows instead."""
  if not hasattr(leaf, "shape"):
    return leaf  # a Python value: traced as it is
  shape = tuple(leaf.shape) if batch_size is None else (batch_size,) + tuple(leaf.shape[1:])
  return jax.ShapeDtypeStruct(shape, leaf.dtype, sharding=getattr(leaf, "sharding", None),
                              weak_type=getattr(leaf, "weak_type", False))


class RungPrograms:
  """Compiles `step_fn` for the rungs above the first, in threads; waits where needed.

  Args:
    step_fn: the run's jitted train step, `step_fn(state, batch, *,
      record_statistics, measure_noise)`.
    ladder: the rungs, increasing (`Experiment.batch_sizes`).
    measure_flags: the static `measure_noise` values the run uses (two when
      it measures the noise on some steps only).
    enabled: False: a no-op (a fixed batch, or `config.compile_rungs_ahead` off).
  """

  def __init__(self, step_fn, *, ladder: Sequence[int], measure_flags: Sequence[Any],
               enabled: bool = True):
    self._step_fn, self._ladder, self._flags = step_fn, tuple(ladder), tuple(measure_flags)
    self.enabled = enabled and len(self._ladder) > 1
    self._pending: dict[int, list[concurrent.futures.Future]] = {}
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._current: int | None = None

  def step_at(self, batch_size: int, state: Any, batch: Any, *, record_statistics: Any) -> None:
    """Call before each step: the second one starts the compiles; a new rung waits for its own.

    The compiles start once the first step's program is built: two compiles at
    once share the host and both finish late.
    """
    if not self.enabled:
      return
    if self._pool is None and batch_size == self._current:
      self._start(batch_size, state, batch, record_statistics)
    if batch_size != self._current:
      self._current = batch_size
      for future in self._pending.pop(batch_size, ()):
        future.result()  # a compile that failed raises here, as the step itself would

  def _start(self, batch_size: int, state: Any, batch: Any, record_statistics: Any) -> None:
    # Specs taken now, on the loop's thread: the step about to run donates `state`.
    state_spec = jax.tree.map(_spec, state)
    rungs = [b for b in self._ladder if b > batch_size]
    tasks = [(b, flag) for b in rungs for flag in self._flags]
    # One thread, the nearest rung first: the run needs it first, and compiles run at once
    # share the host (three at once on an H100's host all finished together, after 9.5 s).
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rung-compile")
    for rung, flag in tasks:
      batch_spec = jax.tree.map(lambda leaf, rung=rung: _spec(leaf, rung), batch)
      self._pending.setdefault(rung, []).append(self._pool.submit(
          self._compile, state_spec, batch_spec, record_statistics, flag))

  def _compile(self, state_spec, batch_spec, record_statistics, flag) -> None:
    self._step_fn.lower(state_spec, batch_spec, record_statistics=record_statistics,
                        measure_noise=flag).compile()

  def close(self) -> None:
    """Drops the compiles not started; running ones end in their threads."""
    if self._pool is not None:
      self._pool.shutdown(wait=False, cancel_futures=True)
      self._pool = None
