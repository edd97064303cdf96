"""Stopping a run cleanly on SIGTERM, SIGHUP or SIGINT: finish the step, checkpoint it, exit.

A cluster scheduler preempts a job with SIGTERM (and kills it a grace period
later); a dropped ssh session sends SIGHUP; a person stops one with Ctrl-C
(SIGINT). Either way the trainer finishes the step it is in, saves it, and
raises `Preempted`, which the CLI turns into one line and the conventional
status 128 + the signal number (143, 129, 130). The same command then resumes
the run. A repeated SIGTERM or SIGHUP (schedulers send several) changes
nothing: the save under way finishes. A second Ctrl-C stops at once.

Every process of a multi-host run must stop at the same step, or the
collective checkpoint save would hang. There SIGTERM belongs to JAX's
preemption service (installed by `jax.distributed.initialize`): it shares the
notice between hosts and picks a common step, which
`multihost_utils.reached_preemption_sync_point` reports. A signal that the
service does not see (SIGINT, or SIGTERM with the service off) is shared at
log steps, which every process reaches at the same step.
"""

from __future__ import annotations

import signal
import sys
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils


class Preempted(Exception):
  """A run stopped by a signal after its last step was saved; rerun it to resume.

  Attributes:
    signum: the signal that stopped the run.
    step: the last step taken (and saved, with checkpointing on).
    checkpoint_dir: where that step was saved; None with checkpointing off.

  Example:
    >>> try:
    ...   train.train_and_evaluate(config, "/tmp/run")
    ... except Preempted as stop:
    ...   print(stop); sys.exit(stop.exit_code)
  """

  def __init__(self, signum: int, step: int, checkpoint_dir: str | None):
    super().__init__(signum, step, checkpoint_dir)
    self.signum, self.step, self.checkpoint_dir = signum, step, checkpoint_dir

  @property
  def exit_code(self) -> int:
    """The shell's status for a process ended by the signal: 128 + its number."""
    return 128 + self.signum

  def __str__(self) -> str:
    if self.checkpoint_dir is None:
      then = ("checkpointing is off (config.checkpoint_every_steps=-1), "
              "so a rerun starts over")
    else:
      then = f"checkpoint saved in {self.checkpoint_dir}; rerun the same command to resume"
    return f"preempted ({signal.Signals(self.signum).name}) at step {self.step}; {then}."


class StopRequests:
  """SIGTERM, SIGHUP and SIGINT as a request to stop after the current step.

  A context manager: the handlers are installed on entry (from the main thread
  only; elsewhere Python forbids it and signals keep their old meaning) and
  the previous ones are restored on exit. A second SIGINT stops at once
  (KeyboardInterrupt: the person at the terminal does not want to wait); a
  second SIGTERM or SIGHUP is noted on stderr and waits for the save.

  Example:
    >>> with StopRequests() as stops:
    ...   for step in range(1, 101):
    ...     state = train_step(state)
    ...     if stops.should_stop(step, shares=step % 10 == 0):
    ...       save(step, state)
    ...       raise Preempted(stops.received, step, "/tmp/run/checkpoints")
  """

  def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)):
    self.received: int | None = None
    self._signals = signals
    self._previous: dict[int, object] = {}
    self._multihost = jax.process_count() > 1
    self._service = self._multihost and bool(jax.config.jax_enable_preemption_service)

  def __enter__(self) -> "StopRequests":
    if threading.current_thread() is not threading.main_thread():
      return self
    for signum in self._signals:
      if signum == signal.SIGTERM and self._service:
        continue  # JAX's handler owns SIGTERM; replacing it would cut the other hosts off.
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}

  def _handle(self, signum: int, frame) -> None:
    del frame
    if self.received is not None:  # asked again
      if signum == signal.SIGINT:  # by a person: they do not want to wait
        raise KeyboardInterrupt
      # By a scheduler, which repeats itself: exiting now would lose the save under way.
      print(f"dateopt-train: {signal.Signals(signum).name} again: still stopping after the "
            f"current step and its save.", file=sys.stderr, flush=True)
      return
    self.received = signum

  def should_stop(self, step: int, *, shares: bool) -> bool:
    """Whether to stop after `step`; on several processes, the same answer on each.

    Args:
      step: the step just taken (every process asks at every step).
      shares: whether this step is one where the processes share their local
        signals (a log step: the same on every process). Ignored on one process.
    """
    if not self._multihost:
      return self.received is not None
    if self._service and multihost_utils.reached_preemption_sync_point(step):
      self.received = self.received or signal.SIGTERM
      return True
    if not shares:
      return False
    everyone = multihost_utils.process_allgather(np.int32(self.received or 0))
    if everyone.max() == 0:
      return False
    self.received = self.received or int(everyone.max())
    return True
