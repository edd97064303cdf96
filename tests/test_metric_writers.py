"""The metric writers: metrics.jsonl, TensorBoard's event files, a user's writer, a full disk.

The event files are read back here with a TFRecord reader of our own that checks each CRC
against a bit-by-bit CRC-32C (not tensorboardX's table), and TensorBoard's purge is applied
as TensorBoard applies it: a `SessionLog.START` at step s hides the steps >= s read before.
Where the `tensorboard` package is installed, its own event loader reads them too.
"""

import errno
import json
import math
import inspect
import pathlib
import re
import struct
import subprocess
import sys
import textwrap
import threading

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX import record_writer
from tensorboardX.proto import event_pb2

from dateopt import train
from dateopt.train import metrics

import tiny_config  # tests/tiny_config.py


def _crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), one bit at a time."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
  return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _records(path) -> list[bytes]:
  """The TFRecords of `path`, each CRC checked."""
  data, records, at = path.read_bytes(), [], 0
  while at < len(data):
    length_bytes = data[at:at + 8]
    (length,), (length_crc,) = struct.unpack("<Q", length_bytes), struct.unpack(
        "<I", data[at + 8:at + 12])
    assert length_crc == _masked(_crc32c(length_bytes)), f"bad length CRC at byte {at}"
    record = data[at + 12:at + 12 + length]
    (record_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
    assert record_crc == _masked(_crc32c(record)), f"bad data CRC at byte {at}"
    records.append(record)
    at += 16 + length
  return records


def _events(logdir) -> list[list[event_pb2.Event]]:
  """Each event file's events, the files in name order (TensorBoard's reading order)."""
  return [[event_pb2.Event.FromString(r) for r in _records(path)]
          for path in sorted(logdir.glob("*tfevents*"))]


def _shown_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
  """tag -> [(step, value)] as TensorBoard shows them: purged steps left out."""
  shown: dict[str, list[tuple[int, float]]] = {}
  for event in (e for events in _events(logdir) for e in events):
    if event.session_log.status == event_pb2.SessionLog.START:
      shown = {tag: [(s, v) for s, v in points if s < event.step]
               for tag, points in shown.items()}
    for value in event.summary.value:
      if value.HasField("simple_value"):
        shown.setdefault(value.tag, []).append((event.step, value.simple_value))
  return shown


def _jsonl(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


class _RecordingWriter:
  """A user's writer: the four methods, nothing else."""

  def __init__(self):
    self.rows, self.texts, self.calls = [], [], []

  def write_scalars(self, step, scalars):
    self.rows.append({"step": step, **scalars})

  def write_texts(self, step, texts):
    self.texts.append((step, dict(texts)))

  def flush(self):
    self.calls.append("flush")

  def close(self):
    self.calls.append("close")


def _as_in_jsonl(row: dict) -> dict:
  """`row` as metrics.jsonl holds it: non-finite values null."""
  return {k: None if isinstance(v, float) and not math.isfinite(v) else v
          for k, v in row.items()}


def test_the_independent_crc_is_crc32c():
  assert _crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)


def test_rows_round_trip_through_metrics_jsonl(tmp_path):
  writer = metrics.JsonlWriter(tmp_path)
  writer.write_scalars(1, {"a": 1.5, "b": np.float32(0.25), "c": jnp.asarray(2.0)})
  writer.write_scalars(2, {"a": float("nan"), "b": -np.inf})
  writer.write_texts(0, {"recipe": "not a number"})  # left out
  writer.close()
  rows = [{"step": 1, "a": 1.5, "b": 0.25, "c": 2.0}, {"step": 2, "a": None, "b": None}]
  assert _jsonl(tmp_path) == rows and train.read_metrics(str(tmp_path)) == rows


def test_event_files_hold_the_scalars_at_their_steps_with_valid_crcs(tmp_path):
  writer = metrics.MetricWriter(tmp_path)
  writer.write_text("recipe", "batch | lr\n512 | 0.1")
  for step in (10, 20, 30):
    writer.write(step, {"train/loss": 1.0 / step, "train/noise": float("nan")})
  writer.flush()
  writer.close()
  (events,) = _events(tmp_path / "tensorboard")
  assert events[0].file_version == "brain.Event:2"
  assert _shown_scalars(tmp_path / "tensorboard") == {  # no NaN point
      "train/loss": [(10, pytest.approx(0.1)), (20, pytest.approx(0.05)),
                     (30, pytest.approx(1 / 30))]}
  (text,) = [v for e in events for v in e.summary.value if v.tag == "recipe/text_summary"]
  assert text.metadata.plugin_data.plugin_name == "text"
  assert text.tensor.string_val == [b"<pre>batch | lr\n512 | 0.1</pre>"]


def test_tensorboard_itself_reads_the_event_files_and_purges(tmp_path):
  # pylint: disable-next=import-outside-toplevel
  from tensorboard.backend.event_processing import event_accumulator as accumulator
  first = metrics.MetricWriter(tmp_path)
  for step in range(1, 6):
    first.write(step, {"train/loss": float(step)})
  first.close()
  resumed = metrics.MetricWriter(tmp_path, start_step=3)
  resumed.write(4, {"train/loss": 40.0})
  resumed.close()
  events = accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
  events.Reload()
  assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
      (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_a_resumed_run_drops_later_rows_and_purges_later_events(tmp_path):
  first = metrics.MetricWriter(tmp_path)
  for step in range(1, 6):
    first.write(step, {"train/loss": float(step)})
  first.close()
  resumed = metrics.MetricWriter(tmp_path, start_step=3)  # most likely within the same second
  resumed.write(3, {"train/loss": 3.0, "eval/accuracy": 0.5})  # train/loss is there already
  resumed.write(4, {"train/loss": 40.0})
  resumed.close()
  assert _jsonl(tmp_path) == [{"step": 1, "train/loss": 1.0}, {"step": 2, "train/loss": 2.0},
                              {"step": 3, "train/loss": 3.0}, {"step": 3, "eval/accuracy": 0.5},
                              {"step": 4, "train/loss": 40.0}]
  old, new = _events(tmp_path / "tensorboard")  # two files: the first is not overwritten
  assert [e.step for e in old if e.summary.value] == [1, 2, 3, 4, 5]
  assert [e.step for e in new if e.session_log.status == event_pb2.SessionLog.START] == [4]
  assert _shown_scalars(tmp_path / "tensorboard") == {
      "train/loss": [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)], "eval/accuracy": [(3, 0.5)]}


def test_a_user_writer_gets_every_scalar_metrics_jsonl_gets(tmp_path):
  first = metrics.MetricWriter(tmp_path)
  first.write(2, {"train/loss": 0.5, "train/noise": float("nan")})
  first.close()
  kept = len(_jsonl(tmp_path))
  mine = _RecordingWriter()
  writer = metrics.MetricWriter(tmp_path, start_step=2, extra_writers=[mine])
  writer.write_text("recipe", "the table")
  writer.write(2, {"train/loss": 0.5, "eval/accuracy": 0.75})  # train/loss: written already
  writer.write(3, {"train/loss": np.float32(0.25), "train/noise": float("inf")})
  writer.write(3, {"eval/accuracy": jnp.asarray(0.8)})
  writer.flush()
  writer.close()
  writer.close()  # a second close is a no-op
  assert [_as_in_jsonl(row) for row in mine.rows] == _jsonl(tmp_path)[kept:]
  assert all(type(v) is float for row in mine.rows for k, v in row.items() if k != "step")
  assert mine.texts == [(0, {"recipe": "the table"})]  # plain: <pre> is TensorBoard's
  assert mine.calls == ["flush", "close"]


class _CluStyleWriter:
  """clu's `metric_writers.MetricWriter` interface, as a duck."""

  def write_summaries(self, step, values, metadata=None): pass
  def write_scalars(self, step, scalars): pass
  def write_images(self, step, images): pass
  def write_videos(self, step, videos): pass
  def write_audios(self, step, audios, *, sample_rate): pass
  def write_texts(self, step, texts): pass
  def write_histograms(self, step, arrays, num_buckets=None): pass
  def write_hparams(self, hparams): pass
  def flush(self): pass
  def close(self): pass


class _NoTexts:
  def write_scalars(self, step, scalars): pass
  def flush(self): pass
  def close(self): pass


def test_a_clu_style_writer_is_a_writer_and_one_without_texts_is_refused(tmp_path):
  assert isinstance(_CluStyleWriter(), train.Writer)
  assert isinstance(metrics.JsonlWriter(tmp_path / "a"), train.Writer)
  assert isinstance(metrics.TensorBoardWriter(tmp_path / "b"), train.Writer)
  assert not isinstance(_NoTexts(), train.Writer)
  with pytest.raises(TypeError, match="is not a metric writer: it has no write_texts"):
    metrics.MetricWriter(tmp_path, extra_writers=[_NoTexts()])


def _clu_writer_methods() -> dict[str, list[str]]:
  """clu's `MetricWriter` methods and their parameters, read from clu's source: importing
  `clu.metric_writers` needs TensorFlow, which the tests do not install."""
  import ast  # pylint: disable=import-outside-toplevel
  import importlib.util  # pylint: disable=import-outside-toplevel
  (package,) = importlib.util.find_spec("clu").submodule_search_locations
  tree = ast.parse(pathlib.Path(package, "metric_writers", "interface.py").read_text())
  (writer,) = [node for node in tree.body
               if isinstance(node, ast.ClassDef) and node.name == "MetricWriter"]
  return {f.name: [a.arg for a in f.args.args] for f in writer.body
          if isinstance(f, ast.FunctionDef)}


def test_the_writer_protocol_is_a_subset_of_clus_metric_writer():
  clu_methods = _clu_writer_methods()
  for name in ("write_scalars", "write_texts", "flush", "close"):
    ours = list(inspect.signature(getattr(train.Writer, name)).parameters)
    assert clu_methods[name] == ours, name  # the same methods, the same parameters


class _FullDiskFile:
  """A local event file with `room` bytes left on its disk."""

  def __init__(self, path, room):
    self._file, self._room = open(path, "wb"), room

  def write(self, data):
    if len(data) > self._room:
      raise OSError(errno.ENOSPC, "No space left on device")
    self._room -= len(data)
    return self._file.write(data)

  def flush(self):
    self._file.flush()

  def fileno(self):
    return self._file.fileno()

  def close(self):
    self._file.close()


def test_a_full_disk_raises_one_oserror_in_the_caller_and_close_does_not_hang(tmp_path,
                                                                               monkeypatch):
  monkeypatch.setattr(record_writer, "open_file", lambda path: _FullDiskFile(path, 400))
  mine = _RecordingWriter()
  writer = metrics.MetricWriter(tmp_path, extra_writers=[mine])
  writer.write(1, {"train/loss": 1.0})
  events_dir = tmp_path / "tensorboard"
  message = f"the TensorBoard events in {events_dir} cannot be written: No space left on device"
  with pytest.raises(OSError) as raised:
    writer.write(2, {f"train/m{i}": float(i) for i in range(30)})
  assert raised.value.strerror == message and raised.value.errno == errno.ENOSPC
  assert raised.value.__cause__.errno == errno.ENOSPC
  assert [r["step"] for r in _jsonl(tmp_path)] == [1, 2]  # the other writers had the row
  assert [r["step"] for r in mine.rows] == [1, 2]
  with pytest.raises(OSError, match=re.escape(message)):  # never a lost row in silence
    writer.flush()
  closing = threading.Thread(target=writer.close, daemon=True)
  closing.start()
  closing.join(timeout=10)
  assert not closing.is_alive(), "close hung after the failed write"
  assert mine.calls == ["flush", "close"]


class _RefusingBucketFile:
  """A bucket's event file whose upload its client refuses (not an OSError)."""

  def write(self, data):
    del data

  def flush(self):
    raise RuntimeError("403 POST https://storage.googleapis.com/...: permission denied")

  def close(self):
    self.closed = getattr(self, "closed", 0) + 1


def test_a_bucket_clients_own_error_is_an_oserror_naming_the_events(tmp_path, monkeypatch):
  bucket_file = _RefusingBucketFile()
  monkeypatch.setattr(record_writer, "open_file", lambda path: bucket_file)
  monkeypatch.setattr(metrics.workdirs, "is_local", lambda path: False)
  writer = metrics.TensorBoardWriter(tmp_path / "tensorboard")
  writer.write_scalars(1, {"train/loss": 1.0})
  with pytest.raises(OSError) as raised:
    writer.flush()
  assert raised.value.errno == errno.EIO
  assert raised.value.strerror.startswith(
      f"the TensorBoard events in {tmp_path / 'tensorboard'} cannot be written: RuntimeError: "
      "403 POST")
  writer.close()  # lets the file go: no second upload
  assert bucket_file.closed == 1  # once, when the flush failed


_FILLS_A_FILE_SIZE_LIMIT = textwrap.dedent("""
  import resource, signal, sys, threading
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the writer
  resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))
  from dateopt.train import metrics
  writer = metrics.MetricWriter(sys.argv[1])
  writer.write_text("recipe", "x" * 2000)
  try:
    for step in range(1, 1000):
      writer.write(step, {f"train/metric_{i}": float(i) for i in range(10)})
  except OSError as error:
    print(step, error.errno, error, flush=True)
  writer.close()
  print("closed", threading.active_count(), flush=True)
""")


@pytest.mark.slow  # a subprocess
def test_a_file_size_limit_fails_the_write_in_the_callers_thread(tmp_path):
  done = subprocess.run([sys.executable, "-c", _FILLS_A_FILE_SIZE_LIMIT, str(tmp_path)],
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  failed, closed = done.stdout.splitlines()
  step, number, message = failed.split(" ", 2)
  assert int(step) > 1 and int(number) == errno.EFBIG
  assert message == (f"[Errno {errno.EFBIG}] the TensorBoard events in {tmp_path}/tensorboard "
                     "cannot be written: File too large")
  assert closed == "closed 1"  # no writer thread was ever started
  assert done.stderr == ""
  assert max(r["step"] for r in _jsonl(tmp_path)) == int(step)


@pytest.mark.slow  # a training run
def test_train_and_evaluate_hands_every_row_to_the_users_writers(tmp_path):
  mine = _RecordingWriter()
  config = tiny_config.with_fields(num_train_steps=4, log_every_steps=2, eval_every_steps=-1,
                                   checkpoint_every_steps=0, statistics=False, guard=False,
                                   grad_groups=0)
  train.train_and_evaluate(config, str(tmp_path), metric_writers=[mine])
  assert [_as_in_jsonl(row) for row in mine.rows] == _jsonl(tmp_path)
  assert {"train/loss", "eval/accuracy", "run/steps"} <= {k for r in mine.rows for k in r}
  assert [step for step, texts in mine.texts] == [0] and mine.calls[-1] == "close"


def test_a_failed_events_write_during_another_error_keeps_it_as_its_context(tmp_path,
                                                                            monkeypatch):
  """The CLI names the first failure of a chain: a full disk fails a checkpoint save, then
  the events of the cleanup."""
  monkeypatch.setattr(record_writer, "open_file", lambda path: _FullDiskFile(path, 100))
  writer = metrics.MetricWriter(tmp_path)
  save_failed = OSError(errno.ENOSPC, "No space left on device", "checkpoints/20")
  with pytest.raises(OSError) as raised:
    try:
      raise save_failed
    except OSError:
      writer.write(20, {f"train/m{i}": float(i) for i in range(30)})
  assert raised.value.__context__ is save_failed and not raised.value.__suppress_context__
  assert raised.value.__cause__.errno == errno.ENOSPC
  writer.close()
