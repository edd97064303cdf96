"""The train loop: what a run carries from step to step, and one step at a time.

`TrainLoop` starts from a fresh or restored state and takes one step per
`run_step` call, each concern one call: train; read the adaptive engine's
progress where the loop needs it; log; check health, evaluate and checkpoint
as the `Cadence` says; enter Final Polishing's window; follow a growing
batch; stop on a signal. `finish` ends the run: the last evaluation, precise
BN, and the numbers the summary reports.

Example (what `train_and_evaluate` does once the workdir is claimed):
  >>> with contextlib.ExitStack() as cleanup:
  ...   loop = TrainLoop(exp, tx, workdir, report=report, cleanup=cleanup)
  ...   for step in range(loop.start_step + 1, exp.num_train_steps + 1):
  ...     if loop.run_step(step, stops):
  ...       break
  ...   loop.finish()
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dateopt import date
from dateopt.train import config as config_lib
from dateopt.train import (engine_log, nonfinite, parallel, polish, preemption, profiling, rungs,
                           workdirs)
from dateopt.train.checkpoint import Checkpointer, NoUsableCheckpointError
from dateopt.train.diverged import EngineHealth, learning_rate_of
from dateopt.train.evaluation import evaluate, make_eval_fn
from dateopt.train.experiment import Experiment
from dateopt.train.feed import TrainFeed
from dateopt.train.metrics import MetricWriter, StepClock, Writer
from dateopt.train.progress_bar import ProgressBar
from dateopt.train.startup import StartupError, startup
from dateopt.train.steps import TrainState, create_train_state, train_step
from dateopt.date import _guard as guard_lib


@dataclasses.dataclass
class _Tick:
  """What falls on one step: its number and batch, and what the loop does after it."""

  step: int
  batch_size: int
  logs: bool
  evaluates: bool
  saves: bool
  wanted_batch: int  # the batch of the next step (a growing engine's choice)
  progress: float | None = None  # the adaptive engine's, in baseline steps, where read
  done: bool = False  # the adaptive run has covered the baseline's steps
  idle: bool = False  # it had at an earlier step: this one changed nothing


class TrainLoop:
  """One run's state, feed, writer, clocks and watches, advanced by `run_step`."""

  def __init__(self, exp: Experiment, tx, workdir: str, *, report: str,
               cleanup: contextlib.ExitStack, metric_writers: Sequence[Writer] = ()):
    self.exp, self.cadence = exp, exp.cadence
    lead = jax.process_index() == 0
    self.state, self.checkpointer = self._initial_state(tx, workdir, cleanup)
    self.start_step = int(parallel.to_host(self.state.step))
    if lead and self.start_step:
      print(f"Resuming from step {self.start_step} (checkpoints in "
            f"{self.checkpointer.directory}).", flush=True)
    self.step_fn, self.eval_fn = _compile_train_step(exp, tx), make_eval_fn(exp)
    self.writer = MetricWriter(workdir, enabled=lead, start_step=self.start_step,
                               extra_writers=metric_writers)
    cleanup.callback(self.writer.close)
    self.engine_log = engine_log.EngineLog(
        workdir, enabled=lead and exp.recipe.adaptive and not exp.recipe.scheduled,
        start_step=self.start_step)
    cleanup.callback(self.engine_log.close)
    if self.start_step == 0:
      self.writer.write_text("recipe", report)
    start_progress = _progress(exp, self.state)
    self.finished_before = _ended(exp, self.start_step, start_progress)  # a rerun: no step
    # An adaptive run counts the baseline steps its progress covers, a static one its steps.
    adaptive = exp.recipe.adaptive
    self.progress = ProgressBar(
        exp.recipe.total_steps if adaptive else exp.num_train_steps,
        initial=start_progress or 0.0, start_step=self.start_step, adaptive=adaptive,
        max_steps=exp.num_train_steps, enabled=lead and exp.config.progress_bar)
    cleanup.callback(self.progress.close)
    self.clean_data = _final_epochs_due(exp, self.start_step, start_progress)
    self.feed, last_batch = self._open_feed()
    cleanup.callback(self.feed.close)  # the pipeline in use when the run ends
    # The metrics say the batch of every step: a row where it changes (a resume knows the last).
    self.largest_batch, self.logged_batch = self.feed.batch_size, last_batch
    self.clock = StepClock(exp.recipe.batch_size)
    # Noise measured on 1 step in N: a Python flag per step, so two compiled programs.
    self.measures_some_steps = exp.layout.grad_groups > 1 and exp.config.measure_every_steps > 1
    self.rung_programs = rungs.RungPrograms(
        self.step_fn, ladder=exp.batch_sizes, enabled=exp.compiles_rungs_ahead,
        measure_flags=(True, False) if self.measures_some_steps else (None,))
    cleanup.callback(self.rung_programs.close)
    self.trace = profiling.StepTrace.from_config(exp.config.profile_steps, workdir)
    cleanup.callback(self.trace.close)  # a run that ends inside the window keeps its trace
    self.watch = nonfinite.NonFiniteWatch(
        nonfinite.guard_nonfinite_count(self.state.opt_state), warn=lead,
        lr_floor=config_lib.to_dict(exp.config.guard_kwargs).get(
            "min_multiplier", guard_lib.DEFAULT_MIN_MULTIPLIER))
    self.metrics, self.train_metrics, self.eval_metrics = {}, {}, {}
    self.evaluated_at: int | None = None
    self.before_polish: dict[str, float] | None = None

  def _initial_state(self, tx, workdir: str, cleanup: contextlib.ExitStack
                     ) -> tuple[TrainState, Checkpointer | None]:
    """A fresh state, or the newest checkpoint that loads; the checkpointer (if any)."""
    exp = self.exp
    init = jax.jit(functools.partial(create_train_state, exp.model, tx, seed=exp.config.seed),
                   out_shardings=parallel.replicated(exp.mesh))
    state = init(jnp.zeros((1,) + tuple(exp.dataset.input_shape), exp.dataset.input_dtype))
    if polish.uses_precise_bn(exp.polish["mode"]) and not state.batch_stats:
      raise StartupError(f"config.polish.mode={exp.polish['mode']!r} re-estimates batch-norm "
                         f"statistics, but config.model={exp.config.model!r} has no batch "
                         "norm: use 'none' or 'final_epochs'.")
    if not self.cadence.checkpoints:
      return state, None
    checkpointer = Checkpointer(workdirs.as_path(workdir) / "checkpoints",
                                keep=exp.config.keep_checkpoints)
    cleanup.callback(checkpointer.close)
    with startup(NoUsableCheckpointError):
      return checkpointer.restore_or(state), checkpointer

  def _open_feed(self) -> tuple[TrainFeed, int]:
    """The input feed where the state stands, and the batch of the state's last step."""
    exp, state = self.exp, self.state
    host = parallel.to_host({"examples": state.examples_seen, "last": state.last_batch_size,
                             "batch": _engine_batch(exp, state.opt_state)})
    feed = TrainFeed(exp.dataset, exp.mesh, seed=exp.config.seed, batch_size=int(host["batch"]),
                     grows=exp.grows, start_step=self.start_step,
                     position=int(host["examples"]), clean=self.clean_data)
    return feed, int(host["last"])

  def run_step(self, step: int, stops: preemption.StopRequests) -> bool:
    """Takes step `step` and all that falls on it; True once the run is done.

    Raises:
      Preempted: a signal asked the run to stop (the step is saved first).
    """
    tick = self._train(step, stops)
    self._read_engine(tick)
    self._log(tick)
    self._advance_progress_bar(tick)
    tick.evaluates = tick.evaluates or tick.done
    tick.saves = tick.saves or (tick.done and self.checkpointer is not None)
    self._check_evaluate_save(tick)
    if tick.done:
      return True
    self._enter_final_epochs(tick)
    if tick.wanted_batch != self.feed.batch_size:  # DATE's next rung
      self.feed.resize(tick.wanted_batch)
      self.largest_batch = max(self.largest_batch, tick.wanted_batch)
    if step < self.exp.num_train_steps and stops.should_stop(step, shares=tick.logs):
      self.watch.check(int(parallel.to_host(self.state.step)))
      raise _stop_and_save(stops, self.state, self.checkpointer)  # the cleanup waits for the save
    return False

  def _train(self, step: int, stops: preemption.StopRequests) -> _Tick:
    config, batch = self.exp.config, self.feed.batch_size
    logs = self.cadence.logs(step)
    record = np.bool_(logs) if config.statistics else None  # stats only when logged
    measure = (step % config.measure_every_steps == 0 if self.measures_some_steps else None)
    self.trace.before(step)
    waiting = time.perf_counter()  # the host's wait for the batch: is the step input-bound?
    inputs = self.feed.next()
    waited = time.perf_counter() - waiting
    self.rung_programs.step_at(batch, self.state, inputs, record_statistics=record)
    self.state, self.metrics = self.step_fn(self.state, inputs, record_statistics=record,
                                              measure_noise=measure)
    stops.stepping()  # a signal now waits for this step and saves it
    self.trace.after(step, self.state)
    self.clock.count_step(batch, input_seconds=waited)
    self.watch.record(step, self.metrics)
    self.engine_log.record(step, self.metrics)
    if batch != self.logged_batch:  # the batch of every step: a row at each change
      self.writer.write(step, {"train/batch_size": batch})
      self.logged_batch = batch
    return _Tick(step, batch, logs, self.cadence.evaluates(step), self.cadence.saves(step),
                 wanted_batch=batch)

  def _read_engine(self, tick: _Tick) -> None:
    """The adaptive engine's progress (and next batch) where the loop needs them."""
    exp, metrics = self.exp, self.metrics
    if exp.grows:  # the engine says every step what the next one takes, and when it is done
      reading = parallel.to_host({k: metrics[k] for k in ("date/progress", "date/batch_size")})
      tick.progress, tick.wanted_batch = (float(reading["date/progress"]),
                                          int(reading["date/batch_size"]))
      tick.done = tick.progress >= exp.recipe.total_steps
      tick.logs = tick.logs or tick.done
    elif not self.clean_data and exp.final_epochs_steps and exp.recipe.adaptive and not tick.logs:
      # The window is entered at the step its progress crosses: read it every step until then.
      tick.progress = float(parallel.to_host(metrics["date/progress"]))
    if exp.recipe.adaptive and not exp.grows and (tick.logs or tick.evaluates or tick.saves):
      # Read the end where the loop waits for the step anyway: the steps after the one that
      # covered the baseline's steps are idle, and nothing is logged, evaluated or saved
      # past it.
      tick.progress = float(parallel.to_host(metrics["date/progress"]))
      if tick.progress >= exp.recipe.total_steps:
        taken = int(parallel.to_host(self.state.step))
        tick.done, tick.idle, tick.step = True, taken != tick.step, taken

  def _log(self, tick: _Tick) -> None:
    if not tick.logs or tick.idle:
      return
    logged = parallel.to_host({k: v for k, v in self.metrics.items()  # waits for the step:
                               if not k.startswith(engine_log.PREFIX)})  # the clock reads true time
    lap = self.clock.lap()
    logged.update(lap, batch_size=tick.batch_size,
                  **data_seen(self.exp.dataset, self.feed.position,
                              lap.get("examples_per_second")))
    tick.progress = logged.get("date/progress")
    self.train_metrics = logged
    with self.clock.paused():
      self.writer.write(tick.step, {f"train/{k}": v for k, v in logged.items()})

  def _advance_progress_bar(self, tick: _Tick) -> None:
    """Every step moves the bar (no wait for the device); a logged one adds its readings."""
    logged = self.train_metrics if tick.logs and not tick.idle else {}
    self.progress.update(tick.step, progress=tick.progress, batch_size=tick.batch_size,
                         gain=logged.get("date/gain"), loss=logged.get("loss"),
                         lr=logged.get("learning_rate"))

  def _check_evaluate_save(self, tick: _Tick) -> None:
    """Never evaluates or saves a non-finite or diverged state."""
    saves = tick.saves
    if tick.logs or tick.evaluates or saves or self.watch.due:
      with self.clock.paused(self.state):
        self.watch.check(int(parallel.to_host(self.state.step)))
        healthy = _engine_healthy(self.state, self.metrics, self.checkpointer,  # raises if it gave up
                                  config=self.exp.recipe.engine_config)
        saves = saves and healthy
    if not (tick.evaluates or saves):
      return
    with self.clock.paused(self.state):  # eval and checkpoints are not step time
      if tick.evaluates:
        self.eval_metrics, self.evaluated_at = self.evaluate(), tick.step
        self._write_eval(tick.step)
      if saves:
        self.checkpointer.save(tick.step, self.state)
        self.writer.flush()  # a bucket's metrics.jsonl then holds every row up to the save
        self.engine_log.flush()

  def _enter_final_epochs(self, tick: _Tick) -> None:
    """Final Polishing: the final epochs train on evaluation-style data."""
    if self.clean_data or not _final_epochs_due(self.exp, tick.step, tick.progress):
      return
    self.clean_data = True
    with self.clock.paused(self.state):
      self.watch.check(int(parallel.to_host(self.state.step)))
      self.before_polish = (self.eval_metrics if self.evaluated_at == tick.step
                            else self.evaluate())
      self.writer.write(tick.step, {f"eval/before_polish_{k}": v
                                    for k, v in self.before_polish.items()})
    self.feed.switch_to_clean()

  def evaluate(self) -> dict[str, float]:
    return evaluate(self.exp, self.state, self.eval_fn)

  def finish(self) -> int:
    """Ends the run: health at the end, the last evaluation, precise BN; the steps taken.

    Raises:
      NonFiniteError, DivergedError: the run never reports "finished" unhealthy.
    """
    jax.block_until_ready(self.state)
    self.progress.close()
    self.watch.finish()  # never "finished" at the guard's LR floor
    _engine_healthy(self.state, self.metrics, self.checkpointer, at_end=True,  # nor diverged
                    config=self.exp.recipe.engine_config)
    steps_taken = int(parallel.to_host(self.state.step))
    if self.evaluated_at is None or steps_taken > self.evaluated_at:
      self.eval_metrics = self.evaluate()
      self._write_eval(steps_taken)
    self._polish_at_end(steps_taken)
    return steps_taken

  def _write_eval(self, step: int) -> None:
    """The eval metrics, with the data seen so far: curves against examples or tokens."""
    seen = data_seen(self.exp.dataset, int(parallel.to_host(self.state.examples_seen)))
    self.writer.write(step, {f"eval/{k}": v for k, v in (self.eval_metrics | seen).items()})

  def _polish_at_end(self, step: int) -> None:
    """Precise BN when asked for; the final metrics with those before polishing.

    `before_polish` is the evaluation where the final epochs began (None
    without them, or when this process resumed inside them: metrics.jsonl has it).
    """
    settings, before = self.exp.polish, self.before_polish
    if settings["mode"] == "none":
      return
    after = self.eval_metrics
    if polish.uses_precise_bn(settings["mode"]):
      if before is None and not polish.uses_final_epochs(settings["mode"]):
        before = after  # precise BN alone: "before" is the model as trained
        self.writer.write(step, {f"eval/before_polish_{k}": v for k, v in before.items()})
      batches = polish.statistics_batches(
          self.exp.dataset, self.exp.microbatch_size, settings["batches"],
          seed=self.exp.config.seed, bn_data=settings["bn_data"])
      self.state = polish.polish_batch_stats(self.exp.model, self.state, batches,
                                             mesh=self.exp.mesh)
      after = self.evaluate()
    self.writer.write(step, {f"eval/polished_{k}": v for k, v in after.items()})
    self.eval_metrics = after | {f"before_polish_{k}": v for k, v in (before or {}).items()}

  def compilations(self) -> int:
    """Programs `jax.jit` compiled for the train step: one per batch (and measure flag)."""
    cache_size = getattr(self.step_fn, "_cache_size", None)  # jax's jit wrapper; -1 if it goes
    return int(cache_size()) if cache_size is not None else -1


def data_seen(dataset, examples: int, examples_per_second: float | None = None
              ) -> dict[str, float]:
  """`examples_seen`, and for a text workload `tokens_seen` (and `tokens_per_second`).

  Example:
    >>> data_seen(exp.dataset, 64, 640.0)   # a language model with 128-token windows
    {'examples_seen': 64, 'tokens_seen': 8192, 'tokens_per_second': 81920.0}
  """
  seen = {"examples_seen": examples}
  tokens = dataset.tokens_per_example
  if tokens is not None:
    seen["tokens_seen"] = examples * tokens
    if examples_per_second is not None:
      seen["tokens_per_second"] = examples_per_second * tokens
  return seen


def _compile_train_step(exp: Experiment, tx):
  config, replicated = exp.config, parallel.replicated(exp.mesh)
  return jax.jit(
      functools.partial(train_step, model=exp.model, tx=tx,
                        num_classes=exp.dataset.num_classes, seed=config.seed,
                        label_smoothing=exp.recipe.label_smoothing,
                        grad_groups=exp.layout.grad_groups, recipe=exp.recipe,
                        grad_accum_steps=config.grad_accum_steps),
      # Whether a step measures the noise is a Python bool: two programs, no traced
      # branch around the forward and backward passes (see `steps._gradients`).
      static_argnames="measure_noise", out_shardings=(replicated, replicated), donate_argnums=0)


def _progress(exp: Experiment, state: TrainState) -> float | None:
  """The adaptive strategy's progress in baseline steps (None for a static recipe)."""
  if not exp.recipe.adaptive:
    return None
  return float(parallel.to_host(optax.tree.get(state.opt_state, "progress")))


def _ended(exp: Experiment, steps_taken: int, progress: float | None) -> bool:
  """Whether a state with these steps (and progress) has ended the run: a static recipe
  at its last step, an adaptive one once its progress covers the baseline's steps."""
  if exp.recipe.adaptive:
    return progress is not None and progress >= exp.recipe.total_steps
  return steps_taken >= exp.num_train_steps


def _final_epochs_due(exp: Experiment, steps_taken: int, progress: float | None) -> bool:
  """Whether the next step is inside Final Polishing's final epochs.

  A static recipe knows its last step; an adaptive one ends when its progress
  covers the baseline's steps, so it enters the window when its progress
  (read at logged steps) does.
  """
  if not exp.final_epochs_steps:
    return False
  if exp.recipe.adaptive:
    return progress is not None and progress >= exp.recipe.total_steps - exp.final_epochs_steps
  return steps_taken >= exp.num_train_steps - exp.final_epochs_steps


def _engine_healthy(state: TrainState, metrics, checkpointer: Checkpointer | None,
                    at_end: bool = False, *, config: date.EngineConfig) -> bool:
  """False while an adaptive engine calls the run diverged (no checkpoint then).

  Raises:
    DivergedError: the engine gave up, or the run ended diverged (`at_end`);
      the newest checkpoint is the last healthy one.
  """
  health = EngineHealth.read(state.opt_state, config)
  if health is None:
    return True
  health.raise_if_gave_up(learning_rate_of(metrics),
                          checkpointer and str(checkpointer.directory),
                          checkpointer and health.last_healthy(checkpointer.all_steps()),
                          at_end=at_end)
  return not health.diverged


def _engine_batch(exp: Experiment, opt_state: Any) -> Any:
  """The batch the next step takes: a growing engine's choice, else the recipe's."""
  return date.next_batch_size(opt_state) if exp.grows else exp.recipe.batch_size


def _stop_and_save(stops: preemption.StopRequests, state: TrainState,
                   checkpointer: Checkpointer | None) -> preemption.Preempted:
  """Saves the step just taken (unless saved already, or diverged); the exception that
  ends the run. A diverged state is never saved: three stops while diverged would
  otherwise rotate every healthy checkpoint out (`keep_checkpoints`)."""
  taken = int(parallel.to_host(state.step))
  directory = str(checkpointer.directory) if checkpointer is not None else None
  health = EngineHealth.read(state.opt_state)
  if health is not None and health.diverged:
    healthy = checkpointer and health.last_healthy(checkpointer.all_steps())
    return preemption.Preempted(stops.received, taken, directory,
                                diverged_since=health.diverged_at + 1, healthy_step=healthy)
  if checkpointer is not None and checkpointer.latest_step() != taken:
    checkpointer.save(taken, state)
  return preemption.Preempted(stops.received, taken, directory)
