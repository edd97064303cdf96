"""Runs that survive: preemption, SIGKILL, damaged checkpoints, a busy or read-only workdir,
strict metrics, and configuration errors, met the way a user meets them (through the CLI).

The subprocess runs share one JAX compilation cache, so only the first compiles: the
others take a few seconds each.
"""

import asyncio
import gc
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import types

import jax
import numpy as np
import optax
import pytest

import conftest  # tests/conftest.py: the XLA flags of the suite's child processes
import dateopt
from dateopt import date, plots, schedules, train
from dateopt.train import checkpoint, metrics, nonfinite, preemption, recipe_record, workdir_lock

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "tiny_config.py")
STEPS, EVERY = 300, 20
# 20 epochs of the tiny data: the learning rate is not yet 0 at the last step, so resumed and
# uninterrupted runs that agree at the end agreed at every step.
RUN_FLAGS = (f"--config.num_train_steps={STEPS}", f"--config.checkpoint_every_steps={EVERY}",
             "--config.keep_checkpoints=5", "--config.baseline.num_epochs=20")
TIMING_KEYS = ("train/step_seconds", "train/examples_per_second", "train/input_seconds",
               "train/input_share", "run/steps_per_second")
NAN_BATCHES = os.path.join(REPO, "tests", "nan_batch_config.py")  # `:7,8` poisons steps 7, 8


class Cli:
  """`dateopt-train` on the tiny config in a subprocess, one CPU device, a shared cache."""

  def __init__(self, cache_dir):
    self.env = dict(os.environ, JAX_PLATFORMS="cpu",
                    XLA_FLAGS=f"--xla_force_host_platform_device_count=1 {conftest.CHILD_FLAG}",
                    JAX_COMPILATION_CACHE_DIR=str(cache_dir),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")

  def command(self, workdir, *flags, config=TINY):
    return [sys.executable, "-m", "dateopt.cli", "--config", config, "--workdir", str(workdir),
            *RUN_FLAGS, *flags]

  def run(self, workdir, *flags, config=TINY):
    return subprocess.run(self.command(workdir, *flags, config=config), env=self.env,
                          capture_output=True, text=True, timeout=300)

  def start(self, workdir, *flags):
    return subprocess.Popen(self.command(workdir, *flags), env=self.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
  return Cli(tmp_path_factory.mktemp("compilation_cache"))


@pytest.fixture(scope="module")
def reference(cli, tmp_path_factory):
  """An uninterrupted run: (workdir, its wall time in seconds)."""
  workdir = tmp_path_factory.mktemp("uninterrupted")
  start = time.perf_counter()
  done = cli.run(workdir)
  seconds = time.perf_counter() - start
  assert done.returncode == 0, done.stderr[-3000:]
  return workdir, seconds


def _strict_rows(workdir):
  """metrics.jsonl parsed as strict JSON (NaN and Infinity are not JSON)."""
  def refuse(name):
    raise ValueError(f"non-JSON constant {name} in metrics.jsonl")
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line, parse_constant=refuse) for line in f]


def _pairs(rows, skip=()):
  """{(step, key): value} of the rows; fails on a (step, key) written twice."""
  pairs = {}
  for row in rows:
    for key, value in row.items():
      if key != "step" and key not in skip:
        assert (row["step"], key) not in pairs, f"step {row['step']} {key} written twice"
        pairs[row["step"], key] = value
  return pairs


def _assert_same_metrics_as(reference_dir, workdir):
  """Every (step, key) of the uninterrupted run, once, with the same value (timing aside)."""
  expected = _pairs(_strict_rows(reference_dir), skip=TIMING_KEYS)
  got = _pairs(_strict_rows(workdir), skip=TIMING_KEYS)
  assert got == expected


def _final_params(workdir):
  import orbax.checkpoint as ocp
  with ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints")) as manager:
    step = manager.latest_step()
    return step, manager.restore(step, args=ocp.args.StandardRestore())["params"]


def _assert_same_final_params(reference_dir, workdir):
  (step, expected), (resumed_step, got) = _final_params(reference_dir), _final_params(workdir)
  assert step == resumed_step == STEPS
  jax.tree.map(np.testing.assert_array_equal, expected, got)


def _wait_for(condition, proc, timeout=120):
  deadline = time.time() + timeout
  while not condition():
    assert proc.poll() is None, f"the run ended first: {proc.communicate()[1][-3000:]}"
    assert time.time() < deadline, "timed out"
    time.sleep(0.01)


def _logged(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  return os.path.exists(path) and "train/" in open(path, encoding="utf-8").read()


def _complete_checkpoints(workdir):
  directory = os.path.join(workdir, "checkpoints")
  return sorted(int(p) for p in os.listdir(directory) if p.isdigit()) if os.path.isdir(
      directory) else []


def _one_message(stderr):
  lines = [line for line in stderr.splitlines() if line.startswith("dateopt-train:")]
  assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
  return lines[0]


# --- Preemption: SIGTERM, SIGINT, SIGKILL ------------------------------------------------

def test_sigterm_saves_the_step_and_the_rerun_ends_bit_identical(cli, reference, tmp_path):
  proc = cli.start(tmp_path)
  _wait_for(lambda: _logged(tmp_path), proc)
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 143, stderr[-3000:]
  message = _one_message(stderr)
  stopped = re.fullmatch(r"dateopt-train: preempted \(SIGTERM\) at step (\d+); checkpoint saved "
                         r"in (\S+); rerun the same command to resume\.", message)
  assert stopped, message
  step = int(stopped.group(1))
  assert 0 < step < STEPS and _complete_checkpoints(tmp_path)[-1] == step
  assert stopped.group(2) == os.path.join(str(tmp_path), "checkpoints")
  assert not os.path.exists(tmp_path / workdir_lock.LOCK_NAME)  # released on the way out
  _strict_rows(tmp_path)

  resumed = cli.run(tmp_path)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resuming from step {step} " in resumed.stdout
  _assert_same_final_params(reference[0], tmp_path)
  _assert_same_metrics_as(reference[0], tmp_path)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_sigint_and_sighup_stop_the_same_way(cli, tmp_path, signum):
  proc = cli.start(tmp_path)
  _wait_for(lambda: _logged(tmp_path), proc)
  proc.send_signal(signum)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 128 + signum, stderr[-3000:]
  step = int(re.search(rf"preempted \({signal.Signals(signum).name}\) at step (\d+); "
                       r"checkpoint saved", _one_message(stderr)).group(1))
  assert _complete_checkpoints(tmp_path)[-1] == step


def test_a_second_sigterm_waits_for_the_save(cli, tmp_path):
  proc = cli.start(tmp_path)
  _wait_for(lambda: _logged(tmp_path), proc)
  proc.send_signal(signal.SIGTERM)
  time.sleep(0.05)  # a scheduler that repeats itself
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 143, stderr[-3000:]
  lines = [line for line in stderr.splitlines() if line.startswith("dateopt-train:")]
  step = int(re.search(r"preempted \(SIGTERM\) at step (\d+); checkpoint saved",
                       lines[-1]).group(1))
  assert _complete_checkpoints(tmp_path)[-1] == step and "Traceback" not in stderr
  assert all("SIGTERM again: still stopping" in line for line in lines[:-1])


def test_sigkill_resumes_from_the_last_complete_checkpoint(cli, reference, tmp_path):
  proc = cli.start(tmp_path)
  _wait_for(lambda: [s for s in _complete_checkpoints(tmp_path) if s >= 2 * EVERY], proc)
  proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=60)
  last = _complete_checkpoints(tmp_path)[-1]
  assert last < STEPS
  assert os.path.exists(tmp_path / workdir_lock.LOCK_NAME)  # nobody released it

  resumed = cli.run(tmp_path)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resuming from step {last} " in resumed.stdout
  assert "stale lock" in resumed.stderr
  _assert_same_final_params(reference[0], tmp_path)
  _assert_same_metrics_as(reference[0], tmp_path)  # the killed run's later rows are gone


def test_stop_requests_install_and_restore_the_handlers():
  def previous(signum, frame):
    raise AssertionError("the previous handler ran")
  old = signal.signal(signal.SIGTERM, previous)
  try:
    with preemption.StopRequests() as stops:
      assert signal.getsignal(signal.SIGTERM) is not previous
      assert not stops.should_stop(1, shares=True)
      stops.stepping()  # a step taken: a signal now waits for it to be saved
      os.kill(os.getpid(), signal.SIGTERM)
      assert stops.received == signal.SIGTERM and stops.should_stop(2, shares=False)
      os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's repeat: the save goes on
      assert stops.received == signal.SIGTERM
      with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C: stop now
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is previous
  finally:
    signal.signal(signal.SIGTERM, old)


def test_a_signal_before_the_first_step_stops_at_once():
  wakeup = signal.set_wakeup_fd(-1)
  signal.set_wakeup_fd(wakeup)
  with pytest.raises(preemption.Preempted) as stopped:
    with preemption.StopRequests():
      os.kill(os.getpid(), signal.SIGTERM)  # nothing to save yet: the handler raises
      time.sleep(5)
      raise AssertionError("the signal did not stop the run")
  assert stopped.value.step is None and stopped.value.exit_code == 143
  assert str(stopped.value) == ("stopped (SIGTERM) before the first step: nothing to save; the "
                                "same command starts (or resumes) the run again.")
  assert signal.set_wakeup_fd(wakeup) == wakeup  # the previous wakeup fd is back


def test_a_stop_swallowed_by_a_callback_is_not_reported_as_an_error(monkeypatch):
  """A signal that lands in a callback Python cannot unwind (JAX's gc hook, once in CI):
  Python hands the `Preempted` to sys.unraisablehook, and the watcher ends the run."""
  def unraisable(exc):
    return types.SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=None,
                                 err_msg="Exception ignored in", object=None)
  reported = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))
  before = sys.unraisablehook
  with preemption.StopRequests():
    sys.unraisablehook(unraisable(preemption.Preempted(signal.SIGTERM, None, None)))
    assert reported == []
    sys.unraisablehook(unraisable(ValueError("not a stop")))
    assert [str(e) for e in reported] == ["not a stop"]
  assert sys.unraisablehook is before


_STUCK_BEFORE_THE_FIRST_STEP = """
import signal, sys, time
from dateopt.train import preemption
with preemption.StopRequests() as stops:
  stops.on_exit_now.append(lambda: open(sys.argv[1], "w").close())
  # The main thread as inside a compilation: its Python handler cannot run.
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
  print("ready", flush=True)
  time.sleep(120)
"""


def _wait_until_asleep_in_the_kernel(pid: int, deadline_seconds: float = 60.0) -> None:
  """Until the process's main thread sleeps inside `clock_nanosleep`, where no Python runs.

  Between its "ready" and the sleep the main thread still runs bytecode, and a signal
  that lands there is answered by the Python handler, not by the watcher this test is
  about (on a loaded machine that window is wide). The kernel's wait channel says where
  the thread waits; where /proc does not show it, the state "S" after "ready" is the
  closest sign.
  """
  deadline = time.monotonic() + deadline_seconds
  while time.monotonic() < deadline:
    with open(f"/proc/{pid}/wchan", encoding="ascii") as f:
      channel = f.read()
    if "nanosleep" in channel:
      return
    if channel.strip() in ("", "0"):  # hidden by the kernel's settings
      with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        if f.read().rpartition(")")[2].split()[0] == "S":
          time.sleep(0.5)
          return
    time.sleep(0.01)
  raise AssertionError(f"process {pid} never slept in the kernel")


def test_a_signal_during_a_long_compile_ends_the_process_within_seconds(tmp_path):
  cleaned = tmp_path / "cleaned"
  proc = subprocess.Popen([sys.executable, "-c", _STUCK_BEFORE_THE_FIRST_STEP, str(cleaned)],
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  assert proc.stdout.readline() == "ready\n"
  _wait_until_asleep_in_the_kernel(proc.pid)
  start = time.monotonic()
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 143 and time.monotonic() - start < preemption.ANSWER_SECONDS + 10
  assert _one_message(stderr) == ("dateopt-train: stopped (SIGTERM) before the first step: "
                                  "nothing to save; the same command starts (or resumes) the "
                                  "run again.")
  assert cleaned.exists()  # the lock's release ran first


def test_sigterm_before_the_first_step_exits_at_once_with_nothing_saved(tmp_path):
  fresh = Cli(tmp_path / "empty_cache")  # a real compile, not the shared cache's
  proc = fresh.start(tmp_path / "run")
  while "DATE plan" not in proc.stdout.readline():  # planned: the compiles come next
    assert proc.poll() is None, proc.stderr.read()[-3000:]
  start = time.monotonic()
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 143, stderr[-3000:]
  assert time.monotonic() - start < preemption.ANSWER_SECONDS + 10
  assert "before the first step: nothing to save" in _one_message(stderr)
  assert _complete_checkpoints(tmp_path / "run") == []
  assert not os.path.exists(tmp_path / "run" / workdir_lock.LOCK_NAME)


def test_a_stop_before_the_first_step_survives_code_that_swallows_every_exception():
  """JAX's persistent compilation cache answers any `Exception` of its write after a
  compile with a warning and goes on: a SIGTERM whose handler ran there was lost, and the
  run went on to take and save its first step (36 s on a loaded machine)."""
  with preemption.StopRequests():
    with pytest.raises(preemption.Preempted) as stopped:
      try:  # as jax._src.compiler._cache_write does
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10**6):  # bytecode: the handler runs here, in the main thread
          pass
      except Exception:  # pylint: disable=broad-except
        pass
    assert stopped.value.step is None and stopped.value.exit_code == 143
    assert not isinstance(stopped.value, Exception)


def test_a_stop_swallowed_before_the_first_step_stops_the_run_at_its_first_step():
  with preemption.StopRequests() as stops:
    try:
      os.kill(os.getpid(), signal.SIGTERM)
      for _ in range(10**6):
        pass
    except BaseException:  # pylint: disable=broad-except  # the worst a library can do
      pass
    with pytest.raises(preemption.Preempted) as stopped:
      stops.stepping()  # the first step's compile returned: nothing saved, stop now
    assert stopped.value.step is None and str(stopped.value).startswith(
        "stopped (SIGTERM) before the first step: nothing to save")


def test_preempted_says_where_and_what_next():
  stop = preemption.Preempted(signal.SIGINT, 57, None)
  assert stop.exit_code == 130
  assert str(stop) == ("preempted (SIGINT) at step 57; checkpointing is off "
                       "(config.checkpoint_every_steps=-1), so a rerun starts over.")


# --- Damaged checkpoints ------------------------------------------------------------------

def _truncate_the_array_files(step_dir):
  """A copy cut short: every data file of the item's OCDBT databases loses its second half."""
  item = os.path.join(step_dir, "default")
  for data in (os.path.join(item, "d"), os.path.join(item, "ocdbt.process_0", "d")):
    for name in os.listdir(data):
      path = os.path.join(data, name)
      with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _delete_the_manifest(step_dir):
  os.remove(os.path.join(step_dir, "default", "manifest.ocdbt"))


def _empty_the_metadata(step_dir):
  with open(os.path.join(step_dir, "default", "_METADATA"), "w", encoding="utf-8"):
    pass


def _delete_the_item_directory(step_dir):
  shutil.rmtree(os.path.join(step_dir, "default"))


DAMAGE = [_truncate_the_array_files, _delete_the_manifest, _empty_the_metadata,
          _delete_the_item_directory]


def test_damaged_checkpoints_are_reported_skipped_and_kept(cli, reference, tmp_path):
  """Each kind of damage on one of the four newest checkpoints: the run resumes from the fifth."""
  shutil.copytree(reference[0], tmp_path, dirs_exist_ok=True)
  directory = tmp_path / "checkpoints"
  steps = _complete_checkpoints(tmp_path)
  assert steps == list(range(STEPS - 4 * EVERY, STEPS + 1, EVERY))
  for damage, step in zip(DAMAGE, reversed(steps)):
    damage(str(directory / str(step)))

  resumed = cli.run(tmp_path)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resuming from step {steps[0]} " in resumed.stdout
  assert "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
  for step in steps[1:]:
    assert re.search(rf"checkpoint of step {step} in \S+ does not load \(.+\)", resumed.stderr)
    assert (directory / f"{step}.damaged").is_dir()  # kept, out of the way of the new saves
  _assert_same_final_params(reference[0], tmp_path)
  _assert_same_metrics_as(reference[0], tmp_path)


@pytest.fixture
def two_checkpoints(tmp_path):
  state = {"w": jax.numpy.arange(600.0).reshape(6, 100), "b": jax.numpy.ones(3)}
  ckpt = checkpoint.Checkpointer(str(tmp_path / "checkpoints"), keep=3)
  for step in (1, 2):
    ckpt.save(step, jax.tree.map(lambda x, s=step: x * s, state))
  ckpt.close()
  return str(tmp_path / "checkpoints"), state


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__.strip("_"))
def test_restore_or_falls_back_to_the_older_checkpoint(two_checkpoints, damage, caplog):
  directory, state = two_checkpoints
  damage(os.path.join(directory, "2"))
  ckpt = checkpoint.Checkpointer(directory)
  with caplog.at_level(logging.WARNING):
    restored = ckpt.restore_or(state)
  jax.tree.map(np.testing.assert_array_equal, restored, state)  # step 1 holds `state` x 1
  assert re.search(r"checkpoint of step 2 in \S+ does not load \(.+\)", caplog.text)
  assert ckpt.latest_step() == 1 and os.path.isdir(os.path.join(directory, "2.damaged"))
  ckpt.save(2, state)  # the damaged step is out of the way
  ckpt.close()


def test_restore_or_refuses_when_no_checkpoint_loads(two_checkpoints):
  directory, state = two_checkpoints
  ckpt = checkpoint.Checkpointer(directory)
  other_shape = {"w": jax.numpy.zeros((2, 2)), "b": jax.numpy.ones(3)}  # a changed config
  with pytest.raises(checkpoint.NoUsableCheckpointError, match="step 2: .*step 1: "):
    ckpt.restore_or(other_shape)
  assert sorted(os.listdir(directory)) == ["1", "2"]  # nothing renamed
  ckpt.close()


# --- The workdir: busy, stale lock, read-only ---------------------------------------------

def test_a_second_run_on_a_busy_workdir_is_refused(cli, tmp_path):
  first = cli.start(tmp_path, "--config.num_train_steps=-1", "--config.baseline.num_epochs=50000",
                    "--config.checkpoint_every_steps=-1")
  try:
    _wait_for(lambda: os.path.exists(tmp_path / workdir_lock.LOCK_NAME), first)
    _wait_for(lambda: _logged(tmp_path), first)  # stepping: the SIGTERM below stops after a step
    second = cli.run(tmp_path)
    assert second.returncode == 2
    message = _one_message(second.stderr)
    assert message.startswith(f"dateopt-train: error: workdir {tmp_path} is in use")
    assert f"PID {first.pid} on {socket.gethostname()}" in message
  finally:
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=120)
  assert first.returncode == 143 and "checkpointing is off" in _one_message(stderr)
  assert not os.path.exists(tmp_path / workdir_lock.LOCK_NAME)


def _dead_pid():
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def test_a_stale_lock_is_cleared_with_a_warning(tmp_path, caplog):
  stale = {"pid": _dead_pid(), "host": socket.gethostname(), "token": "old", "since": "then"}
  (tmp_path / workdir_lock.LOCK_NAME).write_text(json.dumps(stale))
  with caplog.at_level(logging.WARNING):
    lock = workdir_lock.acquire(str(tmp_path))
  assert f"PID {stale['pid']}" in caplog.text and "stale lock" in caplog.text
  assert json.loads((tmp_path / workdir_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
  workdir_lock.release(lock)
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("host", ["here", "elsewhere"])
def test_a_live_or_remote_lock_is_refused(tmp_path, host):
  held = {"pid": os.getpid(), "host": socket.gethostname() if host == "here" else "elsewhere",
          "token": "theirs", "since": "then"}
  (tmp_path / workdir_lock.LOCK_NAME).write_text(json.dumps(held))
  with pytest.raises(workdir_lock.WorkdirInUseError,
                     match=rf"workdir {tmp_path} is in use .*PID {os.getpid()} on {held['host']}"):
    workdir_lock.acquire(str(tmp_path))
  assert json.loads((tmp_path / workdir_lock.LOCK_NAME).read_text()) == held


def test_an_unwritable_workdir_fails_at_start_in_one_line(cli, tmp_path):
  workdir = tmp_path / "read_only"
  workdir.mkdir()
  os.chmod(workdir, 0o500)
  if os.access(workdir, os.W_OK):  # root writes anyway: a path under a file never can be made
    (tmp_path / "a_file").write_text("")
    workdir = tmp_path / "a_file" / "run"
  try:
    done = cli.run(workdir)
  finally:
    os.chmod(tmp_path / "read_only", 0o700)
  assert done.returncode == 2
  assert _one_message(done.stderr).startswith(
      f"dateopt-train: error: cannot write in the workdir {workdir}: ")


@pytest.mark.parametrize("limit, where", [(8_000, "the TensorBoard events in"),
                                          (20_000, "a checkpoint save in")])
def test_a_full_disk_is_one_line_and_never_a_hang(cli, tmp_path, limit, where):
  """A file-size limit stands in for a full disk or quota: tensorboardX's writer thread dies
  on it (its bounded queue then blocks the run for good), and orbax's save fails."""
  command = cli.command(tmp_path, "--config.num_train_steps=30",
                        "--config.checkpoint_every_steps=10", "--config.log_every_steps=1")
  # The limit is set in a small launcher that then becomes the run (a preexec_fn would fork
  # this multithreaded test process). SIGXFSZ ignored: else the kernel kills the writer.
  launcher = ("import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
              "os.execv(sys.argv[1], sys.argv[1:])")
  done = subprocess.run([sys.executable, "-c", launcher, *command],
                        env={k: v for k, v in cli.env.items()  # no compilation cache: it
                             if not k.startswith("JAX_PERSISTENT") and  # would hit the limit
                             k != "JAX_COMPILATION_CACHE_DIR"},
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 1, done.stderr[-3000:]
  message = _one_message(done.stderr)
  assert message.startswith(f"dateopt-train: stopped: {where} {tmp_path}"), message
  assert message.endswith("Free space, then rerun the same command to resume.")
  assert done.stderr.strip() == message  # nothing else: no traceback from any thread



@pytest.fixture
def small_disk(tmp_path):
  """`small_disk(kib)`: a new directory with a tmpfs of `kib` KiB mounted on it, a disk that
  really fills up; unmounted when the test ends. Skips where it cannot be mounted (not root,
  or `mount` refused)."""
  mounted = []

  def mount(kib):
    directory = tmp_path / f"disk_{kib}k"
    directory.mkdir()
    if os.geteuid() != 0:
      pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs",
                           str(directory)], capture_output=True, text=True)
    if done.returncode:
      pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip() or done.returncode}")
    mounted.append(directory)
    return directory

  yield mount
  for directory in mounted:
    subprocess.run(["umount", "-l", str(directory)], capture_output=True)


@pytest.mark.parametrize("kib", [128, 192, 256])
def test_a_really_full_disk_during_a_checkpoint_save_is_one_line(cli, small_disk, kib):
  """A tmpfs that holds the recipe, the metrics and at most one checkpoint: a save fails for
  want of space (tensorstore says so as a ValueError, RESOURCE_EXHAUSTED; orbax's own files
  as an OSError), while orbax's threads log and print their tracebacks of it. Skipped where
  a tmpfs cannot be mounted (not root, or mount refused)."""
  workdir = small_disk(kib) / "run"
  done = subprocess.run(cli.command(workdir, "--config.num_train_steps=30",
                                    "--config.checkpoint_every_steps=10"),
                        env=cli.env, capture_output=True, text=True, timeout=120)
  assert "DATE plan" in done.stdout, done.stderr[-3000:]  # the run had started
  assert done.returncode == 1, done.stderr[-3000:]
  message = _one_message(done.stderr)
  assert done.stderr.strip() == message  # nothing else: no traceback from any thread
  assert message.startswith(f"dateopt-train: stopped: a checkpoint save in {workdir}/checkpoints "
                            "failed: No space left on device"), message
  assert message.endswith("Free space, then rerun the same command to resume."), message


_RAISES_IN_THE_RUN = ("import sys\n"
                      "from absl import app\n"
                      "from dateopt import cli, train\n"
                      "def fail(config, workdir):\n"
                      "  raise {error}\n"
                      "train.train_and_evaluate = fail\n"
                      "app.run(cli.main, flags_parser=cli.parse_flags)\n")


@pytest.mark.parametrize("error, expected", [
    ("OSError(5, 'Input/output error', workdir + '/metrics.jsonl')",
     "dateopt-train: stopped: Input/output error: {workdir}/metrics.jsonl; the checkpoints "
     "saved before it are kept. Fix what stopped it, then rerun the same command to resume."),
    ("PermissionError(13, 'Permission denied', workdir + '/checkpoints')",
     "dateopt-train: stopped: Permission denied: {workdir}/checkpoints; the checkpoints saved "
     "before it are kept. Fix what stopped it, then rerun the same command to resume."),
    ("OSError(122, 'Disk quota exceeded', workdir + '/metrics.jsonl')",
     "dateopt-train: stopped: Disk quota exceeded: {workdir}/metrics.jsonl; the checkpoints "
     "saved before it are kept. Free space, then rerun the same command to resume."),
    ("ValueError('RESOURCE_EXHAUSTED: Failed writing: \"' + workdir + '/a\": Failed to write "
     "5775 bytes to file 13: No space left on device [os_error_code=\\'28\\']')",
     "dateopt-train: stopped: No space left on device: {workdir}/a; the checkpoints saved "
     "before it are kept. Free space, then rerun the same command to resume."),
], ids=["EIO", "EACCES", "EDQUOT", "tensorstore ENOSPC"])
def test_a_failed_write_is_one_line_with_advice_that_fits(cli, tmp_path, error, expected):
  """Only a full disk or quota is told to free space; any other failed write names its file."""
  workdir = str(tmp_path / "run")
  script = _RAISES_IN_THE_RUN.format(error=error.replace("workdir", "sys.argv[4]"))
  done = subprocess.run([sys.executable, "-c", script, "--config", TINY, "--workdir", workdir],
                        env=cli.env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 1, done.stderr[-3000:]
  assert done.stderr.strip() == expected.format(workdir=workdir)


def test_a_device_out_of_memory_is_not_told_to_free_disk_space(cli, tmp_path):
  """XLA's out-of-memory error is RESOURCE_EXHAUSTED too, with no disk in it."""
  script = _RAISES_IN_THE_RUN.format(
      error="RuntimeError('RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.0G.')")
  done = subprocess.run([sys.executable, "-c", script, "--config", TINY, "--workdir",
                         str(tmp_path / "run")], env=cli.env, capture_output=True, text=True,
                        timeout=120)
  assert done.returncode != 0
  assert "Out of memory" in done.stderr and "Free space" not in done.stderr

# --- Configuration errors -----------------------------------------------------------------

def test_a_bad_config_value_is_one_line_with_status_2(cli, tmp_path):
  done = cli.run(tmp_path, "--config.keep_checkpoints=0")
  assert done.returncode == 2
  assert _one_message(done.stderr).startswith(
      "dateopt-train: error: config.keep_checkpoints must be an int >= 1")
  assert not os.path.exists(tmp_path / "checkpoints")


def test_keep_checkpoints_must_keep_one(tiny):
  config = tiny(keep_checkpoints=-1)
  with pytest.raises(ValueError, match="config.keep_checkpoints"):
    train.build_experiment(config)


def test_help_shows_the_flags_and_a_missing_config_file_is_one_line(cli, tmp_path):
  shown = subprocess.run([sys.executable, "-m", "dateopt.cli", "--help"], env=cli.env,
                         capture_output=True, text=True, timeout=300)
  for flag in ("--config:", "--workdir:", "--config.batch_size=", "--config.strategy=adaptive"):
    assert flag in shown.stdout + shown.stderr, flag
  done = cli.run(tmp_path, config=str(tmp_path / "no_such_config.py"))
  assert done.returncode == 2
  message = _one_message(done.stderr)
  assert "no_such_config.py' is neither a file nor a packaged config" in message


def test_a_config_file_whose_get_config_returns_a_dict_is_one_line(cli, tmp_path):
  config_file = tmp_path / "dict_config.py"
  config_file.write_text("def get_config():\n  return {'seed': 0}\n")
  done = subprocess.run([sys.executable, "-m", "dateopt.cli", "--config", str(config_file),
                         "--workdir", str(tmp_path / "run")], env=cli.env, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 2
  assert "the config must be an ml_collections.ConfigDict" in _one_message(done.stderr)


@pytest.mark.parametrize("make, message", [
    (lambda: date.Recipe(batch_size=32, num_examples=1000, num_epochs=2, learning_rate=0.1,
                         warmup_epochs=0.5, init_value=250.0),
     r"init_value must be in \[0, 0.1\], got 250"),
    (lambda: date.Recipe(batch_size=4096, num_examples=1000, num_epochs=2, learning_rate=0.1),
     r"batch_size=4096 is larger than the data set \(num_examples=1000\)"),
    (lambda: schedules.warmup_polynomial_decay(float("nan"), 10, 100),
     r"peak_value must be in \[0, inf\), got nan"),
    (lambda: date.track_statistics(optax.sgd(0.1), trust_coefficient=-1.0),
     r"trust_coefficient must be in \(0, inf\), got -1"),
], ids=["init_value above the peak", "batch above the data", "peak nan", "trust coefficient"])
def test_out_of_range_values_name_their_field(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_an_unusable_data_dir_is_named(tiny):
  config = tiny(data_dir="/proc/no_such_dir")
  with pytest.raises(FileNotFoundError, match=r"data_dir='/proc/no_such_dir' of dataset"):
    train.build_experiment(config)


def test_unfinished_saves_of_a_killed_run_are_removed_with_a_note(tmp_path, caplog):
  directory = tmp_path / "checkpoints"
  (directory / "20.orbax-checkpoint-tmp-1732").mkdir(parents=True)
  (directory / "20.orbax-checkpoint-tmp-1732" / "blob").write_bytes(b"x" * 100)
  (directory / "10").mkdir()
  with caplog.at_level(logging.WARNING):
    ckpt = checkpoint.Checkpointer(str(directory), keep=3)
  ckpt.close()
  assert sorted(os.listdir(directory)) == ["10"]
  assert "removed 1 unfinished checkpoint save(s)" in caplog.text
  assert "20.orbax-checkpoint-tmp-1732" in caplog.text


# --- Command-line overrides of every field --------------------------------------------------

def _parsed_config(*overrides):
  """The config `dateopt-train`'s own flag parsing makes of the tiny config and `overrides`."""
  script = ("import sys; from dateopt import cli; cli.parse_flags(sys.argv); "
            "print(cli.FLAGS.config.to_json())")
  done = subprocess.run([sys.executable, "-c", script, "--config", TINY, "--workdir", "unused",
                         *overrides], capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.splitlines()[-1])


def test_fields_that_default_to_none_or_to_an_empty_dict_take_overrides():
  config = _parsed_config("--config.data_dir=/x", "--config.eval_batch_size=256",
                          "--config.batch_size=512", "--config.plan.gain_rule=sqrt",
                          "--config.guard_kwargs.spike_threshold=30",
                          "--config.baseline.momentum=0.8")
  assert (config["data_dir"], config["eval_batch_size"], config["batch_size"]) == ("/x", 256, 512)
  assert config["plan"] == {"gain_rule": "sqrt"}
  assert config["guard_kwargs"] == {"spike_threshold": 30}
  assert config["baseline"]["momentum"] == 0.8 and config["baseline"]["batch_size"] == 16
  assert _parsed_config("--config.batch_size=None")["batch_size"] is None


# Each kind of refusal the command line can meet, in a process of its own: absl's parsing of
# a flag, a key or a value, and the startup's checks of the config and the workdir.
@pytest.mark.parametrize("override, message", [
    ("--config.batch_size=abc",
     "config.batch_size must be a positive int or None; got 'abc' of type str."),
    ("--config.batchsize=512", "unknown config key 'config.batchsize'; allowed keys: "),
    ("--config.seed=abc", "flag --config.seed=abc: invalid literal for int() with base 10: 'abc'"),
    ("--config..batch_size=5", "ValueError: Could not parse '.batch_size'"),
    ("--workdir=s3://bucket/run", "workdir s3://bucket/run: s3:// is not supported"),
], ids=lambda v: v.split("=")[0] if v.startswith("--") else None)
def test_a_bad_override_is_one_line_naming_the_field_with_status_2(cli, tmp_path, override,
                                                                   message):
  done = cli.run(tmp_path, override)
  assert done.returncode == 2, done.stderr[-3000:]
  assert _one_message(done.stderr).startswith(f"dateopt-train: error: {message}")
  assert not os.path.exists(tmp_path / "checkpoints")


# The startup's other refusals: the same `StartupError` that the command line prints as one
# line with status 2 (above), raised here in-process before anything compiles or is written.
@pytest.mark.parametrize("fields, message", [
    (dict(eval_batch_size=0), "config.eval_batch_size must be a positive int or None; got 0."),
    (dict(guard_kwargs={"spike_factor": 3}),
     "config.guard_kwargs: divergence_guard() got an unexpected keyword argument 'spike_factor'"),
    (dict(guard_kwargs={"spike_threshold": "2"}),
     "config.guard_kwargs: spike_threshold must be a number; got '2' of type str."),
    (dict(plan={"gain_rule": "cubic"}), "gain_rule must be one of 'linear', 'sqrt'; got 'cubic'."),
    (dict(seed=-1), "config.seed must be an int >= 0; got -1."),
    (dict(checkpoint_every_steps=-5), "config.checkpoint_every_steps must be -1 (never), "
     "0 (only at the end (and when stopped)) or an int >= 1; got -5."),
    (dict(eval_every_steps=-2), "config.eval_every_steps must be -1 (once per epoch), "
     "0 (only at the end) or an int >= 1; got -2."),
    (dict(num_train_steps=0), "config.num_train_steps must be -1 (the recipe's length) or "
     "an int >= 1; got 0."),
    (dict(num_train_steps=100000), "config.num_train_steps=100000 is past the end of the "
     "recipe ("),
], ids=lambda v: ",".join(v) if isinstance(v, dict) else None)
def test_a_bad_config_value_is_refused_at_startup_naming_the_field(tiny, tmp_path, fields,
                                                                   message):
  with pytest.raises(train.StartupError) as refused:
    train.train_and_evaluate(tiny(**fields), str(tmp_path / "run"))
  assert str(refused.value).startswith(message), str(refused.value)
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_an_empty_workdir_is_refused_at_startup(tiny):
  with pytest.raises(train.StartupError, match=r"^the workdir is empty \(an unset \$WORKDIR\?\)"):
    train.train_and_evaluate(tiny(), "")


# --- A changed recipe on resume -------------------------------------------------------------

def test_a_resume_with_a_changed_recipe_is_refused_naming_the_fields(cli, reference, tmp_path):
  shutil.copytree(reference[0], tmp_path, dirs_exist_ok=True)
  stored = (tmp_path / "recipe.json").read_text()
  done = cli.run(tmp_path, "--config.batch_size=32")
  assert done.returncode == 2
  message = _one_message(done.stderr)
  assert message.startswith(f"dateopt-train: error: the workdir {tmp_path} holds a run planned "
                            "with another recipe")
  assert "this config changes batch_size: 64 → 32; learning_rate: 0.006 → 0.00424264" in message
  assert "Use a new --workdir for the new recipe, or the old config to resume this run" in message
  assert (tmp_path / "recipe.json").read_text() == stored  # the run's record is kept
  assert not os.path.exists(tmp_path / workdir_lock.LOCK_NAME)


def test_a_rerun_of_a_finished_adaptive_run_exits_0_with_its_final_metrics(cli, tmp_path):
  """An adaptive run ends when its progress covers the baseline's steps, before
  num_train_steps: its rerun took one more step, then failed to save it over the final
  checkpoint (orbax's StepAlreadyExistsError, status 1), a grown run after a row of nulls.
  A growing run: the fixed batch's end is the same check, without the rungs."""
  flags = ("--config.strategy=adaptive", "--config.plan.grow_batch=True",
           "--config.num_train_steps=-1", "--config.checkpoint_every_steps=20",
           "--config.baseline.num_epochs=6")  # 120 steps: it grows, and ends by its progress
  first = cli.run(tmp_path, *flags)
  assert first.returncode == 0, first.stderr[-3000:]
  written = {path: path.read_bytes() for path in sorted(tmp_path.rglob("*")) if path.is_file()}
  again = cli.run(tmp_path, *flags)
  assert again.returncode == 0, again.stderr[-3000:]
  def final(done):  # the rerun times no step
    line, = [line for line in done.stdout.splitlines() if line.startswith("final: ")]
    return {k: v for k, v in json.loads(line[len("final: "):]).items()
            if k != "steps_per_second"}
  assert final(again) == final(first) and final(first)["steps"] > 0
  for path, data in written.items():
    if "tensorboard" not in path.parts:  # a new events file opens, with no scalar in it
      assert path.read_bytes() == data, path
  assert sorted(p for p in tmp_path.rglob("*") if "tensorboard" not in p.parts
                and p.is_file()) == [p for p in written if "tensorboard" not in p.parts]


def test_a_rerun_that_would_start_over_on_a_finished_run_is_refused(cli, reference, tmp_path):
  shutil.copytree(reference[0], tmp_path, dirs_exist_ok=True)
  metrics_before = (tmp_path / "metrics.jsonl").read_text()
  final_before = (tmp_path / "final_metrics.json").read_text()
  done = cli.run(tmp_path, "--config.num_train_steps=5", "--config.checkpoint_every_steps=-1")
  assert done.returncode == 2
  message = _one_message(done.stderr)
  assert f"the workdir {tmp_path} holds an earlier run (metrics up to step {STEPS})" in message
  assert "Use a new --workdir, or --config.overwrite=True" in message
  assert (tmp_path / "metrics.jsonl").read_text() == metrics_before  # nothing lost
  assert (tmp_path / "final_metrics.json").read_text() == final_before
  shutil.rmtree(tmp_path / "checkpoints")  # a finished run whose checkpoints are gone
  done = cli.run(tmp_path, "--config.num_train_steps=5")
  assert done.returncode == 2 and "its checkpoints are gone" in _one_message(done.stderr)
  done = cli.run(tmp_path, "--config.num_train_steps=5", "--config.checkpoint_every_steps=-1",
                 "--config.overwrite=True")  # said explicitly: the run is replaced
  assert done.returncode == 0, done.stderr[-3000:]
  assert max(row["step"] for row in _strict_rows(tmp_path)) == 5


@pytest.mark.parametrize("flag, change", [
    ("--config.seed=7", "config.seed: 0 → 7"),
    ("--config.guard=False", "config.guard: true → false"),
    ("--config.model_kwargs.hidden_size=8", 'config.model_kwargs: {"hidden_size": 16} → '
                                            '{"hidden_size": 8}'),
])
def test_a_resume_that_changes_the_seed_model_or_guard_names_the_field(cli, reference, tmp_path,
                                                                        flag, change):
  shutil.copytree(reference[0], tmp_path, dirs_exist_ok=True)
  done = cli.run(tmp_path, flag)
  assert done.returncode == 2
  assert f"this config changes {change}." in _one_message(done.stderr)  # before any restore
  assert "Event loop is closed" not in done.stderr


def test_an_unreadable_record_is_refused(cli, reference, tmp_path):
  shutil.copytree(reference[0], tmp_path, dirs_exist_ok=True)
  (tmp_path / "recipe.json").write_text('{"planned": {"batch_size": 6')  # damaged
  done = cli.run(tmp_path)
  assert done.returncode == 2
  message = _one_message(done.stderr)
  assert "holds checkpoints, but" in message and "it cannot be read" in message


def test_a_changed_recipe_is_only_refused_when_there_is_a_checkpoint_to_resume(tmp_path):
  old = date.Recipe(batch_size=64, num_examples=1000, num_epochs=2, learning_rate=0.1)
  new = date.Recipe(batch_size=32, num_examples=1000, num_epochs=2, learning_rate=0.1)
  (tmp_path / "recipe.json").write_text(json.dumps({"planned": recipe_record.as_stored(old)}))
  recipe_record.check_unchanged(str(tmp_path), new)  # stopped before its first save: a new run
  (tmp_path / "checkpoints" / "10").mkdir(parents=True)
  with pytest.raises(recipe_record.RecipeChangedError, match="batch_size: 64 → 32"):
    recipe_record.check_unchanged(str(tmp_path), new)


def test_a_grown_run_recorded_before_the_noise_credit_resumes_only_with_the_credit_off(tmp_path):
  """A recipe.json from before `Recipe.engine` holds `step_price` as a field of its own, and
  one without `noise_batch_exponent` ran with 0: the new default 0.2 would change a grown run
  halfway, so its resume is refused; runs that do not read it resume."""
  base = date.Recipe(batch_size=32, num_examples=8000, num_epochs=2, learning_rate=1e-3,
                     optimizer="adam")
  grown, fixed = (date.plan(base, 256, "adaptive", grow_batch=grow) for grow in (True, False))
  (tmp_path / "checkpoints" / "10").mkdir(parents=True)
  for recipe in (grown, fixed, base):
    stored = recipe_record.as_stored(recipe)
    stored["step_price"] = stored.pop("engine")["step_price"]  # written before the field existed
    (tmp_path / "recipe.json").write_text(json.dumps({"planned": stored}))
    if recipe is grown:
      with pytest.raises(recipe_record.RecipeChangedError, match='"noise_batch_exponent": 0.0'):
        recipe_record.check_unchanged(str(tmp_path), recipe)
      recipe_record.check_unchanged(str(tmp_path),
                                    recipe.replace(engine={"noise_batch_exponent": 0.0}))
      with pytest.raises(recipe_record.RecipeChangedError, match='"step_price": 2.0'):
        recipe_record.check_unchanged(str(tmp_path), recipe.replace(
            engine={"noise_batch_exponent": 0.0, "step_price": 2.0}))
    else:
      recipe_record.check_unchanged(str(tmp_path), recipe)


def test_recipe_changes_skip_the_rationale_and_fields_the_old_file_lacks():
  stored = {"batch_size": 64, "learning_rate": 0.1, "rationale": {"batch_size": "old words"}}
  planned = {"batch_size": 64, "learning_rate": 0.2, "rationale": {}, "gain_rule": "linear"}
  assert recipe_record.recipe_changes(stored, planned) == ["learning_rate: 0.1 → 0.2"]


# --- Bad arguments to the optimizers and masks ------------------------------------------------

@pytest.mark.parametrize("build, error, message", [
    (lambda: dateopt.lars(0.1, trust_coefficient=None), TypeError,
     "trust_coefficient must be a number (or a schedule); got None of type NoneType."),
    (lambda: dateopt.lars(0.1, momentum=None), TypeError, "momentum must be a number"),
    (lambda: dateopt.lamb(1e-3, weight_decay=None), TypeError, "weight_decay must be a number"),
    (lambda: dateopt.lars("0.1"), TypeError,
     "learning_rate must be a number (or a schedule); got '0.1' of type str."),
    (lambda: date.divergence_guard(dateopt.lars(0.1), spike_threshold="2"), TypeError,
     "spike_threshold must be a number; got '2' of type str."),
    (lambda: date.divergence_guard(dateopt.lars(0.1), spike_factor="2"), TypeError,
     "divergence_guard() got an unexpected keyword argument 'spike_factor'"),
    (lambda: date.divergence_guard(dateopt.lars(0.1), backoff=2.0), ValueError,
     "backoff must be in (0, 1), got 2.0."),
])
def test_bad_optimizer_arguments_are_refused_naming_the_argument(build, error, message):
  with pytest.raises(error) as raised:
    build()
  assert str(raised.value).startswith(message)


def _params():
  return {"Dense_0": {"kernel": np.ones((3, 2), np.float32), "bias": np.zeros(2, np.float32)}}


def kernels_as_floats(params):
  return jax.tree.map(lambda p: float(p.ndim > 1), params)  # 1.0 / 0.0, not True / False


@pytest.mark.parametrize("make", [dateopt.lars, dateopt.lamb], ids=["lars", "lamb"])
def test_a_mask_callable_returning_floats_is_refused_naming_the_parameter(make):
  with pytest.raises(TypeError) as raised:
    make(0.1, mask=kernels_as_floats).init(_params())
  assert str(raised.value) == (
      "mask kernels_as_floats returned 0.0 of type float for the parameter 'Dense_0/bias'; a "
      "mask must give a Python bool for every parameter (True: apply the transform).")


def test_a_mask_pytree_with_non_bool_leaves_is_refused_naming_the_parameter():
  with pytest.raises(TypeError, match=r"^the mask pytree holds 1 of type int for the parameter "
                                      r"'Dense_0/kernel'"):
    dateopt.lars(0.1, mask={"Dense_0": {"kernel": 1, "bias": False}}).init(_params())


# --- Non-finite batches ---------------------------------------------------------------------

def _train_rows(workdir):
  return {row["step"]: row for row in _strict_rows(workdir) if "train/loss" in row}


def test_a_nan_batch_without_the_guard_stops_the_run_naming_the_step(cli, tmp_path):
  done = cli.run(tmp_path, "--config.guard=False", "--config.checkpoint_every_steps=5",
                 config=f"{NAN_BATCHES}:7")
  assert done.returncode == 1, done.stderr[-3000:]
  assert _one_message(done.stderr).startswith(
      "dateopt-train: stopped: the training loss was nan at step 7 (a NaN or inf in its batch, "
      "or a diverged step), and without the divergence guard (config.guard=False) its update "
      "makes the parameters non-finite. The checkpoints saved so far predate it.")
  assert _complete_checkpoints(tmp_path) == [5]  # step 10 was not saved: its params are NaN
  assert not os.path.exists(tmp_path / workdir_lock.LOCK_NAME)


def test_the_guard_skips_nan_batches_and_says_which(cli, tmp_path):
  done = cli.run(tmp_path, "--config.num_train_steps=30", config=f"{NAN_BATCHES}:7,8")
  assert done.returncode == 0, done.stderr[-3000:]
  assert ("the divergence guard skipped steps 7-8: non-finite loss (2 skipped so far; "
          "guard/num_nonfinite in the metrics).") in done.stderr
  rows = _train_rows(tmp_path)
  assert rows[10]["train/guard/num_nonfinite"] == 2 and rows[30]["train/guard/num_nonfinite"] == 2
  step, params = _final_params(tmp_path)
  assert step == 30 and all(np.isfinite(p).all() for p in jax.tree.leaves(params))


def test_the_guard_stops_a_run_whose_every_batch_is_nan(cli, tmp_path):
  done = cli.run(tmp_path, config=f"{NAN_BATCHES}:3-")
  assert done.returncode == 1, done.stderr[-3000:]
  assert _one_message(done.stderr).startswith(
      "dateopt-train: stopped: the divergence guard skipped every step from 3 to 20 (18 in a "
      "row) for a non-finite loss or gradient")
  assert _complete_checkpoints(tmp_path) == []  # step 20's save came after the check
  assert nonfinite.MAX_SKIPPED_IN_A_ROW <= 18


def test_the_guard_stops_a_run_whose_lr_sits_at_its_floor(cli, tmp_path):
  # Every other batch NaN: never 10 skips in a row, but the LR is backed off to its floor.
  done = cli.run(tmp_path, config=f"{NAN_BATCHES}:3-%2")
  assert done.returncode == 1, done.stderr[-3000:]
  message = _one_message(done.stderr)
  stopped = re.match(r"dateopt-train: stopped: the run stopped learning with the divergence "
                     r"guard's LR multiplier at its floor \(0.001\) from step (\d+) to (\d+)",
                     message)
  assert stopped, message
  first, last = int(stopped.group(1)), int(stopped.group(2))
  assert last - first + 1 == nonfinite.MAX_AT_FLOOR and last < 100


def test_the_floor_watch_lets_a_recovering_run_go_on_and_stops_one_that_ends_there():
  floor = 1e-3

  def run(multipliers):
    watch = nonfinite.NonFiniteWatch(0, lr_floor=floor, warn=False)
    for step, multiplier in enumerate(multipliers, 1):
      watch.record(step, {"loss": np.float32(1.0), nonfinite.GUARD_COUNT_KEY: np.int32(0),
                          nonfinite.GUARD_MULTIPLIER_KEY: np.float32(multiplier)})
    watch.check(len(multipliers))
    return watch

  recovery = 2 ** (1 / 100)  # the guard's default: one back-off undone in 100 accepted steps
  recovering = [floor * recovery ** k for k in range(200)]  # at the floor, then healthy steps
  run(recovering).finish()  # 14 accepted steps lift it past 1.1x the floor: never stopped
  with pytest.raises(nonfinite.NonFiniteError, match=r"the run ended with .* from step 9 to 12"):
    run([1.0] * 8 + [floor] * 4).finish()
  with pytest.raises(nonfinite.NonFiniteError, match="stopped learning"):
    run([floor] * nonfinite.MAX_AT_FLOOR)


# --- Metrics ------------------------------------------------------------------------------

def test_the_watch_asks_for_a_check_every_100_steps_and_names_the_nan_step():
  watch = nonfinite.NonFiniteWatch(None)  # no guard
  for step in range(1, nonfinite.NonFiniteWatch.MAX_PENDING):
    watch.record(step, {"loss": jax.numpy.float32(1.0)})
  assert not watch.due
  watch.record(100, {"loss": jax.numpy.float32(float("nan"))})
  assert watch.due
  with pytest.raises(nonfinite.NonFiniteError, match="loss was nan at step 100"):
    watch.check(100)
  assert not watch.due


def test_metrics_are_strict_json_and_readers_skip_non_finite_values(tmp_path):
  writer = metrics.MetricWriter(str(tmp_path))
  writer.write(1, {"a": 1.0, "b": float("nan"), "c": np.float32(np.inf)})
  writer.write(2, {"a": 2.0, "b": 0.5, "c": -np.inf})
  writer.close()
  text = (tmp_path / "metrics.jsonl").read_text()
  assert "NaN" not in text and "Infinity" not in text
  rows = _strict_rows(tmp_path)  # NaN and +-inf are null
  assert rows == [{"step": 1, "a": 1.0, "b": None, "c": None},
                  {"step": 2, "a": 2.0, "b": 0.5, "c": None}]
  assert metrics.read_metrics(str(tmp_path)) == rows
  assert plots.metric_curve(rows, "b") == ([2], [0.5])
  assert plots.metric_curve(rows, "c") == ([], [])


def test_a_resumed_writer_drops_the_killed_runs_later_rows(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 10, "train/loss": 1.0, "train/noise": NaN, "train/b": Infinity}\n'
                  '{"step": 20, "train/loss": 0.9}\n'
                  '{"step": 30, "train/loss": 0.8}\n'
                  '{"step": 40, "train/lo')  # the torn last line of a killed run
  writer = metrics.MetricWriter(str(tmp_path), start_step=20)
  writer.write(20, {"train/loss": 0.9, "eval/accuracy": 0.5})  # train/loss is there already
  writer.write(30, {"train/loss": 0.7})
  writer.close()
  assert _strict_rows(tmp_path) == [
      {"step": 10, "train/loss": 1.0, "train/noise": None, "train/b": None},
      {"step": 20, "train/loss": 0.9},
      {"step": 20, "eval/accuracy": 0.5},
      {"step": 30, "train/loss": 0.7}]


def test_logged_step_time_is_not_more_than_the_run_took(reference):
  workdir, wall_seconds = reference
  rows = _strict_rows(workdir)
  timed = [(r["step"], r.get("train/step_seconds")) for r in rows if "train/loss" in r]
  assert [s for s, _ in timed] == list(range(10, STEPS + 1, 10))
  laps = [(step - before, seconds) for (before, _), (step, seconds) in zip(timed, timed[1:])]
  assert all(seconds is not None and seconds > 0 for _, seconds in laps)
  step_time = sum(n * seconds for n, seconds in laps)
  assert step_time < wall_seconds
  summary = next(r for r in rows if "run/steps_per_second" in r)
  steps = sum(n for n, _ in laps)
  assert math.isclose(summary["run/steps_per_second"], steps / step_time, rel_tol=1e-6)


def _collect_a_failed_future(message: str) -> None:
  """A future that failed with `message` and is collected unread: asyncio logs it."""
  loop = asyncio.new_event_loop()
  future = loop.create_future()
  future.set_exception(ValueError(message))
  del future
  gc.collect()
  loop.close()


def test_the_failed_reads_of_a_damaged_checkpoint_are_not_logged_twice(tmp_path, caplog):
  """asyncio's "never retrieved" record of a failed read in this directory is dropped."""
  ckpt = checkpoint.Checkpointer(str(tmp_path / "checkpoints"))
  ckpt._quiet.install()  # as `restore_or` does once a checkpoint fails to load
  with caplog.at_level(logging.ERROR, logger="asyncio"):
    _collect_a_failed_future(f"NOT_FOUND: {ckpt.directory}/280/default/x/.zarray")
    assert "never retrieved" not in caplog.text
    _collect_a_failed_future("some other failure")  # anything else still reaches the log
    assert "never retrieved" in caplog.text and "some other failure" in caplog.text
  ckpt.close()
  caplog.clear()
  with caplog.at_level(logging.ERROR, logger="asyncio"):
    _collect_a_failed_future(f"NOT_FOUND: {ckpt.directory}/280/default/x/.zarray")
  assert "never retrieved" in caplog.text  # the filter is gone after `close`
