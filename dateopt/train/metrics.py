"""Metrics to a JSONL log and TensorBoard event files, and a console progress bar.

Only process 0 writes; every other process gets no-op writers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from typing import Any, Iterator, Mapping

import jax

import numpy as np


def _scalar(value: Any) -> float:
  return float(np.asarray(value))


class MetricWriter:
  """Writes scalars to `workdir/metrics.jsonl` and `workdir/tensorboard/`.

  Example:
    >>> writer = MetricWriter("/tmp/run")
    >>> writer.write(10, {"train/loss": 0.5})
    >>> writer.close()
  """

  def __init__(self, workdir: str, *, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    from tensorboardX import SummaryWriter  # imported here: optional at import time.
    os.makedirs(workdir, exist_ok=True)
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8")
    self._tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    if not self.enabled:
      return
    values = {k: _scalar(v) for k, v in scalars.items()}
    self._jsonl.write(json.dumps({"step": int(step), **values}) + "\n")
    self._jsonl.flush()
    for key, value in values.items():
      if math.isfinite(value):  # NaN/inf (e.g. no noise-scale estimate yet) stay in the JSONL
        self._tensorboard.add_scalar(key, value, int(step))

  def write_text(self, tag: str, text: str) -> None:
    if self.enabled:
      self._tensorboard.add_text(tag, f"<pre>{text}</pre>", 0)

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tensorboard.close()


class ProgressBar:
  """A tqdm bar with step rate and ETA on the console of process 0."""

  def __init__(self, total: int, initial: int, *, enabled: bool = True):
    self._bar = None
    if enabled:
      from tqdm.auto import tqdm
      self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

  def update(self, n: int = 1, **postfix: Any) -> None:
    if self._bar is not None:
      if postfix:
        self._bar.set_postfix({k: f"{_scalar(v):.4g}" for k, v in postfix.items()},
                              refresh=False)
      self._bar.update(n)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


class StepClock:
  """Step time and examples/s between log steps, with eval and checkpoint time left out.

  Call `count_step()` after each dispatched step and `lap()` right after a
  blocking fetch of a step's outputs (the metrics of a log step): the time
  since the previous lap, less the `paused()` time, over the steps counted.
  The first lap only starts the clock, so compilation is never counted.

  Example:
    >>> clock = StepClock(batch_size=512)
    >>> clock.lap()          # first log step: starts the clock
    {}
    >>> clock.count_step(); sorted(clock.lap())
    ['examples_per_second', 'step_seconds']
  """

  def __init__(self, batch_size: int):
    self._batch_size = batch_size
    self._start: float | None = None
    self._steps = 0
    self._paused = 0.0
    self._total_steps = 0
    self._total_seconds = 0.0

  def count_step(self) -> None:
    self._steps += 1

  def lap(self) -> dict[str, float]:
    now = time.perf_counter()
    out = {}
    if self._start is not None and self._steps:
      seconds = now - self._start - self._paused
      out = {"step_seconds": seconds / self._steps,
             "examples_per_second": self._batch_size * self._steps / seconds}
      self._total_steps += self._steps
      self._total_seconds += seconds
    self._start, self._steps, self._paused = time.perf_counter(), 0, 0.0
    return out

  @contextlib.contextmanager
  def paused(self, *wait_for: Any) -> Iterator[None]:
    """Leaves the block's time out; first waits for `wait_for` (the steps it uses)."""
    jax.block_until_ready(wait_for)
    start = time.perf_counter()
    try:
      yield
    finally:
      self._paused += time.perf_counter() - start

  def steps_per_second(self) -> float:
    """Over every lap so far (NaN before two log steps)."""
    return self._total_steps / self._total_seconds if self._total_seconds > 0 else math.nan
