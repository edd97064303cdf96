"""Workdirs local or in a bucket: every file a run writes goes through `etils.epath`.

The bucket is a fake `gs://` in memory (fsspec's memory filesystem behind
epath's fsspec backend, which is what epath uses for gs:// without
TensorFlow) with a fake tensorboardX gs:// writer. What it cannot stand in
for: orbax writes the arrays of a gs:// checkpoint through tensorstore's own
GCS driver, which speaks HTTP to GCS and cannot be pointed at an fsspec
store. So in the bucket orbax's `CheckpointManager` is replaced by a fake
with its API (a step a directory, holding the state) that records the
directory it was given; real orbax saves and restores are tested on local
workdirs here and in test_faults.py.
"""

import io
import json
import logging
import os
import pickle
import socket
from typing import ClassVar

import jax
import numpy as np
import pytest
from etils import epath
from etils.epath import backend as epath_backend
from fsspec.implementations.memory import MemoryFileSystem
from tensorboardX import record_writer

from dateopt import train
from dateopt.train import checkpoint, metrics, workdir_lock, workdirs

import tiny_config  # tests/tiny_config.py

RUN = "gs://bucket/run"


def _config(**overrides):
  """The tiny MNIST-1D LSTM, 6 steps, a checkpoint every 3; run it on one device.

  The files are what is tested here: no statistics, guard or noise-scale
  groups, which halves the compilation.
  """
  return tiny_config.with_fields(**{"num_train_steps": 6, "log_every_steps": 2,
                                    "eval_every_steps": -1, "checkpoint_every_steps": 3,
                                    "statistics": False, "guard": False, "grad_groups": 0,
                                    **overrides})


class _FakeGcs(MemoryFileSystem):
  """fsspec's memory filesystem answering to gs:// paths, as gcsfs would."""

  protocol = ("gs", "gcs")

  @classmethod
  def _strip_protocol(cls, path):
    path = os.fspath(path)
    return MemoryFileSystem._strip_protocol(path.removeprefix("gs://").removeprefix("gcs://"))

  def files(self) -> list[str]:
    return sorted("gs:/" + key for key in self.store)


class _BucketEventFile:
  """tensorboardX's gs:// record writer, writing into the fake bucket through epath."""

  def __init__(self, path):
    self._path, self._buffer = epath.Path(path), io.BytesIO()

  def write(self, data):
    self._buffer.write(data)

  def flush(self):
    self._path.write_bytes(self._buffer.getvalue())  # the whole object again, as GCS takes it

  def close(self):
    self.flush()


class _BucketEventFiles:
  def open(self, path):
    return _BucketEventFile(path)

  def directory_check(self, path):
    del path  # a bucket has no directories to make


class _FakeCheckpointManager:
  """orbax's `CheckpointManager` API over epath: a step is `<dir>/<step>/default/state.pkl`.

  Records every directory it is opened on (`opened`), to show what orbax is handed.
  """

  opened: ClassVar[list[str]] = []

  def __init__(self, directory, options=None):
    del options
    self.directory = epath.Path(directory)
    self.opened.append(os.fspath(directory))
    self.directory.mkdir(parents=True, exist_ok=True)

  def all_steps(self):
    return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())

  def latest_step(self):
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step, args, force=False):
    del force
    item = self.directory / str(step) / "default"
    item.mkdir(parents=True, exist_ok=True)
    (item / "state.pkl").write_bytes(pickle.dumps(jax.device_get(args.item)))

  def restore(self, step, args):
    state = pickle.loads((self.directory / str(step) / "default" / "state.pkl").read_bytes())
    return jax.tree.map(lambda x, like: jax.device_put(x, like.sharding), state, args.item)

  def wait_until_finished(self):
    pass

  def close(self):
    pass


@pytest.fixture
def bucket(monkeypatch, tmp_path):
  """The fake gs:// store; the current directory is an empty tmp dir, to see nothing lands there.

  gcsfs and google-cloud-storage are reported installed: the fakes stand in for them.
  """
  store = _FakeGcs(global_store=False, skip_instance_cache=True)
  monkeypatch.setenv("EPATH_USE_TF", "false")  # epath's fsspec backend even where TF is
  monkeypatch.setattr(epath_backend.fsspec_backend, "fs", lambda path: store)
  monkeypatch.setattr(workdirs.extras, "installed", lambda module: True)
  monkeypatch.setitem(record_writer.REGISTERED_FACTORIES, "gs", _BucketEventFiles())
  monkeypatch.setattr(checkpoint.ocp, "CheckpointManager", _FakeCheckpointManager)
  monkeypatch.setattr(_FakeCheckpointManager, "opened", [])
  monkeypatch.chdir(tmp_path)
  yield store
  assert list(tmp_path.iterdir()) == [], "a gs:// workdir wrote on the local disk"


def _rows(text):
  return [json.loads(line) for line in text.splitlines()]


# --- Paths --------------------------------------------------------------------------------

def test_as_path_makes_a_local_path_absolute_and_keeps_a_url(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert os.fspath(workdirs.as_path("run")) == os.path.join(str(tmp_path), "run")
  assert os.fspath(workdirs.as_path(RUN) / "checkpoints") == RUN + "/checkpoints"
  assert workdirs.is_local(tmp_path) and not workdirs.is_local(RUN)
  for url in ("memory://run", "s3://bucket/run"):  # else the local directory ./memory:/run
    with pytest.raises(ValueError, match=rf"{url.split(':')[0]}:// is not supported; use a local "
                                         r"path or gs://bucket/run"):
      workdirs.as_path(url)
  for empty in ("", "  "):  # an unset $WORKDIR: never the current directory
    with pytest.raises(ValueError, match="the workdir is empty"):
      workdirs.as_path(empty)


def test_a_missing_gcs_package_names_the_gcp_extra(monkeypatch, tmp_path):
  monkeypatch.setattr(workdirs.extras, "installed", lambda module: module != "google.cloud.storage")
  with pytest.raises(ModuleNotFoundError,
                     match=r"needs google-cloud-storage: pip install 'dateopt\[gcp\]'"):
    metrics.MetricWriter(RUN)  # tensorboardX writes gs:// through google-cloud-storage
  monkeypatch.setattr(workdirs.extras, "installed", lambda module: module != "gcsfs")
  monkeypatch.chdir(tmp_path)
  with pytest.raises(train.StartupError, match=r"needs gcsfs: pip install 'dateopt\[gcp\]'"):
    train.train_and_evaluate(_config(), RUN)  # before any work
  assert list(tmp_path.iterdir()) == []


# --- Whole runs ---------------------------------------------------------------------------

def test_a_relative_local_workdir_gets_every_file(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  result = train.train_and_evaluate(_config(), "run", devices=jax.devices()[:1])
  run = tmp_path / "run"
  assert json.loads((run / "recipe.json").read_text())["planned"]["batch_size"] == 64
  assert (run / "recipe.txt").read_text().strip()
  assert {"train/loss", "eval/accuracy"} <= {k for r in _rows((run / "metrics.jsonl")
                                                              .read_text()) for k in r}
  assert os.listdir(run / "tensorboard")
  assert sorted(p for p in os.listdir(run / "checkpoints") if p.isdigit()) == ["3", "6"]
  assert not (run / workdir_lock.LOCK_NAME).exists() and result.steps == 6


def test_a_gs_workdir_run_writes_everything_to_the_bucket(bucket):
  result = train.train_and_evaluate(_config(), RUN, devices=jax.devices()[:1])
  assert result.steps == 6
  files = bucket.files()
  assert {f"{RUN}/recipe.json", f"{RUN}/recipe.txt", f"{RUN}/metrics.jsonl"} <= set(files)
  assert any(f.startswith(f"{RUN}/tensorboard/events.out.tfevents") for f in files)
  assert {f"{RUN}/checkpoints/3/default/state.pkl", f"{RUN}/checkpoints/6/default/state.pkl"
          } <= set(files)
  assert f"{RUN}/{workdir_lock.LOCK_NAME}" not in files  # released
  assert _FakeCheckpointManager.opened == [f"{RUN}/checkpoints"]  # not ./gs:/bucket/...
  rows = _rows(epath.Path(f"{RUN}/metrics.jsonl").read_text())
  assert [r["step"] for r in rows if "train/loss" in r] == [2, 4, 6]
  assert json.loads(epath.Path(f"{RUN}/recipe.json").read_text())["planned"]["batch_size"] == 64


# --- Each writer in the bucket ------------------------------------------------------------

def test_checkpoints_in_the_bucket_set_a_damaged_step_aside(bucket, caplog):
  state = {"w": jax.numpy.arange(6.0), "b": jax.numpy.ones(3)}
  ckpt = checkpoint.Checkpointer(f"{RUN}/checkpoints")
  for step in (1, 2):
    ckpt.save(step, jax.tree.map(lambda x, s=step: x * s, state))
  ckpt.close()
  epath.Path(f"{RUN}/checkpoints/2/default").rmtree()  # orbax's item directory gone
  ckpt = checkpoint.Checkpointer(f"{RUN}/checkpoints")
  with caplog.at_level(logging.WARNING):
    restored = ckpt.restore_or(state)
  jax.tree.map(np.testing.assert_array_equal, restored, state)  # step 1 holds `state` x 1
  assert f"its item directory {RUN}/checkpoints/2/default is missing" in caplog.text
  assert ckpt.latest_step() == 1 and epath.Path(f"{RUN}/checkpoints/2.damaged").is_dir()
  ckpt.close()


def test_metrics_in_the_bucket_upload_whole_and_resume(bucket):
  path = epath.Path(f"{RUN}/metrics.jsonl")
  writer = metrics.MetricWriter(RUN, upload_every_seconds=3600)
  writer.write(1, {"train/loss": 1.0})
  assert not path.exists()  # not yet: one upload an hour
  writer.flush()  # as the trainer does after a checkpoint
  assert _rows(path.read_text()) == [{"step": 1, "train/loss": 1.0}]
  writer.write(2, {"train/loss": 0.5, "train/noise": float("nan")})
  writer.write(3, {"train/loss": 0.25})
  writer.close()
  assert [r["step"] for r in _rows(path.read_text())] == [1, 2, 3]

  resumed = metrics.MetricWriter(RUN, start_step=2, upload_every_seconds=0)
  resumed.write(2, {"train/loss": 0.5, "eval/accuracy": 0.75})  # train/loss is there already
  assert _rows(path.read_text()) == [{"step": 1, "train/loss": 1.0},
                                     {"step": 2, "train/loss": 0.5, "train/noise": None},
                                     {"step": 2, "eval/accuracy": 0.75}]
  resumed.close()
  assert any("/tensorboard/events.out.tfevents" in f for f in bucket.files())


def test_the_lock_in_the_bucket_refuses_a_second_run(bucket):
  workdir_lock.check_writable(RUN)
  assert bucket.files() == []  # the write probe is gone
  lock = workdir_lock.acquire(RUN)
  held = json.loads(epath.Path(f"{RUN}/{workdir_lock.LOCK_NAME}").read_text())
  assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
  with pytest.raises(workdir_lock.WorkdirInUseError,
                     match=rf"workdir {RUN} is in use .*delete {RUN}/{workdir_lock.LOCK_NAME}"):
    workdir_lock.acquire(RUN)
  workdir_lock.release(lock)
  assert bucket.files() == []


def test_the_step_clock_keeps_the_wait_for_input_apart(monkeypatch):
  now = [100.0]
  monkeypatch.setattr(metrics.time, "perf_counter", lambda: now[0])
  clock = metrics.StepClock(batch_size=8)
  assert clock.lap() == {}  # the first lap starts the clock
  for _ in range(4):  # each step: 0.5 s of wall time, 0.2 s of it waiting for its batch
    now[0] += 0.5
    clock.count_step(input_seconds=0.2)
  lap = clock.lap()
  assert lap["step_seconds"] == pytest.approx(0.5)
  assert lap["examples_per_second"] == pytest.approx(16.0)
  assert lap["input_seconds"] == pytest.approx(0.2)
  assert lap["input_share"] == pytest.approx(0.4)
