"""Data worker processes end with the process that started them; a dead worker is one error.

Processes are found through /proc (Linux): the children of every thread of a process, since
grain starts its workers from a thread of its own.
"""

import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

simplejpeg = pytest.importorskip("simplejpeg")
pytest.importorskip("grain")

from dateopt.data import Dataset, WorkerDiedError, jpeg  # noqa: E402

pytestmark = [pytest.mark.slow,  # worker processes, a subprocess
              pytest.mark.skipif(not glob.glob("/proc/self/task/*/children"),
                                 reason="needs Linux's /proc/<pid>/task/<tid>/children")]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE_S = 10  # for processes to end once their parent is gone: a watcher takes milliseconds

ITERATE = """
import numpy as np, simplejpeg
from dateopt.data import Dataset, jpeg

if __name__ == "__main__":
  records = [{"image": simplejpeg.encode_jpeg(np.full((40, 60, 3), i, np.uint8)), "label": i}
             for i in range(64)]
  source = jpeg.JpegSource(records, image_size=16)
  ds = Dataset("jpegs", "classification", 64, (16, 16, 3), np.dtype(np.uint8), source, source,
               num_workers=2, prefetch_examples=16)
  batches = ds.train_iterator(8, seed=0)
  for _ in range(4):  # a batch is one chunk, from each worker in turn: both have started
    next(batches)
  print("iterating", flush=True)
  for _ in batches:  # until killed
    pass
"""


def _children(pid):
  found = set()
  for path in glob.glob(f"/proc/{pid}/task/*/children"):
    try:
      with open(path) as file:
        found.update(int(child) for child in file.read().split())
    except OSError:  # the thread ended meanwhile
      pass
  return found


def _descendants(pid):
  found, todo = set(), [pid]
  while todo:
    for child in _children(todo.pop()) - found:
      found.add(child)
      todo.append(child)
  return found


def _started(pid):
  """The process's start time (clock ticks since boot), or None once it is gone or a zombie."""
  try:
    with open(f"/proc/{pid}/stat") as file:
      fields = file.read().rpartition(")")[2].split()
  except OSError:
    return None
  return None if fields[0] in "ZX" else int(fields[19])


def _command(pid):
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as file:
      return file.read().replace(b"\0", b" ").decode(errors="replace")
  except OSError:
    return "(gone)"


def _still_alive(started):
  """The processes of {pid: start time} that still run (a reused pid has another start time)."""
  return {pid: start for pid, start in started.items() if _started(pid) == start}


def _wait_until_gone(started, deadline_s):
  deadline = time.monotonic() + deadline_s
  while (alive := _still_alive(started)) and time.monotonic() < deadline:
    time.sleep(0.1)
  return alive


def _kill(processes):
  for pid in processes:  # only processes these tests started
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


def _wait_for_line(path, text, process, deadline_s=120):
  deadline = time.monotonic() + deadline_s
  while time.monotonic() < deadline and process.poll() is None:
    if text in path.read_text():
      return
    time.sleep(0.1)
  raise AssertionError(f"no {text!r} from the script (status {process.poll()})")


def test_workers_and_the_resource_tracker_end_when_the_trainer_is_killed(tmp_path):
  script, out = tmp_path / "iterate.py", tmp_path / "out.txt"
  script.write_text(ITERATE)
  with open(out, "w") as stdout:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    process = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=env, stdout=stdout,
                               stderr=subprocess.STDOUT)
  started = {}
  try:
    _wait_for_line(out, "iterating", process)
    deadline = time.monotonic() + 60
    while True:  # the second worker may start after the first batch
      started = {pid: _started(pid) for pid in _descendants(process.pid)}
      commands = [_command(pid) for pid in started]
      workers = sum("resource_tracker" not in c for c in commands)
      if workers == 2 or time.monotonic() > deadline:
        break
      time.sleep(0.05)
    assert workers == 2 and len(started) == 3, commands  # and the resource tracker
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    alive = _wait_until_gone(started, DEADLINE_S)
    assert not alive, [_command(pid) for pid in alive]
  finally:
    _kill([process.pid, *_still_alive(started)])
    process.wait(timeout=30)


def _records():
  return [{"image": simplejpeg.encode_jpeg(np.full((40, 60, 3), i, np.uint8)), "label": i}
          for i in range(64)]


def _workers_started(batches, before, deadline_s=60):
  """{pid: start time} of the iterator's two workers, once both run (the second may start late)."""
  deadline = time.monotonic() + deadline_s
  while True:
    next(batches)
    workers = {pid: _started(pid) for pid in _children(os.getpid()) - before
               if "resource_tracker" not in _command(pid)}
    if len(workers) == 2 or time.monotonic() > deadline:
      assert len(workers) == 2, [_command(pid) for pid in workers]
      return workers
    time.sleep(0.05)


def test_a_killed_worker_ends_the_iteration_with_one_line():
  source = jpeg.JpegSource(_records(), image_size=16)
  ds = Dataset("jpegs", "classification", 64, (16, 16, 3), np.dtype(np.uint8), source, source,
               num_workers=2, prefetch_examples=16)
  before = _children(os.getpid())
  batches = ds.train_iterator(8, seed=0)
  workers = {}
  try:
    workers = _workers_started(batches, before)
    next(batches), next(batches)  # a chunk from each: both workers run (set up their signals)
    for worker in workers:  # signals to the whole group reach them too: the trainer answers
      for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        os.kill(worker, signum)
    for _ in range(8):  # 8 chunks of 8 examples: each worker's turn comes four times
      next(batches)
    assert _still_alive(workers) == workers
    os.kill(min(workers), signal.SIGKILL)
    deadline = time.monotonic() + 60
    with pytest.raises(WorkerDiedError) as caught:
      while time.monotonic() < deadline:
        next(batches)
    error = caught.value
    assert not isinstance(error, (OSError, RuntimeError)) and error.exit_code == 1
    message = str(error)
    assert "\n" not in message
    for part in ("data worker process", "of 2", "SIGKILL",
                 "the checkpoints saved before it are kept; rerun the same command to resume"):
      assert part in message, message
    assert error.signal == signal.SIGKILL
    assert not _wait_until_gone(workers, 30)  # the other worker is stopped too
  finally:
    batches.close()
    _kill(_still_alive(workers))
