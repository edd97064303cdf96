"""The input pipeline's errors that end a run: each says in one line (`str`) what to do.

Neither is an OSError: a broken record or a dead worker is no full disk, and freeing
space would not help. Each pickles whole, to cross from a worker process.
"""

from __future__ import annotations

import functools
import signal as signal_lib

RESUME = "the checkpoints saved before it are kept; rerun the same command to resume"
SKIP_OPTION = ("the dataset option max_undecodable_records=N "
               "(dateopt-train: --config.dataset_kwargs.max_undecodable_records=N)")


class UndecodableRecordError(Exception):
  """A record whose encoded image does not decode, with the skip off or past its bound.

  Attributes:
    dataset, split: where the record is.
    index: the record, in its split.
    reason: the decoder's error.
    allowed: `max_undecodable_records` (0: the skip is off).
    found: the undecodable records met so far, this one included.
  """

  exit_code = 1

  def __init__(self, dataset: str, split: str, index: int, *, reason: str, allowed: int = 0,
               found: int = 1):
    super().__init__(dataset, split, index, reason, allowed, found)
    self.dataset, self.split, self.index, self.reason = dataset, split, index, reason
    self.allowed, self.found = allowed, found

  def __reduce__(self):
    return functools.partial(type(self), self.dataset, self.split, self.index,
                             reason=self.reason, allowed=self.allowed, found=self.found), ()

  def __str__(self) -> str:
    where = "stopped: " + where_records_are(self.dataset, self.split)
    if not self.allowed:
      return (f"{where}: record {self.index} cannot be decoded ({self.reason}). Fix or remove "
              f"the record, or let the run skip undecodable records (each replaced by the "
              f"next decodable record of its split) with {SKIP_OPTION}; {RESUME}.")
    return (f"{where}: record {self.index} cannot be decoded ({self.reason}), which makes "
            f"{self.found} undecodable records, more than max_undecodable_records="
            f"{self.allowed} allows (the warnings before it name the others). Fix or remove "
            f"the records, or allow more; {RESUME}.")


def where_records_are(dataset: str, split: str) -> str:
  """'imagenet2012 split 'train'', for messages about a record."""
  return (dataset or "JPEG records") + (f" split {split!r}" if split else "")


class WorkerDiedError(Exception):
  """A data worker process ended while the pipeline was reading from it.

  Attributes:
    worker: the worker's index (None if unknown), of `num_workers`.
    exitcode: its exit status as multiprocessing gives it: -N for signal N.
    signal: that signal (a `signal.Signals`), or None if it exited.
  """

  exit_code = 1

  def __init__(self, worker: int | None, num_workers: int, exitcode: int):
    super().__init__(worker, num_workers, exitcode)
    self.worker, self.num_workers, self.exitcode = worker, num_workers, exitcode
    self.signal = _signal(exitcode)

  def __str__(self) -> str:
    which = "a data worker process" if self.worker is None else (
        f"data worker process {self.worker}")
    if self.signal is None:
      how = f"exited with status {self.exitcode} (the log above says why)"
    else:
      how = f"was killed by {self.signal.name}"
      if self.signal == signal_lib.SIGKILL:  # what the kernel's out-of-memory killer sends
        how += (" (the kernel's out-of-memory killer sends it, and dmesg says whether it "
                "did; fewer num_workers or a smaller prefetch_examples use less memory)")
    return f"stopped: {which} (of {self.num_workers}) {how}; {RESUME}."


def _signal(exitcode: int) -> signal_lib.Signals | None:
  if exitcode >= 0:
    return None
  try:
    return signal_lib.Signals(-exitcode)
  except ValueError:  # a number no name stands for
    return None
