"""Metrics through writers: a JSONL log and TensorBoard event files, and any of yours.

The trainer writes to a `MetricWriter`, which hands every row to each of its
writers: `JsonlWriter` (`metrics.jsonl`), `TensorBoardWriter` (event files)
and the ones you add. A writer is anything with the methods of clu's
`metric_writers.MetricWriter` that the trainer calls (`Writer`): a clu writer
works as it is, and a W&B one is four short methods.

Only process 0 writes; every other process gets no-op writers. The workdir is
local or a bucket (`gs://bucket/run`, through `etils.epath`; see `workdirs`).

Example:
  >>> class PrintWriter:                    # e.g. wandb.log in write_scalars
  ...   def write_scalars(self, step, scalars): print(step, dict(scalars))
  ...   def write_texts(self, step, texts): pass
  ...   def flush(self): pass
  ...   def close(self): pass
  >>> writer = MetricWriter("/tmp/run", extra_writers=[PrintWriter()])
  >>> writer.write(10, {"train/loss": 0.5})
  10 {'train/loss': 0.5}
  >>> writer.close()
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import socket
import struct
import time
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import jax

import numpy as np
from etils import epath

from dateopt import metrics_io, strict_json
from dateopt.metrics_io import read_metrics  # noqa: F401  (where the trainer's callers find it)
from dateopt.train import workdirs


def _scalar(value: Any) -> float:
  return float(np.asarray(value))


@runtime_checkable
class Writer(Protocol):
  """A metric writer: the part of clu's `metric_writers.MetricWriter` the trainer calls.

  Any clu writer satisfies it as it is (`clu.metric_writers.SummaryWriter`,
  `LoggingWriter`, `AsyncWriter`, ...), and so does a plain class with these
  four methods. Scalars come as Python floats (NaN and inf too); texts are
  plain text, the run's recipe table at step 0.

  Example:
    >>> class PrintWriter:
    ...   def write_scalars(self, step, scalars): print(step, dict(scalars))
    ...   def write_texts(self, step, texts): pass
    ...   def flush(self): pass
    ...   def close(self): pass
    >>> isinstance(PrintWriter(), Writer)
    True
  """

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> Any:
    """Writes the scalars of `step` (the same key is never written twice at a step)."""

  def write_texts(self, step: int, texts: Mapping[str, str]) -> Any:
    """Writes text snippets, name to text, at `step`."""

  def flush(self) -> Any:
    """Writes out anything held back (the trainer calls it after each checkpoint)."""

  def close(self) -> Any:
    """Flushes, then frees what the writer holds; nothing is written after it."""


class MetricWriter:
  """Every row to each of `writers`: `metrics.jsonl`, TensorBoard's events, and yours.

  The trainer's writer: `JsonlWriter` and `TensorBoardWriter` on `workdir`,
  then `extra_writers` (anything satisfying `Writer`, e.g. a clu or W&B
  writer; closed with this one). A resumed run (`start_step`) keeps the rows
  up to that step only, in `metrics.jsonl` and TensorBoard alike, and a key
  `metrics.jsonl` already has at `start_step` goes to no writer again: each
  (step, key) reaches each writer once.

  A writer that fails (a full disk) raises, but only once every other writer
  has had the row; the first error is the one raised.

  Example:
    >>> writer = MetricWriter("/tmp/run")    # or "gs://bucket/run"
    >>> writer.write(10, {"train/loss": 0.5, "train/noise": float("nan")})
    >>> writer.close()  # metrics.jsonl: {"step": 10, "train/loss": 0.5, "train/noise": null}
  """

  def __init__(self, workdir: str | os.PathLike, *, enabled: bool = True, start_step: int = 0,
               upload_every_seconds: float = 10.0, extra_writers: Sequence[Writer] = ()):
    self.enabled = enabled
    self.writers: list[Writer] = []
    if not enabled:
      return
    extra_writers = list(extra_writers)
    _check_writers(extra_writers)
    self._jsonl = JsonlWriter(workdir, start_step=start_step,
                              upload_every_seconds=upload_every_seconds)
    try:  # purge_step hides the killed run's later events from TensorBoard too.
      events = TensorBoardWriter(workdirs.as_path(workdir) / "tensorboard",
                                 purge_step=start_step + 1 if start_step else None)
    except BaseException:
      self._jsonl.close()
      raise
    self.writers = [self._jsonl, events, *extra_writers]
    self._closed = False

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    if not self.enabled:
      return
    values = self._jsonl.unwritten(step, {k: _scalar(v) for k, v in scalars.items()})
    if values:
      _call_each(self.writers, lambda writer: writer.write_scalars(int(step), values))

  def write_text(self, tag: str, text: str, *, step: int = 0) -> None:
    if self.enabled:
      _call_each(self.writers, lambda writer: writer.write_texts(step, {tag: text}))

  def flush(self) -> None:
    """Makes every row and event written so far durable (uploads them to a bucket now)."""
    if self.enabled and not self._closed:
      _call_each(self.writers, lambda writer: writer.flush())

  def close(self) -> None:
    if self.enabled and not self._closed:
      self._closed = True
      _call_each(self.writers, lambda writer: writer.close())


def _check_writers(writers: Sequence[Any]) -> None:
  """Raises TypeError naming a writer that lacks one of `Writer`'s methods."""
  for writer in writers:
    if not isinstance(writer, Writer):
      missing = [name for name in ("write_scalars", "write_texts", "flush", "close")
                 if not callable(getattr(writer, name, None))]
      raise TypeError(f"{writer!r} is not a metric writer: it has no {', '.join(missing)} "
                      f"(see dateopt.train.Writer)")


def _call_each(writers: Sequence[Writer], call: Callable[[Writer], Any]) -> None:
  """`call(writer)` for every writer, then the first error raised: one that fails (a full
  disk) keeps no other from the row, nor from closing."""
  first = None
  for writer in writers:
    try:
      call(writer)
    except Exception as error:  # pylint: disable=broad-except  (raised below)
      first = first or error
  if first is not None:
    raise first


class JsonlWriter:
  """Scalars to `workdir/metrics.jsonl`, one strict-JSON object a line.

  A non-finite value (NaN: no noise-scale estimate yet, a diverged loss; inf:
  a noise scale whose signal estimate is <= 0) is written as null. A run
  resumed from `start_step` first drops the rows a killed run wrote after
  that step (rewriting the file atomically), then appends; a key already
  written at `start_step` itself is not written again (`unwritten`). Each
  (step, key) appears once. Texts are not written (the recipe is in
  `recipe.txt`).

  A local `metrics.jsonl` is appended and flushed at every write. An object in
  a bucket cannot be appended to, and GCS takes about one update of an object
  a second: there the whole file is uploaded again at most every
  `upload_every_seconds`, at `flush()` (the trainer calls it after each
  checkpoint, so a resumed run finds every row up to its checkpoint) and at
  `close()`. A gs:// workdir needs the `dateopt[gcp]` extra.

  Example:
    >>> writer = JsonlWriter("/tmp/run")    # or "gs://bucket/run"
    >>> writer.write_scalars(10, {"train/loss": 0.5, "train/noise": float("nan")})
    >>> writer.close()  # metrics.jsonl: {"step": 10, "train/loss": 0.5, "train/noise": null}
  """

  def __init__(self, workdir: str | os.PathLike, *, start_step: int = 0,
               upload_every_seconds: float = 10.0, filename: str = "metrics.jsonl"):
    root = workdirs.as_path(workdir)
    workdirs.require_packages(root)  # else epath fails on gs:// naming no extra
    root.mkdir(parents=True, exist_ok=True)
    path = root / filename
    self.start_step = start_step
    kept, self._written_at_start = _rows_up_to(path, start_step)
    if kept is not None:
      workdirs.write_atomically(path, kept)
    self._file = (_AppendedFile(path) if workdirs.is_local(root)
                  else _UploadedObject(path, kept or "", upload_every_seconds))

  def unwritten(self, step: int, scalars: Mapping[str, Any]) -> dict[str, Any]:
    """`scalars` less the keys the file already had at `step` (a resumed run's first step)."""
    if step != self.start_step:
      return dict(scalars)
    return {k: v for k, v in scalars.items() if k not in self._written_at_start}

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    self.write_row(step, {k: _scalar(v) for k, v in scalars.items()})

  def write_row(self, step: int, row: Mapping[str, Any]) -> None:
    """`row`'s JSON values as they are (strings, ints, bools too) at `step`."""
    values = self.unwritten(step, row)
    if values:
      self._file.write(strict_json.line({"step": int(step), **values}))

  def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
    del step, texts  # a file of numbers

  def flush(self) -> None:
    if not self._file.closed:
      self._file.flush()

  def close(self) -> None:
    if not self._file.closed:
      self._file.close()


class TensorBoardWriter:
  """Scalars and texts to a new TensorBoard event file in `logdir`, in the caller's thread.

  Written synchronously on purpose: a failed write (a full disk, a file-size
  quota) raises OSError in the caller, at once. (tensorboardX's SummaryWriter
  writes from a thread that dies on such a failure, and its bounded queue
  then blocks the run for good.) The event file is what tensorboardX writes:
  TFRecord-framed `Event` protos of its `summary.scalar` and `summary.text`.

  Non-finite scalars are left out. `purge_step` (a resumed run's first new
  step) hides from TensorBoard the events earlier files have from that step
  on, as tensorboardX's `purge_step` does. Texts show preformatted. As in
  tensorboardX, events are buffered: written out (a local file synced, a
  bucket's, gs:// through tensorboardX's google-cloud-storage writer,
  uploaded whole) at `flush()`, `close()` and at most every
  `flush_every_seconds`; locally also whenever the file's buffer fills. A
  bucket's upload is the whole file, in the training thread: on a very long
  run to gs://, a larger `flush_every_seconds` trades the step time it takes
  against the events a killed run loses. One thread writes (the trainer's).

  Example:
    >>> writer = TensorBoardWriter("/tmp/run/tensorboard")
    >>> writer.write_scalars(10, {"train/loss": 0.5, "train/noise": float("nan")})
    >>> writer.close()  # one scalar event: train/loss at step 10
  """

  def __init__(self, logdir: str | os.PathLike, *, purge_step: int | None = None,
               flush_every_seconds: float = 120.0):
    from tensorboardX import record_writer  # imported here: optional at import time.
    self.logdir = os.fspath(logdir)
    workdirs.require_packages(self.logdir)  # else tensorboardX fails on gs:// naming no extra
    self._local, self._every = workdirs.is_local(self.logdir), flush_every_seconds
    self._file: Any = None
    self._failure: OSError | None = None

    def open_file():
      record_writer.directory_check(self.logdir)
      self.path = _new_events_path(self.logdir)
      self._file = record_writer.open_file(self.path)

    self._guarded(open_file)
    self._flushed_at = time.monotonic()
    self._write(_opening_events(purge_step))

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    from tensorboardX import summary
    finite = {k: v for k, v in ((k, _scalar(v)) for k, v in scalars.items()) if math.isfinite(v)}
    self._write([_event(step, summary.scalar(k, v)) for k, v in finite.items()])

  def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
    from tensorboardX import summary
    self._write([_event(step, summary.text(tag, f"<pre>{text}</pre>"))
                 for tag, text in texts.items()])

  def flush(self) -> None:
    if self._open():
      self._guarded(self._file.flush)  # a bucket's: the upload
      if self._local:
        self._guarded(lambda: os.fsync(self._file.fileno()))
      self._flushed_at = time.monotonic()

  def close(self) -> None:
    """Flushes and closes the file; after a failed write, only lets it go."""
    if self._file is not None and self._failure is None:
      self.flush()
      self._guarded(self._file.close)
    self._file = None

  def _open(self) -> bool:
    """Whether the file takes writes; raises again if one failed (the next row would be lost)."""
    if self._failure is not None:
      raise _caused_by(OSError(self._failure.errno, self._failure.strerror), self._failure)
    return self._file is not None

  def _write(self, events: Sequence[Any]) -> None:
    if not self._open() or not events:
      return
    records = b"".join(_record(event.SerializeToString()) for event in events)
    self._guarded(lambda: self._file.write(records))
    if time.monotonic() - self._flushed_at >= self._every:
      self.flush()

  def _guarded(self, write: Callable[[], Any]) -> None:
    """`write()`; a failed one raises as an OSError naming the event directory.

    It is raised after the except block, with the failure as its cause, not
    `from` it: an error it happens while handling (a failed checkpoint save,
    in the cleanup) stays its context, where the CLI finds the first failure.
    The file is then let go: closing it would try the same write again.
    """
    try:
      write()
      return
    except OSError as error:
      failure = error
    except Exception as error:  # pylint: disable=broad-except
      if self._local:
        raise
      # A bucket's client raises its own errors (google.api_core's, auth): an I/O error too.
      failure = _caused_by(OSError(errno.EIO, f"{type(error).__name__}: {error}"), error)
    if self._file is not None:
      with contextlib.suppress(Exception):
        self._file.close()
    self._file = None
    message = (f"the TensorBoard events in {self.logdir} cannot be written: "
               f"{failure.strerror or failure}")
    self._failure = _caused_by(OSError(failure.errno, message), failure)
    raise self._failure


def _caused_by(error: OSError, cause: BaseException) -> OSError:
  """`error` with `cause` as its cause, and its context still shown (unlike `raise ... from`)."""
  error.__cause__ = cause
  error.__suppress_context__ = False  # setting a cause sets it
  return error


def _new_events_path(logdir: str) -> str:
  """`logdir/events.out.tfevents.<seconds>.<host>`, as tensorboardX names it, with `.N`
  after it if that file exists: a run resumed within the second must not overwrite it, and
  TensorBoard reads the files in name order, so the later one's purge must sort last."""
  base = f"{logdir}/events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
  path, n = base, 0
  while epath.Path(path).exists():
    n += 1
    path = f"{base}.{n}"
  return path


def _opening_events(purge_step: int | None) -> list[Any]:
  """A file's first events: its version, then (resuming) the purge of steps >= `purge_step`."""
  from tensorboardX.proto import event_pb2
  version = "brain.Event:2"
  events = [event_pb2.Event(wall_time=time.time(), file_version=version)]
  if purge_step is not None:  # what tensorboardX's SummaryWriter(purge_step=) writes
    events += [event_pb2.Event(wall_time=time.time(), step=purge_step, file_version=version),
               event_pb2.Event(wall_time=time.time(), step=purge_step, session_log=(
                   event_pb2.SessionLog(status=event_pb2.SessionLog.START)))]
  return events


def _event(step: int, summary: Any) -> Any:
  from tensorboardX.proto import event_pb2
  return event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)


def _record(data: bytes) -> bytes:
  """`data` framed as one TFRecord: its length, the length's masked CRC, it, its masked CRC."""
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", _masked_crc32c(length))
          + data + struct.pack("<I", _masked_crc32c(data)))


def _masked_crc32c(data: bytes) -> int:
  """TFRecord's masked CRC-32C of `data` (masked: a CRC of bytes holding CRCs stays sound)."""
  from tensorboardX.crc32c import crc32c
  crc = crc32c(data)
  rotated = ((crc >> 15) | (crc << 17)) & 0xFFFFFFFF
  return (rotated + 0xA282EAD8) & 0xFFFFFFFF


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
    """The rows on the disk, not only in the OS's cache: a checkpoint's rows survive a
    power-off, as its events and its checkpoint do."""
    self._file.flush()
    os.fsync(self._file.fileno())

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
