"""The console progress line of a training run: how far, at what pace, how long to go.

`ProgressBar` shows the run's count (the optimizer steps of a static recipe,
or the baseline steps τ an adaptive run has covered of T0), the optimizer
step, the batch, DATE's gain, the step rate, the ETA, the time elapsed and
the last logged loss and learning rate:

  tau 1234/3618 baseline steps | step 310 | batch 64 | gain 7.9 | 12.3 step/s | ETA 0:25 |
  1:02 elapsed | loss 2.31 | lr 0.4   (one line)

On a terminal it redraws that one line in place (what does not fit its width
after the ETA is left out). Without one (a log file, a pipe, a notebook's
captured stderr) it writes whole lines, at most one every `line_every_seconds`
and one at the end, so a log gets a readable line per half minute rather than
thousands of carriage-return frames.

Example:
  >>> bar = ProgressBar(3618, adaptive=True, max_steps=3624)   # T0 = 3618 baseline steps
  >>> bar.update(310, progress=1234.0, batch_size=64, gain=7.9, loss=2.31)
  >>> bar.update(311, batch_size=64)   # between log steps: the step alone, no device wait
  >>> bar.close()                      # the last line; later calls do nothing
"""

from __future__ import annotations

import collections
import math
import shutil
import sys
import time
from typing import Any, Callable, TextIO

LINE_EVERY_SECONDS = 30.0  # without a terminal: one line per half minute
REDRAW_EVERY_SECONDS = 0.2  # on a terminal: fast enough to look live, cheap per step
PACE_WINDOW_SECONDS = 60.0
SETTLE_STEPS = 2  # the first steps compile (and autotune): they are never timed


class StepPace:
  """Recent seconds per optimizer step, over a moving window of wall time.

  Each `record(now, step)` adds a sample; the pace is the time between the
  oldest kept sample and the newest over the steps between them. One sample
  at or before the window's start is kept, so the span covers the whole
  window once the run is that old, and a slow spell (a compilation, an
  evaluation) leaves the pace once it is `window_seconds` behind.

  Example:
    >>> pace = StepPace(window_seconds=60.0)
    >>> pace.record(100.0, step=2); pace.record(105.0, step=12)
    >>> pace.seconds_per_step()
    0.5
  """

  def __init__(self, window_seconds: float = PACE_WINDOW_SECONDS):
    self._window = window_seconds
    self._samples: collections.deque[tuple[float, int]] = collections.deque()

  def record(self, now: float, step: int) -> None:
    if self._samples and step <= self._samples[-1][1]:
      return  # the same step again (or a rerun's): no time per step to read
    self._samples.append((now, step))
    while len(self._samples) > 2 and self._samples[1][0] <= now - self._window:
      self._samples.popleft()

  def seconds_per_step(self) -> float | None:
    """None until two steps are timed."""
    if len(self._samples) < 2:
      return None
    (first_time, first_step), (last_time, last_step) = self._samples[0], self._samples[-1]
    return (last_time - first_time) / (last_step - first_step)


class ProgressBar:
  """The run's progress line on process 0's stderr, with an ETA in optimizer steps.

  The ETA is the optimizer steps still to take times the recent seconds per
  step (`StepPace`: a moving window of `window_seconds`, which leaves out the
  first `settle_steps` steps after the start, where the step compiles):

  - a static recipe: `total` (its steps) less the step reached;
  - an adaptive run: its progress τ advances by the gain r_t per optimizer
    step, so the steps left are (T0 − τ) / r_t at the current gain, less the
    steps taken since τ was read; at most `max_steps` (the run's last step)
    less the step reached. Before any gain is known, the mean τ per step
    since the start stands in for r_t.

  Remaining τ over the run's mean rate of τ per second reads several times
  too long while DATE's gain climbs, and still too long half way: it divides
  by the early, low-gain pace and by the compile time. The current gain
  follows the pace the run has now.
  A growing batch makes steps slower as it grows: the ETA then follows the
  pace of the batch being trained. An evaluation or a checkpoint inside the
  window counts as step time: the ETA is wall time.

  `enabled=False` (the processes other than 0, or `config.progress_bar=False`)
  makes every call a no-op. `stream` and `clock` default to `sys.stderr` and
  `time.monotonic`; the tests give a `StringIO` and a fake clock.

  The gain is an upper bound on τ's advance: in the LR warmup (τ advances by
  the ramp times the gain) and over skipped steps τ advances less, so there
  the ETA reads short.

  Example:
    >>> bar = ProgressBar(5000, start_step=0)          # a static recipe's 5000 steps
    >>> for step in range(1, 5001):
    ...   bar.update(step, batch_size=512)             # stderr: "step 5000/5000 | batch 512 |
    >>> bar.close()                                    #   <rate> step/s | ETA 0:00 | ..."
  """

  def __init__(self, total: float, *, initial: float = 0.0, start_step: int = 0,
               adaptive: bool = False, max_steps: int | None = None, enabled: bool = True,
               stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
               line_every_seconds: float = LINE_EVERY_SECONDS,
               redraw_every_seconds: float = REDRAW_EVERY_SECONDS,
               window_seconds: float = PACE_WINDOW_SECONDS, settle_steps: int = SETTLE_STEPS):
    self.enabled = self._built = enabled  # closing ends `enabled`; the state stays readable
    if not enabled:
      return
    self._total, self._adaptive, self._max_steps = float(total), adaptive, max_steps
    self._start_step, self._initial = int(start_step), float(initial)
    self._step, self._progress = int(start_step), float(initial)
    self._progress_step = self._step  # the step where τ was read
    self._batch: int | None = None
    self._gain: float | None = None
    self._shown: dict[str, float] = {}  # loss, lr: the last logged step's
    self._stream = sys.stderr if stream is None else stream
    self._clock = clock
    self._on_terminal = _is_terminal(self._stream)
    self._draw_every = redraw_every_seconds if self._on_terminal else line_every_seconds
    self._opened = clock()
    # A log's first line comes a full interval after the start; a terminal's at once.
    self._drawn_at = -math.inf if self._on_terminal else self._opened
    self._drawn_width = 0
    self._pace = StepPace(window_seconds)
    self._timed_from = self._start_step + settle_steps

  def update(self, step: int, *, progress: float | None = None, batch_size: int | None = None,
             gain: float | None = None, **shown: float | None) -> None:
    """Records step `step` (and what is known of it) and redraws when one is due.

    Args:
      step: the optimizer step just taken.
      progress: an adaptive run's τ where read (None keeps the last reading).
      batch_size: the step's batch.
      gain: DATE's gain r_t where read (a logged step's `date/gain`).
      **shown: values shown after the ETA, e.g. `loss=`, `lr=` (None: not read).
    """
    if not self.enabled:
      return
    now = self._clock()
    self._step = int(step)
    if step >= self._timed_from:
      self._pace.record(now, self._step)
    if progress is not None:
      self._progress, self._progress_step = float(progress), self._step
    if batch_size is not None:
      self._batch = int(batch_size)
    if gain is not None and math.isfinite(float(gain)) and float(gain) > 0:
      self._gain = float(gain)  # the steps past an adaptive run's end report NaN
    self._shown.update({k: float(v) for k, v in shown.items() if v is not None})
    if now - self._drawn_at >= self._draw_every:
      self._draw(now)

  def remaining_steps(self) -> float:
    """The optimizer steps still to take, by the rule in the class docstring (0 disabled)."""
    if not self._built:
      return 0.0
    if not self._adaptive:
      left = self._total - self._step
    else:
      gain = self._gain or self._mean_progress_per_step()
      left = (self._total - self._progress) / gain - (self._step - self._progress_step)
    if self._max_steps is not None:
      left = min(left, self._max_steps - self._step)
    return max(0.0, left)

  def eta_seconds(self) -> float | None:
    """The time still to go; None until two steps past the compiling ones are timed."""
    if not self.enabled:
      return None
    seconds_per_step = self._pace.seconds_per_step()
    return None if seconds_per_step is None else self.remaining_steps() * seconds_per_step

  def line(self, now: float | None = None, width: int | None = None) -> str:
    """The progress line as drawn at `now` (default: the clock's time).

    With a `width` (a terminal's), the fields after the ETA (elapsed, loss, ...)
    that do not fit are left out, then the rest is cut to it.
    """
    if not self._built:
      return ""
    now = self._clock() if now is None else now
    line = " | ".join(self._main_fields())
    for field in [f"{duration(now - self._opened)} elapsed"] + [
        f"{name} {value:.4g}" for name, value in self._shown.items()]:
      if width is not None and len(line) + 3 + len(field) > width:
        break
      line += " | " + field
    return line if width is None else line[:width]

  def _main_fields(self) -> list[str]:
    """How far, at what pace, how long to go: what a narrow terminal still shows."""
    fields = [self._count()]
    if self._adaptive:
      fields.append(f"step {self._step}")
    if self._batch is not None:
      fields.append(f"batch {self._batch}")
    if self._gain is not None:
      fields.append(f"gain {self._gain:.1f}")
    seconds_per_step = self._pace.seconds_per_step()
    if seconds_per_step:
      fields.append(_rate(seconds_per_step))
    eta = self.eta_seconds()
    fields.append("ETA ?" if eta is None else f"ETA {duration(eta)}")
    return fields

  def close(self) -> None:
    """Draws the last line (and ends a terminal's); later calls do nothing."""
    if not self.enabled:
      return
    self._draw(self._clock())
    if self._on_terminal:
      self._stream.write("\n")
      self._stream.flush()
    self.enabled = False

  def _count(self) -> str:
    if self._adaptive:
      covered = min(int(self._progress), int(self._total))
      return f"tau {covered}/{int(self._total)} baseline steps"
    return f"step {self._step}/{int(self._total)}"

  def _mean_progress_per_step(self) -> float:
    """τ per step since the start, or 1 before any: the gain's stand-in until one is read."""
    steps = self._progress_step - self._start_step
    covered = self._progress - self._initial
    return covered / steps if steps > 0 and covered > 0 else 1.0

  def _draw(self, now: float) -> None:
    self._drawn_at = now
    if self._on_terminal:
      # One line, redrawn: no wider than the terminal (a wrapped line is not redrawn), and
      # blanks over what a longer previous line left.
      text = self.line(now, width=max(shutil.get_terminal_size().columns - 1, 20))
      self._stream.write("\r" + text + " " * max(0, self._drawn_width - len(text)))
      self._drawn_width = len(text)
    else:
      self._stream.write(self.line(now) + "\n")
    self._stream.flush()


def duration(seconds: float) -> str:
  """Seconds as M:SS, or H:MM:SS from an hour.

  Example:
    >>> duration(62.4), duration(3725.0)
    ('1:02', '1:02:05')
  """
  minutes, secs = divmod(max(0, int(round(seconds))), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _rate(seconds_per_step: float) -> str:
  """Steps per second, or seconds per step below one a second (as tqdm reads it)."""
  if seconds_per_step <= 1.0:
    return f"{1.0 / seconds_per_step:.1f} step/s"
  return f"{seconds_per_step:.2f} s/step"


def _is_terminal(stream: Any) -> bool:
  isatty = getattr(stream, "isatty", None)
  try:
    return bool(isatty and isatty())
  except ValueError:  # a closed stream
    return False
