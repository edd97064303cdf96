"""Metrics to a JSONL log and TensorBoard event files, and a console progress bar.

Only process 0 writes; every other process gets no-op writers. The workdir is
local or a bucket (`gs://bucket/run`, through `etils.epath`; see `workdirs`).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import queue
import threading
import time
from typing import Any, Iterator, Mapping

import jax

import numpy as np
from etils import epath

from dateopt import metrics_io, strict_json
from dateopt.metrics_io import read_metrics  # noqa: F401  (where the trainer's callers find it)
from dateopt.train import workdirs


def _scalar(value: Any) -> float:
  return float(np.asarray(value))


class MetricWriter:
  """Writes scalars to `workdir/metrics.jsonl` and `workdir/tensorboard/`.

  `metrics.jsonl` is strict JSON, one object a line: a non-finite value (NaN:
  no noise-scale estimate yet, a diverged loss; inf: a noise scale whose
  signal estimate is <= 0) is written as null. A run resumed
  from `start_step` first drops the rows a killed run wrote after that step
  (rewriting the file atomically), then appends; a key already written at
  `start_step` itself is not written again. Each (step, key) appears once.

  A local `metrics.jsonl` is appended and flushed at every write. An object in
  a bucket cannot be appended to, and GCS takes about one update of an object
  a second: there the whole file is uploaded again at most every
  `upload_every_seconds`, at `flush()` (the trainer calls it after each
  checkpoint, so a resumed run finds every row up to its checkpoint) and at
  `close()`. A gs:// workdir needs the `dateopt[gcp]` extra (tensorboardX
  writes gs:// through google-cloud-storage).

  Example:
    >>> writer = MetricWriter("/tmp/run")    # or "gs://bucket/run"
    >>> writer.write(10, {"train/loss": 0.5, "train/noise": float("nan")})
    >>> writer.close()  # metrics.jsonl: {"step": 10, "train/loss": 0.5, "train/noise": null}
  """

  def __init__(self, workdir: str | os.PathLike, *, enabled: bool = True, start_step: int = 0,
               upload_every_seconds: float = 10.0):
    self.enabled = enabled
    if not enabled:
      return
    from tensorboardX import SummaryWriter  # imported here: optional at import time.
    root = workdirs.as_path(workdir)
    workdirs.require_packages(root)  # else tensorboardX fails on gs:// naming no extra
    root.mkdir(parents=True, exist_ok=True)
    path = root / "metrics.jsonl"
    self._start_step = start_step
    kept, self._written_at_start = _rows_up_to(path, start_step)
    if kept is not None:
      workdirs.write_atomically(path, kept)
    self._jsonl = (_AppendedFile(path) if workdirs.is_local(root)
                   else _UploadedObject(path, kept or "", upload_every_seconds))
    # purge_step hides the killed run's later events from TensorBoard too.
    self._events_dir = os.fspath(root / "tensorboard")
    # The events thread's death on a failed write is reported by _check_tensorboard, once.
    self._thread_hook = threading.excepthook
    threading.excepthook = self._quiet_events_thread
    self._tensorboard = SummaryWriter(self._events_dir,
                                      purge_step=start_step + 1 if start_step else None)
    self._guard_event_queue()

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    if not self.enabled:
      return
    values = {k: _scalar(v) for k, v in scalars.items()}
    if step == self._start_step:
      values = {k: v for k, v in values.items() if k not in self._written_at_start}
      if not values:
        return
    self._jsonl.write(strict_json.line({"step": int(step), **values}))
    self._check_tensorboard()  # a put that finds the queue full checks again (_guard_event_queue)
    for key, value in values.items():
      if math.isfinite(value):
        self._tensorboard.add_scalar(key, value, int(step))

  def write_text(self, tag: str, text: str) -> None:
    if self.enabled:
      self._check_tensorboard()
      self._tensorboard.add_text(tag, f"<pre>{text}</pre>", 0)

  def flush(self) -> None:
    """Makes every row and event written so far durable (uploads them to a bucket now)."""
    if self.enabled and not self._jsonl.closed:
      self._jsonl.flush()
      self._check_tensorboard()
      try:
        self._tensorboard.flush()
      except OSError as error:  # this flush writes in this thread: a full disk lands here
        self._abandon_tensorboard()
        raise OSError(error.errno, f"the TensorBoard events in {self._events_dir} cannot be "
                      f"written: {error.strerror or error}") from error

  def _guard_event_queue(self) -> None:
    """Makes every put on tensorboardX's bounded event queue give up once its thread is dead.

    A put waits while the queue is full; if the writer thread dies meanwhile (a
    full disk), nothing will ever empty it. Checking the thread before each put
    is not enough: under load the queue fills while the thread still lives. So
    each put waits `_PUT_WAIT_SECONDS` at a time and checks the thread between.
    """
    event_writer = getattr(getattr(self._tensorboard, "file_writer", None), "event_writer", None)
    events = getattr(event_writer, "_event_queue", None)
    if events is None:  # another tensorboardX: the checks in `write` are all there is
      return
    put = events.put

    def put_while_the_writer_lives(item, block=True, timeout=None):
      del block, timeout  # always bounded waits
      while True:
        try:
          return put(item, timeout=_PUT_WAIT_SECONDS)
        except queue.Full:
          self._check_tensorboard()  # raises once the thread is gone

    events.put = put_while_the_writer_lives

  def _quiet_events_thread(self, args) -> None:
    if not (type(args.thread).__name__ == "_EventLoggerThread"
            and isinstance(args.exc_value, OSError)):
      self._thread_hook(args)

  def close(self) -> None:
    if self.enabled and threading.excepthook == self._quiet_events_thread:
      threading.excepthook = self._thread_hook
    if self.enabled and not self._jsonl.closed:
      self._jsonl.close()
      if _events_writer_alive(self._tensorboard):  # else its close would wait forever
        self._tensorboard.close()
      else:
        self._abandon_tensorboard()

  def _check_tensorboard(self) -> None:
    """Raises OSError once tensorboardX's writer thread has died.

    It dies on a failed write (a full disk, a file-size quota) without a
    word, and the next events then block forever on its bounded queue: the
    run would hang, deaf to SIGTERM.
    """
    if not _events_writer_alive(self._tensorboard):
      self._abandon_tensorboard()
      raise OSError(errno.EIO, f"the TensorBoard events in {self._events_dir} can no longer be "
                    f"written (a full disk or a file-size quota?); metrics.jsonl holds the rows "
                    f"written so far")


  def _abandon_tensorboard(self) -> None:
    """Marks a failed event file closed, so that no later call (nor tensorboardX's own
    exit hook) writes to it, waits on its dead thread, or prints its error again."""
    event_writer = getattr(getattr(self._tensorboard, "file_writer", None), "event_writer", None)
    if event_writer is not None and hasattr(event_writer, "_closed"):
      event_writer._closed = True  # pylint: disable=protected-access


_PUT_WAIT_SECONDS = 1.0  # a full event queue is re-checked for a dead writer this often


def _events_writer_alive(summary_writer: Any) -> bool:
  """Whether the thread that writes tensorboardX's event file still runs (True if unknown)."""
  file_writer = getattr(summary_writer, "file_writer", None)
  worker = getattr(getattr(file_writer, "event_writer", None), "_worker", None)
  return worker is None or worker.is_alive()


class _AppendedFile:
  """A local `metrics.jsonl`: each row appended and flushed as it is written."""

  def __init__(self, path: epath.Path):
    self._file = path.open("a", encoding="utf-8")

  @property
  def closed(self) -> bool:
    return self._file.closed

  def write(self, line: str) -> None:
    self._file.write(line)
    self._file.flush()

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


class _UploadedObject:
  """A `metrics.jsonl` in a bucket: kept in memory, the whole file uploaded now and then."""

  def __init__(self, path: epath.Path, text: str, upload_every_seconds: float):
    self._path, self._text, self._every = path, text, upload_every_seconds
    self._uploaded_at, self._pending = time.monotonic(), False
    self.closed = False

  def write(self, line: str) -> None:
    self._text += line
    self._pending = True
    if time.monotonic() - self._uploaded_at >= self._every:
      self.flush()

  def flush(self) -> None:
    if self._pending:
      self._path.write_text(self._text, encoding="utf-8")  # an object appears whole
      self._uploaded_at, self._pending = time.monotonic(), False

  def close(self) -> None:
    self.flush()
    self.closed = True


def last_logged_step(workdir: str | os.PathLike) -> int:
  """The largest step of `workdir/metrics.jsonl` (0 without the file or a row past step 0)."""
  path = workdirs.as_path(workdir) / "metrics.jsonl"
  return max((step for step, _ in metrics_io.parsed_rows(path)), default=0) if path.exists() else 0


def _rows_up_to(path: epath.Path, last_step: int) -> tuple[str | None, set[str]]:
  """(`path`'s rows up to `last_step` as strict JSON, the keys it has at `last_step`).

  Lines that do not parse (the half-written last line of a killed run) are
  dropped too. (None, {}) when there is no file.
  """
  if not path.exists():
    return None, set()
  kept, keys_at_last = [], set()
  for step, row in metrics_io.parsed_rows(path):
    if step > last_step:
      continue
    kept.append(strict_json.line(row))
    if step == last_step:
      keys_at_last.update(k for k in row if k != "step")
  return "".join(kept), keys_at_last


class ProgressBar:
  """A tqdm bar with rate and ETA on the console of process 0.

  A static recipe counts its steps. An adaptive run counts the baseline steps
  its progress τ covers (`unit="baseline step"`, total T0), moved to each
  reading with `advance_to`: its end is where τ reaches T0, not a step count,
  so its ETA follows the current pace.
  """

  def __init__(self, total: int, initial: float, *, enabled: bool = True,
               unit: str = "step"):
    self._bar = None
    if enabled:
      from tqdm.auto import tqdm
      # Python ints (whole steps): tqdm's ETA fails on NumPy scalars (no float32 timedelta).
      self._bar = tqdm(total=int(total), initial=int(initial), unit=unit, dynamic_ncols=True)

  def update(self, n: float = 1, **postfix: Any) -> None:
    if self._bar is not None:
      if postfix:
        self._bar.set_postfix({k: f"{_scalar(v):.4g}" for k, v in postfix.items()},
                              refresh=False)
      self._bar.update(n)

  def advance_to(self, value: float, **postfix: Any) -> None:
    """Moves the bar to `value`'s whole steps (never back), e.g. an adaptive run's progress τ."""
    if self._bar is not None:
      self.update(max(0, min(int(value), self._bar.total) - self._bar.n), **postfix)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None


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
    >>> clock.count_step(input_seconds=0.0); sorted(clock.lap())
    ['examples_per_second', 'input_seconds', 'input_share', 'step_seconds']

  `count_step(batch_size)` counts a step of another batch (a growing one);
  `input_seconds=` is the time the loop waited for that step's batch. A lap
  then also says `input_seconds` (per step) and `input_share`: the part of the
  wall time spent waiting for input. Near 1, the input pipeline sets the pace
  (the step is input-bound); near 0, the devices do.
  """

  def __init__(self, batch_size: int):
    self._batch_size = batch_size
    self._start: float | None = None
    self._steps = 0
    self._examples = 0
    self._input = 0.0
    self._paused = 0.0
    self._total_steps = 0
    self._total_seconds = 0.0

  def count_step(self, batch_size: int | None = None, input_seconds: float = 0.0) -> None:
    self._steps += 1
    self._examples += self._batch_size if batch_size is None else batch_size
    self._input += input_seconds

  def lap(self) -> dict[str, float]:
    now = time.perf_counter()
    out = {}
    if self._start is not None and self._steps:
      seconds = now - self._start - self._paused
      out = {"step_seconds": seconds / self._steps,
             "examples_per_second": self._examples / seconds,
             "input_seconds": self._input / self._steps,
             "input_share": min(1.0, self._input / seconds)}
      self._total_steps += self._steps
      self._total_seconds += seconds
    self._start, self._steps, self._examples = time.perf_counter(), 0, 0
    self._input, self._paused = 0.0, 0.0
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
