"""`config.profile_steps`: a `jax.profiler` trace of a few steps, written into the workdir.

`"10:15"` traces steps 10 to 15 (both included): the trace starts before step
10 is dispatched and stops once step 15 has finished. It lands in
`<workdir>/plugins/profile/<time>/`, where TensorBoard's profile plugin finds
it (`tensorboard --logdir <workdir>`, the Profile tab), beside the scalars.
An empty string traces nothing; a window past the run's last step is refused
at startup. Every process writes its own host's trace.

Example:
  >>> trace = StepTrace.from_config("10:15", "/tmp/run")
  >>> for step in range(1, 21):
  ...   trace.before(step)
  ...   state = train_step(state, batch)
  ...   trace.after(step, state)
  >>> trace.close()   # a run that ends inside the window still writes its trace
"""

from __future__ import annotations

import re
from typing import Any

import jax

from dateopt.train import workdirs

_RANGE = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


def parse_profile_steps(value: Any) -> tuple[int, int] | None:
  """`config.profile_steps` as (first, last) step, or None for "" (no trace).

  Raises:
    TypeError, ValueError: naming `config.profile_steps` and the form allowed.
  """
  allowed = 'a string "first:last" of steps with 1 <= first <= last (e.g. "10:15"), or ""'
  if not isinstance(value, str):
    raise TypeError(f"config.profile_steps must be {allowed}; got {value!r} of type "
                    f"{type(value).__name__}.")
  if not value.strip():
    return None
  match = _RANGE.match(value)
  first, last = (int(match.group(1)), int(match.group(2))) if match else (0, -1)
  if not match or not 1 <= first <= last:
    raise ValueError(f"config.profile_steps must be {allowed}; got {value!r}.")
  return first, last


def check_within_run(profile_steps: Any, num_steps: int, *, may_end_sooner: bool = False
                     ) -> None:
  """Raises ValueError when `config.profile_steps` ends past the run's last step: the run
  would write no trace, or one cut short, without a word.

  `may_end_sooner`: `num_steps` is at most what the run takes (an adaptive run ends once
  its progress reaches the baseline's).
  """
  window = parse_profile_steps(profile_steps)
  if window is None or window[1] <= num_steps:
    return
  first, last = window
  traced = "no step" if first > num_steps else f"only steps {first} to {num_steps}"
  bound = " (at most: an adaptive run may end sooner)" if may_end_sooner else ""
  raise ValueError(f"config.profile_steps={profile_steps!r} ends past the run's last step: "
                   f"the run's {num_steps} steps{bound} would trace {traced}. Pick steps "
                   f"within 1:{num_steps}, or train for at least {last} steps.")


class StepTrace:
  """Starts and stops `jax.profiler`'s trace around the steps of a window."""

  def __init__(self, window: tuple[int, int] | None, logdir: str):
    self.window, self.logdir, self.active = window, logdir, False

  @classmethod
  def from_config(cls, profile_steps: str, workdir: str) -> "StepTrace":
    return cls(parse_profile_steps(profile_steps), str(workdirs.as_path(workdir)))

  def before(self, step: int) -> None:
    """Starts the trace before the window's first step (or the first step of a resume
    that lands inside it)."""
    if self.window and not self.active and self.window[0] <= step <= self.window[1]:
      jax.profiler.start_trace(self.logdir)
      self.active = True

  def after(self, step: int, state: Any) -> None:
    """Stops it once the window's last step has run on the devices."""
    if self.active and step >= self.window[1]:
      jax.block_until_ready(state)
      self.close()

  def close(self) -> None:
    if self.active:
      jax.profiler.stop_trace()
      self.active = False
