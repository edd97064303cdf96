"""The console progress line: fields, ETA arithmetic, log lines and terminal redraws.

Every test drives the bar with a fake clock and a StringIO stream: no sleeps,
nothing depends on how fast the machine runs.
"""

import io

import numpy as np
import pytest

from dateopt.train.progress_bar import ProgressBar, StepPace, duration


class FakeClock:
  """Seconds that move only when a test says so."""

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


class Terminal(io.StringIO):
  def isatty(self):
    return True


def _bar(total, stream=None, **kwargs):
  clock = FakeClock()
  return ProgressBar(total, stream=io.StringIO() if stream is None else stream, clock=clock,
                     **kwargs), clock


# A static run: 10 s to compile step 1, then 0.25 s a step.
def _static_step_time(step):
  return 10.0 if step == 1 else 0.25


def test_the_eta_of_a_static_run_is_the_steps_left_at_the_recent_pace():
  bar, clock = _bar(1000)
  for step in range(1, 102):
    clock.now += _static_step_time(step)
    bar.update(step, batch_size=512)
  # Steps 2..101 timed (step 1 compiles): 0.25 s a step; 899 steps left → 224.75 s.
  assert bar.remaining_steps() == 899
  assert bar.eta_seconds() == pytest.approx(899 * 0.25)
  assert "step 101/1000 | batch 512 | 4.0 step/s" in bar.line()
  assert "ETA 3:45" in bar.line()   # 224.75 s


def test_the_first_steps_compile_and_are_not_timed():
  bar, clock = _bar(1000)
  clock.now += 10.0
  bar.update(1)
  assert bar.eta_seconds() is None   # nothing timed yet
  clock.now += 30.0                  # step 2: the second program's compile, or autotuning
  bar.update(2)
  clock.now += 0.25
  bar.update(3)
  assert bar.eta_seconds() == pytest.approx(997 * 0.25)   # not 997 × 40.25 / 3


def test_the_pace_is_a_moving_window():
  pace = StepPace(window_seconds=60.0)
  now = 0.0
  for step in range(1, 101):            # 1 s a step, then 0.5 s a step
    now += 1.0 if step <= 50 else 0.5
    pace.record(now, step)
  # 25 s at 0.5 s a step: the window still reaches 35 s back into the 1 s steps.
  assert 0.5 < pace.seconds_per_step() < 1.0
  for step in range(101, 301):
    now += 0.5
    pace.record(now, step)
  assert pace.seconds_per_step() == pytest.approx(0.5)   # the 1 s steps left the window


def test_the_eta_of_an_adaptive_run_divides_the_progress_left_by_the_gain():
  bar, clock = _bar(1000, adaptive=True)
  for step in range(1, 51):
    clock.now += 10.0 if step == 1 else 0.5
    bar.update(step)
  bar.update(50, progress=200.0, gain=4.0, batch_size=64)
  # τ advances by the gain a step: (1000 − 200) / 4 = 200 steps left, at 0.5 s → 100 s.
  assert bar.remaining_steps() == 200
  assert bar.eta_seconds() == pytest.approx(100.0)
  clock.now += 0.5
  bar.update(51)  # between readings: one step less to take
  assert bar.remaining_steps() == 199
  assert bar.line().startswith("tau 200/1000 baseline steps | step 51 | batch 64 | gain 4.0 |")


def test_the_eta_of_an_adaptive_run_stops_at_the_run_s_last_step():
  bar, clock = _bar(1000, adaptive=True, max_steps=120)
  for step in range(1, 101):
    clock.now += 0.5
    bar.update(step, progress=1.5 * step, gain=1.5)
  # (1000 − 150) / 1.5 ≈ 567 steps to cover T0, but the run ends at step 120: 20 left.
  assert bar.remaining_steps() == 20


def test_before_a_gain_is_read_the_mean_progress_per_step_stands_in():
  bar, clock = _bar(1000, adaptive=True, initial=100.0, start_step=40)  # a resumed run
  for step in range(41, 61):
    clock.now += 0.5
    bar.update(step, progress=100.0 + 3.0 * (step - 40))
  # 60 baseline steps in 20 steps: 3 a step; (1000 − 160) / 3 = 280 steps left.
  assert bar.remaining_steps() == pytest.approx(280)
  assert "gain" not in bar.line()   # no gain read, none shown


# The simulated run, scaled down: an adaptive run of T0 = 3618 baseline steps whose
# gain climbs from 1 to 8 over its first 29 steps (1 + (t − 1)/4), logged every 10 steps
# (τ and the gain read there). Step 1 compiles for 20 s, then a step takes 0.5 s.
T0 = 3618


def _gain(step):
  return min(8.0, 1.0 + (step - 1) / 4)


def _simulate_climbing_gain(bar, clock, log_every=10):
  """Runs the simulated adaptive run to its end; (step, time, τ read, ETA) at each drawn line."""
  progress, step, at_lines = 0.0, 0, []
  lines = 0
  while progress < T0:
    step += 1
    clock.now += 20.0 if step == 1 else 0.5
    progress += _gain(step)
    logs = step % log_every == 0 or progress >= T0
    bar.update(step, progress=progress if logs else None, gain=_gain(step) if logs else None,
               batch_size=64, loss=2.0)
    drawn = bar._stream.getvalue().count("\n")  # pylint: disable=protected-access
    if drawn > lines:
      lines = drawn
      at_lines.append((step, clock.now, bar.eta_seconds()))
  return step, clock.now, at_lines


def test_the_eta_of_a_climbing_gain_is_near_the_true_time_left_from_the_first_line():
  bar, clock = _bar(T0, adaptive=True)
  last_step, end, at_lines = _simulate_climbing_gain(bar, clock)
  # τ = 130.5 at step 29, then 8 a step: the run ends at step 465, at 20 + 464 × 0.5 = 252 s.
  assert (last_step, end) == (465, 252.0)
  step, now, eta = at_lines[0]
  assert (step, now) == (21, 30.0)   # the first line, 30 s after the start
  # It has read τ = 20 + 190/4 = 67.5 and the gain 5.75 at step 20: (3618 − 67.5) / 5.75 − 1
  # = 616.5 steps at 0.5 s → 308.2 s; the true time left is 252 − 30 = 222 s (1.39x).
  assert eta == pytest.approx(((T0 - 67.5) / 5.75 - 1) * 0.5)
  assert eta / (end - now) < 1.5
  # The mean-rate rule, remaining τ over the mean τ per second since the start (compile
  # included): (3618 − 67.5) / (67.5 / 30) = 1578 s, 7.1x the true 222 s.
  mean_rate_rule = (T0 - 67.5) / (67.5 / now)
  assert mean_rate_rule / (end - now) > 7
  # From the second line (60 s, step 81) on, the gain has stopped climbing: the ETA is the
  # time left (within the step since the last reading: 191.97 s for 192 s there).
  for step, now, eta in at_lines[1:]:
    assert eta == pytest.approx(end - now, abs=0.5)
  # The mean-rate rule there (τ = 538.5 read at step 80): (3618 − 538.5) / (538.5 / 60) = 343 s,
  # 1.8x the true 192 s; still 1.3x at 120 s (170 s for 132 s).
  _, now, _ = at_lines[1]
  assert (T0 - 538.5) / (538.5 / now) / (end - now) > 1.75


def test_without_a_terminal_a_line_every_interval_and_one_at_the_end():
  bar, clock = _bar(T0, adaptive=True)
  _, end, at_lines = _simulate_climbing_gain(bar, clock)
  bar.close()
  out = bar._stream.getvalue()  # pylint: disable=protected-access
  assert "\r" not in out
  lines = out.splitlines()
  assert [now for _, now, _ in at_lines] == [30.0, 60.0, 90.0, 120.0, 150.0, 180.0, 210.0,
                                              240.0]
  assert len(lines) == len(at_lines) + 1 and out.endswith("\n")   # and the last, at 252 s
  assert lines[0].startswith("tau 67/3618 baseline steps | step 21 | batch 64 | gain 5.8 | "
                             "2.0 step/s | ETA 5:08 | 0:30 elapsed | loss 2")
  assert lines[-1].startswith("tau 3618/3618 baseline steps | step 465 | batch 64 | gain 8.0 |")
  assert "ETA 0:00 | 4:12 elapsed" in lines[-1]
  bar.close()  # the loop's cleanup closes it again: nothing more
  assert bar._stream.getvalue() == out  # pylint: disable=protected-access


def test_the_log_interval_is_configurable():
  bar, clock = _bar(100, line_every_seconds=5.0)
  for step in range(1, 41):
    clock.now += 1.0
    bar.update(step)
  assert bar._stream.getvalue().count("\n") == 8  # pylint: disable=protected-access


def test_on_a_terminal_one_line_is_redrawn(monkeypatch):
  monkeypatch.setenv("COLUMNS", "200")
  terminal = Terminal()
  bar, clock = _bar(100, stream=terminal, redraw_every_seconds=1.0)
  for step in range(1, 11):
    clock.now += 0.5
    bar.update(step, batch_size=16, loss=10.0 ** -step)  # the loss field shortens
  out = terminal.getvalue()
  assert "\n" not in out
  frames = out.split("\r")[1:]
  assert len(frames) == 5   # at most one a second: steps 1, 3, 5, 7, 9
  assert frames[0].startswith("step 1/100 | batch 16 |")
  # Blanks over what a longer frame left: every frame as wide as the widest before it.
  widths = [len(frame) for frame in frames]
  assert widths == sorted(widths)
  bar.close()
  assert terminal.getvalue().endswith("\n") and terminal.getvalue().count("\n") == 1
  assert terminal.getvalue().split("\r")[-1].startswith("step 10/100")


def test_a_narrow_terminal_keeps_the_fields_up_to_the_eta(monkeypatch):
  monkeypatch.setenv("COLUMNS", "90")
  terminal = Terminal()
  bar, clock = _bar(3618, stream=terminal, adaptive=True)
  for step in range(1, 311):
    clock.now += 1.0 if step == 1 else 0.08
    bar.update(step, progress=1234.0, gain=7.9, batch_size=64, loss=2.31, lr=0.4)
  bar.close()
  frame = terminal.getvalue().split("\r")[-1]
  # 89 columns: the elapsed time, loss and lr are left out, the ETA kept:
  # (3618 − 1234) / 7.9 = 301.8 steps at 0.08 s → 24 s.
  assert frame.rstrip() == ("tau 1234/3618 baseline steps | step 310 | batch 64 | gain 7.9 | "
                            "12.5 step/s | ETA 0:24")
  assert "loss 2.31 | lr 0.4" in bar.line()   # a log line has room for all


def test_a_disabled_bar_writes_nothing():
  stream = io.StringIO()
  bar, clock = _bar(100, stream=stream, enabled=False)  # a process other than 0
  for step in range(1, 100):
    clock.now += 60.0
    bar.update(step, progress=1.0, gain=2.0)
  bar.close()
  assert stream.getvalue() == "" and bar.eta_seconds() is None


def test_numpy_readings_and_a_nan_gain_past_the_end():
  bar, clock = _bar(120, adaptive=True)
  for step in range(1, 6):
    clock.now += 1.0
    bar.update(step, progress=np.float32(30.7 * step), batch_size=np.int32(64),
               gain=np.float32(3.0), loss=np.float32(0.5))
  clock.now += 1.0
  bar.update(6, gain=np.float32(np.nan))   # the idle steps after the end report NaN
  assert "tau 120/120 baseline steps | step 6 | batch 64 | gain 3.0" in bar.line()
  assert bar.remaining_steps() == 0


def test_durations():
  assert [duration(s) for s in (0.0, 62.4, 3599.6, 3725.0, 90061.0)] == [
      "0:00", "1:02", "1:00:00", "1:02:05", "25:01:01"]


@pytest.mark.slow  # a training run
def test_the_train_loop_shows_an_adaptive_run_s_step_batch_and_gain(tmp_path, capsys):
  """The loop's bar, end to end: without a terminal, whole lines, the last one at the end."""
  from dateopt import train
  import tiny_config  # tests/tiny_config.py
  config = tiny_config.get_config()
  config.strategy, config.grad_groups, config.progress_bar = "adaptive", 4, True
  config.plan = dict(noise_scale=50.0)
  result = train.train_and_evaluate(config, str(tmp_path))
  shown = [line for line in capsys.readouterr().err.splitlines() if "baseline steps" in line]
  assert shown and not [line for line in shown if "\r" in line]
  assert shown[-1].startswith(f"tau 120/120 baseline steps | step {result.steps} | batch 64 | "
                              "gain ")
  assert "ETA 0:00" in shown[-1] and "| loss " in shown[-1]


def test_a_disabled_bar_reads_as_empty_and_never_raises():
  bar = ProgressBar(100, adaptive=True, enabled=False)
  bar.update(5, progress=10.0, gain=2.0)
  bar.close()
  assert (bar.line(), bar.remaining_steps(), bar.eta_seconds()) == ("", 0.0, None)
