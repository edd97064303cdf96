"""Stopping a run cleanly on SIGTERM, SIGHUP or SIGINT: finish the step, checkpoint it, exit.

A cluster scheduler preempts a job with SIGTERM (and kills it a grace period
later); a dropped ssh connection sends SIGHUP; a person stops one with Ctrl-C
(SIGINT). Either way the trainer finishes the step it is in, saves it, and
raises `Preempted`, which the CLI turns into one line and the conventional
status 128 + the signal number (143, 129, 130). The same command then resumes
the run. A repeated SIGTERM or SIGHUP (schedulers send several) changes
nothing: the save under way finishes. A second Ctrl-C stops at once.

Before the first step is taken there is nothing to save, and the start (loading
the data, compiling the step: minutes on a loaded machine) can be longer than
a preemption's grace period (about 30 s). A signal then ends the run at once
with one line that says so. Python runs signal handlers only between bytecodes,
not inside a compilation, so a watcher thread, woken through
`signal.set_wakeup_fd`, ends a process whose main thread has not unwound
within `ANSWER_SECONDS`.

Every process of a multi-host run must stop at the same step, or the
collective checkpoint save would hang. There SIGTERM belongs to JAX's
preemption service (installed by `jax.distributed.initialize`): it shares the
notice between hosts and picks a common step, which
`multihost_utils.reached_preemption_sync_point` reports. A signal that the
service does not see (SIGINT, or SIGTERM with the service off) is shared at
log steps, which every process reaches at the same step.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils


class Preempted(BaseException):
  """A run stopped by a signal after its last step was saved; rerun it to resume.

  A `BaseException`, as `KeyboardInterrupt` is: library code that answers any
  `Exception` with a warning and goes on (JAX's persistent compilation cache
  does, around its write after each compile) must not swallow a stop.

  Attributes:
    signum: the signal that stopped the run.
    step: the last step taken (and saved, with checkpointing on); None when the
      signal came before the first step, with nothing to save.
    checkpoint_dir: where that step was saved; None with checkpointing off.

  Example:
    >>> try:
    ...   train.train_and_evaluate(config, "/tmp/run")
    ... except Preempted as stop:
    ...   print(stop); sys.exit(stop.exit_code)
  """

  def __init__(self, signum: int, step: int | None, checkpoint_dir: str | None, *,
               diverged_since: int | None = None, healthy_step: int | None = None):
    super().__init__(signum, step, checkpoint_dir)
    self.signum, self.step, self.checkpoint_dir = signum, step, checkpoint_dir
    # A stop while DATE called the run diverged saves nothing: the run resumes from the
    # newest checkpoint before the divergence (`healthy_step`; None: there is none).
    self.diverged_since, self.healthy_step = diverged_since, healthy_step

  @property
  def exit_code(self) -> int:
    """The shell's status for a process ended by the signal: 128 + its number."""
    return 128 + self.signum

  def __str__(self) -> str:
    if self.step is None:
      return before_first_step(self.signum)
    if self.diverged_since is not None:
      return self._while_diverged()
    if self.checkpoint_dir is None:
      then = ("checkpointing is off (config.checkpoint_every_steps=-1), "
              "so a rerun starts over")
    else:
      then = f"checkpoint saved in {self.checkpoint_dir}; rerun the same command to resume"
    return f"preempted ({signal.Signals(self.signum).name}) at step {self.step}; {then}."


  def _while_diverged(self) -> str:
    name = signal.Signals(self.signum).name
    said = (f"preempted ({name}) at step {self.step}, while DATE calls the run diverged "
            f"(since step {self.diverged_since}): that state is not saved.")
    if self.checkpoint_dir is None:
      return f"{said} Checkpointing is off (config.checkpoint_every_steps=-1): a rerun starts over."
    if self.healthy_step is None:
      return f"{said} No checkpoint was saved before the divergence: a rerun starts over."
    return (f"{said} The last healthy checkpoint, step {self.healthy_step}, is kept in "
            f"{self.checkpoint_dir}; rerun the same command to resume from it.")


# How long the watcher gives the main thread to unwind after a signal that came before the
# first step, before it ends the process itself (the main thread is inside a compilation).
ANSWER_SECONDS = 3.0


def before_first_step(signum: int) -> str:
  """The one line for a run stopped by `signum` before its first step."""
  return (f"stopped ({signal.Signals(signum).name}) before the first step: nothing to "
          f"save; the same command starts (or resumes) the run again.")


class StopRequests:
  """SIGTERM, SIGHUP and SIGINT as a request to stop after the current step.

  A context manager: the handlers are installed on entry (from the main thread
  only; elsewhere Python forbids it and signals keep their old meaning) and
  the previous ones are restored on exit. A second SIGINT stops at once
  (KeyboardInterrupt: the person at the terminal does not want to wait); a
  second SIGTERM or SIGHUP is noted on stderr and waits for the save. Until
  `stepping()` is called a signal stops the run at once: the handler raises
  `Preempted` (step None), or the watcher thread ends a process whose main
  thread is stuck in a compilation (`on_exit_now` callbacks run first).

  Example:
    >>> with StopRequests() as stops:
    ...   for step in range(1, 101):
    ...     state = train_step(state)
    ...     stops.stepping()  # from here a signal waits for the step and its save
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
    self._stepping = False
    self._closed = threading.Event()
    self.on_exit_now: list = []  # callables the watcher runs before it ends the process
    self._wakeup: tuple[socket.socket, socket.socket] | None = None
    self._previous_wakeup_fd = -1
    self._previous_unraisable = None

  def _unraisable(self, unraisable) -> None:
    """Drops a `Preempted` that the handler raised inside a callback Python cannot unwind
    (JAX's garbage-collection hook, say): the watcher ends the run within `ANSWER_SECONDS`
    with its one message. Anything else goes to the previous hook."""
    if isinstance(unraisable.exc_value, Preempted):
      return
    self._previous_unraisable(unraisable)

  def __enter__(self) -> "StopRequests":
    if threading.current_thread() is not threading.main_thread():
      return self
    for signum in self._signals:
      if signum == signal.SIGTERM and self._service:
        continue  # JAX's handler owns SIGTERM; replacing it would cut the other hosts off.
      self._previous[signum] = signal.signal(signum, self._handle)
    self._previous_unraisable = sys.unraisablehook
    sys.unraisablehook = self._unraisable
    self._start_watcher()
    return self

  def __exit__(self, *exc_info) -> None:
    self._closed.set()
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}
    if self._previous_unraisable is not None:
      sys.unraisablehook, self._previous_unraisable = self._previous_unraisable, None
    if self._wakeup is not None:
      signal.set_wakeup_fd(self._previous_wakeup_fd)
      for end in self._wakeup:
        end.close()  # the watcher's read returns, and it ends
      self._wakeup = None

  def stepping(self) -> None:
    """The first step is taken: from now on a signal waits for the step and its save.

    Raises:
      Preempted: (step None) a signal came before the first step and its stop was
        swallowed on the way (an `except BaseException` that went on); nothing is
        saved, as promised for a stop before the first step.
    """
    if self.received is not None and not self._stepping:
      raise Preempted(self.received, None, None)
    self._stepping = True

  def _start_watcher(self) -> None:
    """C's signal handler writes the signal's number to the wakeup socket at once, even
    while the main thread is inside XLA; the watcher thread reads it there."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)  # Python requires it of a wakeup fd
    try:
      self._previous_wakeup_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main thread's interpreter
      reader.close(), writer.close()
      return
    self._wakeup = (reader, writer)
    threading.Thread(target=self._watch, args=(reader,), name="dateopt-stop-watcher",
                     daemon=True).start()

  def _watch(self, reader: socket.socket) -> None:
    while True:
      try:
        data = reader.recv(64)
      except OSError:  # closed by __exit__
        return
      if not data:
        return
      for signum in data:
        if signum in self._signals and not self._stepping:
          self._answer_or_exit(signum)

  def _answer_or_exit(self, signum: int) -> None:
    """Before the first step: the main thread's handler raises `Preempted`, and the run
    unwinds within `ANSWER_SECONDS`, unless it is inside a compilation; then the
    process ends here."""
    if self._closed.wait(ANSWER_SECONDS):
      return  # unwound: the caller says so itself
    if self._stepping:
      return  # the first step came first: the loop saves it and stops
    print(f"dateopt-train: {before_first_step(signum)}", file=sys.stderr, flush=True)
    for callback in self.on_exit_now:
      try:
        callback()
      except Exception:  # pylint: disable=broad-except
        pass  # best effort: the process ends either way
    os._exit(128 + signum)

  def _handle(self, signum: int, frame) -> None:
    del frame
    if not self._stepping and self.received is None:
      self.received = signum
      raise Preempted(signum, None, None)  # nothing to save yet: stop at once
    if self.received is not None and not self._stepping:
      return  # asked again while the first request unwinds
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
