"""Data worker processes that end with their parent, and a dead worker named in one error.

A worker must not outlive the process reading from it: killed with SIGKILL, a trainer runs
no cleanup, and grain's workers would wait on forever for a reader, holding memory and
keeping multiprocessing's resource tracker alive with them. So each worker watches its
parent from a thread of its own (`exit_with_parent`, grain's public `worker_init_fn`):

- the parent sentinel that multiprocessing gives every child it spawns: a pipe whose write
  end only the parent holds, so it reads end-of-file the moment the parent is gone;
- and the parent's pid against `os.getppid()`, which catches a parent that died before
  the worker started watching.

Either ends the worker at once with `os._exit`: a normal exit would wait for queue feeder
threads that nobody reads any more. The resource tracker ends after the last worker (it
exits when every holder of its pipe has), unlinking the shared memory they left behind.

Nor does a worker end before its parent on a signal sent to the whole process group (a
terminal's Ctrl-C or hang-up, a scheduler's or `dateopt-tpu stop`'s SIGTERM to the job's
group): it ignores SIGINT, SIGHUP and SIGTERM, and the trainer, which saves a checkpoint
on them, still reads its batches while it finishes the step. (grain ends its workers with
SIGKILL, which no process can ignore.)

Not PR_SET_PDEATHSIG: grain starts its workers from one of its prefetch threads, and that
signal comes when the creating *thread* ends, not the process, so it could kill a worker
whose pipeline is still being read.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import re
import signal
import threading
import time
from multiprocessing import connection
from typing import Callable

from dateopt.data.errors import WorkerDiedError

POLL_SECONDS = 1.0  # how often the watch compares the parent's pid
ORPHAN_EXIT_STATUS = 1
# grain's error (mp_prefetch) when a worker it reads from has ended.
_TERMINATED = re.compile(r"terminated unexpectedly with exit code (-?\d+)")


def exit_with_parent(parent_pid: int) -> Callable[[int, int], None]:
  """The `worker_init_fn` (worker index, worker count) that ends a worker with `parent_pid`.

  Example:
    >>> init = exit_with_parent(os.getpid())   # mp_prefetch(options, worker_init_fn=init)
  """
  return functools.partial(_start_watch, parent_pid)


def _start_watch(parent_pid: int, worker_index: int, worker_count: int) -> None:
  del worker_index, worker_count
  if threading.current_thread() is threading.main_thread():  # where signals can be set
    for name in ("SIGINT", "SIGHUP", "SIGTERM"):
      if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
  parent = multiprocessing.parent_process()
  sentinel = None if parent is None else parent.sentinel
  threading.Thread(target=_exit_when_parent_gone, args=(parent_pid, sentinel),
                   name="dateopt-parent-watch", daemon=True).start()


def _exit_when_parent_gone(parent_pid: int, sentinel: int | None) -> None:
  while not parent_gone(parent_pid, sentinel, timeout=POLL_SECONDS):
    pass
  os._exit(ORPHAN_EXIT_STATUS)  # pylint: disable=protected-access  (no cleanup to wait for)


def parent_gone(parent_pid: int, sentinel: int | None = None, timeout: float = 0.0) -> bool:
  """Whether this process's parent `parent_pid` has ended; waits up to `timeout` for it.

  Example:
    >>> parent_gone(os.getppid())
    False
  """
  if os.getppid() != parent_pid:  # reparented: the parent is gone
    return True
  if sentinel is None:
    time.sleep(timeout)
    return os.getppid() != parent_pid
  return bool(connection.wait([sentinel], timeout)) or os.getppid() != parent_pid


class ChunkCount:
  """Counts the chunks the workers have delivered, to name the worker of the next one.

  The workers take the chunks in turn (worker i: chunks i, i + n, ...) and they are read
  in that order, so the chunk that did not come is the turn of worker `served % n`.
  """

  def __init__(self, num_workers: int):
    self.num_workers = num_workers
    self.served = 0

  def __call__(self, chunk):
    self.served += 1
    return chunk

  @property
  def next_worker(self) -> int:
    return self.served % self.num_workers


def dead_worker_error(error: BaseException, count: ChunkCount) -> WorkerDiedError | None:
  """`error` as a `WorkerDiedError` when it says a worker process ended; None otherwise."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    match = _TERMINATED.search(str(error))
    if match:
      return WorkerDiedError(count.next_worker, count.num_workers, int(match.group(1)))
    error = error.__cause__ or error.__context__
  return None
