"""`train_and_evaluate`: DATE-planned, data-parallel training from one config.

The config names a dataset, a model, a tuned baseline recipe and a target
batch size. DATE plans the large-batch recipe (printed and saved as
`recipe.json`), builds its optimizer wrapped in the statistics tracker and the
divergence guard, and the train step runs under `jax.jit` over a mesh of every
device of every process. Checkpoints make a restarted run resume exactly: the
data order and dropout keys are pure functions of (seed, step). A run survives
what a cluster does to it: SIGTERM or SIGINT ends it after a checkpointed step
(`Preempted`), a damaged checkpoint is skipped for an older one, and a
workdir is held by one live run at a time (`workdir/run.lock`). The workdir
is a local path or a bucket (`gs://bucket/run`; see `workdirs`).

Example:
  >>> from dateopt import train
  >>> config = train.default_config()            # the MNIST-1D LSTM defaults
  >>> config.baseline = dict(batch_size=32, num_epochs=2, learning_rate=1e-2,
  ...                        optimizer="adam", decay="cosine")
  >>> config.batch_size = 512                    # DATE plans the 16x batch
  >>> result = train.train_and_evaluate(config, "/tmp/run")
  >>> result.eval_metrics["accuracy"]
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Sequence

import jax
import ml_collections

from dateopt import date
from dateopt.train import config as config_lib
from dateopt.train import parallel, preemption, workdir_lock, workdirs
# Looked up here at each call: scripts/divergence_evidence.py wraps it.
from dateopt.train.experiment import Experiment, build_experiment, build_optimizer
from dateopt.train.loop import TrainLoop
from dateopt.train.metrics import Writer, read_metrics
from dateopt.train.startup import claim_workdir, save_recipes, startup
from dateopt.train.steps import TrainState
from dateopt.date import _planner as planner_lib


@dataclasses.dataclass
class TrainResult:
  """What a finished run returns (process-local NumPy copies)."""

  baseline: date.Recipe
  recipe: date.Recipe
  state: TrainState
  eval_metrics: dict[str, float]
  train_metrics: dict[str, float]
  steps_per_second: float
  steps: int = 0
  predicted_steps: int | None = None
  examples: int = 0  # training examples the steps took
  largest_batch_size: int = 0
  train_step_compilations: int = 0  # programs compiled for the train step (one per rung)
  tokens: int | None = None  # a text workload's training tokens (examples x window)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       devices: Sequence[jax.Device] | None = None,
                       metric_writers: Sequence[Writer] = ()) -> TrainResult:
  """Plans the recipe with DATE, trains it data-parallel, evaluates and checkpoints.

  SIGTERM, SIGHUP or SIGINT during the call ends it after the current step,
  which is checkpointed first (with checkpointing on): the same call then
  resumes. Before the first step, with nothing to save, it ends the run at once.
  The previous signal handlers are back when it returns.

  Args:
    config: a `default_config()`-shaped ConfigDict (see `configs/`).
    workdir: checkpoints, `recipe.json`, `metrics.jsonl` and TensorBoard events;
      a local path or a bucket (`gs://bucket/run`, with the `dateopt[gcp]`
      extra). A run restarted with the same workdir resumes from its newest
      checkpoint that loads. One live run per workdir (`workdir/run.lock`;
      best effort in a bucket, see `workdir_lock`).
    devices: the mesh's devices (default: every device of every process).
    metric_writers: writers that get every metric too, after `metrics.jsonl`
      and TensorBoard (anything satisfying `dateopt.train.Writer`: a clu
      `MetricWriter`, a class calling `wandb.log`); process 0 writes to them
      and closes them when the run ends, other processes leave them alone.

  Returns:
    A `TrainResult` with the recipes, final state (NumPy) and metrics.

  Raises:
    StartupError: the run cannot start (a bad config field, missing data, an
      unwritable or busy workdir, a workdir URL without its filesystem package,
      no checkpoint that loads).
    Preempted: a signal stopped the run; the exception says at which step.
    NonFiniteError: a step's loss was non-finite without the divergence guard,
      or the guard skipped `nonfinite.MAX_SKIPPED_IN_A_ROW` steps in a row;
      nothing after the step was checkpointed.
    DivergedError: the adaptive engine judged the run diverged for
      its horizon of stalled steps (`date.EngineConfig`); nothing was checkpointed
      while it was diverged.
  """
  with preemption.StopRequests() as stops:
    with startup(ValueError, ImportError):  # before any work: an unknown scheme, no gcsfs
      workdirs.require_packages(workdirs.as_path(workdir))
    with startup(ValueError, TypeError, FileNotFoundError):
      exp = build_experiment(config, devices)
      # The LR each step applied is read from its state.
      tx, _ = build_optimizer(config, exp.recipe, exp.batch_sizes,
                              batch_schedule=exp.batch_schedule)
    lock = claim_workdir(workdir, jax.process_index() == 0, exp)
    stops.on_exit_now.append(lambda: workdir_lock.release(lock))  # a signal inside a compile
    try:
      return _train(exp, tx, workdir, stops, metric_writers=metric_writers)
    finally:
      workdir_lock.release(lock)


def _train(exp: Experiment, tx, workdir: str, stops: preemption.StopRequests, *,
           metric_writers: Sequence[Writer]) -> TrainResult:
  """`train_and_evaluate` once the config is checked and the workdir is ours."""
  report = date.explain(exp.baseline, exp.recipe)
  if jax.process_index() == 0:
    print(f"DATE plan ({exp.baseline.batch_size} -> {exp.recipe.batch_size}, "
          f"strategy {exp.config.strategy!r}, {exp.num_train_steps} steps on {exp.mesh.size} "
          f"devices / {jax.process_count()} processes):\n{report}", flush=True)
  save_recipes(workdir, exp, report)
  with contextlib.ExitStack() as cleanup:  # closed however the run ends: saves finish, rows flush
    loop = TrainLoop(exp, tx, workdir, report=report, cleanup=cleanup,
                     metric_writers=metric_writers)
    # A rerun of a finished run takes no step (an adaptive run ends before num_train_steps):
    # it reports the final metrics again and writes nothing.
    if not loop.finished_before:
      for step in range(loop.start_step + 1, exp.num_train_steps + 1):
        if loop.run_step(step, stops):
          break
    steps_taken = loop.finish()
    return _summarize(exp, loop, steps_taken, workdir)


def _summarize(exp: Experiment, loop: TrainLoop, steps_taken: int,
               workdir: str) -> TrainResult:
  """The run's summary row in the metrics (and printed for a growing batch); its result."""
  predicted = planner_lib.plan_predicted_steps(exp.recipe,
                                        config_lib.to_dict(exp.config.plan).get("noise_scale"))
  examples = int(parallel.to_host(loop.state.examples_seen))
  compilations = loop.compilations()
  steps_per_second = (_recorded_pace(workdir, steps_taken) if loop.finished_before
                      else loop.clock.steps_per_second())
  summary = {"steps": steps_taken, "examples": examples,
             "examples_vs_baseline": examples / (exp.baseline.total_steps
                                                 * exp.baseline.batch_size),
             "largest_batch_size": loop.largest_batch, "train_step_compilations": compilations,
             "predicted_steps": predicted if predicted is not None else float("nan"),
             "steps_per_second": steps_per_second}
  if exp.dataset.tokens_per_example is not None:  # a text workload counts its data in tokens
    summary["tokens"] = examples * exp.dataset.tokens_per_example
  loop.writer.write(steps_taken, {f"run/{k}": v for k, v in summary.items()})
  if jax.process_index() == 0 and exp.grows:
    who = (f"The {exp.recipe.batch_schedule} schedule" if exp.recipe.scheduled else "DATE")
    print(f"{who} grew the batch to {loop.largest_batch:,} (ladder {list(exp.batch_sizes)}): "
          f"{steps_taken:,} steps, {_data_amount(examples, summary.get('tokens'))} = "
          f"{summary['examples_vs_baseline']:.2f} x the baseline's, {compilations} train-step "
          f"compilations.", flush=True)
  return TrainResult(exp.baseline, exp.recipe, parallel.to_host(loop.state), loop.eval_metrics,
                     loop.train_metrics, steps_per_second, steps_taken, predicted,
                     examples, loop.largest_batch, compilations, summary.get("tokens"))


def _recorded_pace(workdir: str, step: int) -> float:
  """A finished run's steps per second, from its summary row: its rerun times no step."""
  paces = [row["run/steps_per_second"] for row in read_metrics(workdir)
           if row["step"] == step and row.get("run/steps_per_second") is not None]
  return paces[-1] if paces else float("nan")


def _data_amount(examples: int, tokens: int | None) -> str:
  """'N examples', or 'N tokens' for a text workload."""
  return f"{examples:,} examples" if tokens is None else f"{tokens:,} tokens"
