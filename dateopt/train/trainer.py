"""`train_and_evaluate`: DATE-planned, data-parallel training from one config.

The config names a dataset, a model, a tuned baseline recipe and a target
batch size. DATE plans the large-batch recipe (printed and saved as
`recipe.json`), builds its optimizer wrapped in the statistics tracker and the
divergence guard, and the train step runs under `jax.jit` over a mesh of every
device of every process. Checkpoints make a restarted run resume exactly: the
data order and dropout keys are pure functions of (seed, step). A run survives
what a cluster does to it: SIGTERM or SIGINT ends it after a checkpointed step
(`Preempted`), a damaged checkpoint is skipped for an older one, and a
workdir is held by one live run at a time (`workdir/run.lock`).

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
import functools
import json
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from dateopt import data as data_lib
from dateopt import date
from dateopt import masks
from dateopt import models
from dateopt.train import config as config_lib
from dateopt.train import parallel, preemption, workdir_lock
from dateopt.train.checkpoint import Checkpointer, NoUsableCheckpointError
from dateopt.train.metrics import MetricWriter, ProgressBar, StepClock
from dateopt.train.polish import polish_batch_stats
from dateopt.train.steps import TrainState, create_train_state, eval_step, train_step


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


@dataclasses.dataclass
class Experiment:
  """Everything built from a config before anything compiles."""

  config: ml_collections.ConfigDict
  dataset: data_lib.Dataset
  model: Any
  baseline: date.Recipe
  recipe: date.Recipe
  mesh: jax.sharding.Mesh
  num_train_steps: int
  eval_batch_size: int


def _check_divisible(field: str, batch_size: int, divisor: int, what: str) -> None:
  if batch_size % divisor:
    raise ValueError(f"{field}={batch_size} must be divisible by {what} ({divisor}).")


def _check_keep_checkpoints(keep: Any) -> None:
  # Orbax reads 0 as "keep none": every checkpoint would be deleted as soon as written.
  if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
    raise ValueError(f"config.keep_checkpoints must be an int >= 1 (the newest checkpoints "
                     f"kept); got {keep!r}.")


def gradient_groups(config: ml_collections.ConfigDict) -> int:
  """Groups the gradient is taken over for the noise scale (0: a plain gradient).

  The adaptive strategy needs the noise scale; otherwise it is measured only
  with the statistics on.
  """
  wanted = config.statistics or config.strategy == "adaptive"
  return config.grad_groups if wanted and config.grad_groups > 1 else 0


def _check_groups_keep_batch_norm(config: ml_collections.ConfigDict, group_size: int) -> None:
  """Grouped gradients normalise each group alone: only ghost BN keeps its meaning."""
  if not config.model.startswith("resnet"):
    return
  bn_group = config_lib.to_dict(config.model_kwargs).get("bn_group_size")
  if bn_group is None or group_size % bn_group:
    raise ValueError(
        f"config.grad_groups={config.grad_groups} would compute batch norm over groups of "
        f"{group_size} examples instead of the batch: set config.grad_groups=0 (no noise "
        f"scale), or config.model_kwargs.bn_group_size to a divisor of {group_size}.")


def plan_recipe(config: ml_collections.ConfigDict, num_examples: int
                ) -> tuple[date.Recipe, date.Recipe]:
  """The baseline recipe from the config and DATE's plan for `config.batch_size`."""
  baseline_fields = {"num_examples": num_examples, **config_lib.to_dict(config.baseline)}
  try:
    baseline = date.Recipe.from_dict(baseline_fields)
  except ValueError as error:
    raise ValueError(f"config.baseline: {error}") from error
  if config.batch_size is None:
    return baseline, baseline
  try:
    planned = date.plan(baseline, int(config.batch_size), config.strategy,
                        **config_lib.to_dict(config.plan))
  except TypeError as error:  # an unknown keyword in config.plan
    raise ValueError(f"config.plan: {error}") from error
  return baseline, planned


@contextlib.contextmanager
def _config_field(field: str):
  """A registry's TypeError for an unknown keyword, re-raised naming the config field."""
  try:
    yield
  except TypeError as error:
    raise ValueError(f"{field}: {error}") from error


def build_experiment(config: ml_collections.ConfigDict,
                     devices: Sequence[jax.Device] | None = None) -> Experiment:
  """Validates the config and builds data, model, recipes and mesh (no compilation).

  Raises:
    ValueError: naming the config field at fault (unknown key, model or
      dataset; a batch not divisible by the device count or gradient groups).
    FileNotFoundError: the dataset's files are missing.
  """
  config_lib.check_known_keys(config)
  with _config_field("config.dataset_kwargs"):
    dataset = data_lib.get_dataset(config.dataset, data_dir=config.data_dir,
                                   **config_lib.to_dict(config.dataset_kwargs))
  with _config_field("config.model_kwargs"):
    model = models.create_model(config.model, num_classes=dataset.num_classes,
                                dtype=config.compute_dtype,
                                **config_lib.to_dict(config.model_kwargs))
  baseline, recipe = plan_recipe(config, dataset.num_train_examples)
  mesh = parallel.make_mesh(devices)
  batch_field = "config.batch_size" if config.batch_size is not None else "config.baseline.batch_size"
  _check_divisible(batch_field, recipe.batch_size, mesh.size, "the device count")
  _check_divisible(batch_field, recipe.batch_size, jax.process_count(), "the process count")
  if not recipe.drop_remainder:
    raise ValueError("config.baseline.drop_remainder=False is not supported by the trainer: "
                     "its data pipeline drops the last partial batch of each epoch.")
  if recipe.adaptive and gradient_groups(config) < 2:
    raise ValueError(f"config.strategy='adaptive' measures the gradient noise scale over "
                     f"gradient groups: set config.grad_groups >= 2 (got {config.grad_groups}).")
  if config.measure_every_steps < 1:
    raise ValueError(f"config.measure_every_steps must be >= 1; got {config.measure_every_steps}.")
  _check_keep_checkpoints(config.keep_checkpoints)
  if gradient_groups(config) > 1:
    _check_divisible(batch_field, recipe.batch_size, config.grad_groups, "config.grad_groups")
    _check_groups_keep_batch_norm(config, recipe.batch_size // config.grad_groups)
  eval_batch_size = int(config.eval_batch_size or recipe.batch_size)
  eval_field = "config.eval_batch_size" if config.eval_batch_size else batch_field
  _check_divisible(eval_field, eval_batch_size, mesh.size, "the device count")
  num_steps = recipe.max_steps if config.num_train_steps < 0 else int(config.num_train_steps)
  return Experiment(config, dataset, model, baseline, recipe, mesh, num_steps, eval_batch_size)


def build_optimizer(config: ml_collections.ConfigDict, recipe: date.Recipe):
  """DATE's optimizer for the recipe, with noise scale, statistics and guard as configured."""
  # The noise EMAs keep a ~100-step horizon however often the noise is measured.
  noise_decay = 0.99 ** config.measure_every_steps
  tx, schedule = date.build(recipe, noise_decay=noise_decay)
  if not recipe.adaptive and gradient_groups(config) > 1:  # adaptive keeps its own EMAs
    tx = date.measure_noise_scale(tx, noise_decay=noise_decay)
  if config.guard:
    try:
      tx = date.divergence_guard(tx, **config_lib.to_dict(config.guard_kwargs))
    except TypeError as error:  # an unknown keyword in config.guard_kwargs
      raise ValueError(f"config.guard_kwargs: {error}") from error
  if config.statistics:  # outside the guard, so skipped steps are recorded too
    tx = date.track_statistics(tx, trust_coefficient=recipe.trust_coefficient,
                               weight_decay=recipe.weight_decay,
                               mask=masks.from_name(recipe.mask))
  return tx, schedule


def _example_inputs(dataset: data_lib.Dataset) -> jax.Array:
  return jnp.zeros((1,) + tuple(dataset.input_shape), dataset.input_dtype)


def _save_recipes(workdir: str, exp: Experiment, report: str) -> None:
  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "recipe.json"), "w", encoding="utf-8") as f:
    json.dump({"baseline": exp.baseline.to_dict(), "planned": exp.recipe.to_dict()}, f,
              indent=2, default=str)
  with open(os.path.join(workdir, "recipe.txt"), "w", encoding="utf-8") as f:
    f.write(report + "\n")


def evaluate(exp: Experiment, state: TrainState, step_fn) -> dict[str, float]:
  """Accuracy and loss over the whole eval split (padding masked out)."""
  totals = None
  for batch in exp.dataset.eval_batches(exp.eval_batch_size, process_index=jax.process_index(),
                                        process_count=jax.process_count()):
    sums = step_fn(state, parallel.global_batch(batch, exp.mesh))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  totals = {k: float(v) for k, v in parallel.to_host(totals).items()}  # one transfer
  count = max(totals["count"], 1.0)
  loss = totals["loss_sum"] / count
  metrics = {"loss": loss, "accuracy": totals["correct_sum"] / count}
  if exp.dataset.task == "language_model":
    metrics["perplexity"] = float(np.exp(min(loss, 50.0)))
  return metrics


def _every(step: int, period: int, last: int) -> bool:
  return step == last or (period > 0 and step % period == 0)


class StartupError(Exception):
  """A run that cannot start, said in one line; `__cause__` keeps the original error.

  Raised for a bad config field, missing dataset files, a workdir that cannot
  be written or that another live run holds, and checkpoints none of which loads.
  """


@contextlib.contextmanager
def _startup(*errors: type[Exception]):
  """Re-raises `errors` as a StartupError with the same message."""
  try:
    yield
  except errors as error:
    raise StartupError(str(error)) from error


def _lock_workdir(workdir: str, lead: bool) -> dict[str, Any] | None:
  """Checks that `workdir` can be written; process 0 also takes its lock."""
  try:
    workdir_lock.check_writable(workdir)
  except OSError as error:
    raise StartupError(f"cannot write in the workdir {workdir}: "
                       f"{error.strerror or error}.") from error
  if not lead:
    return None
  with _startup(workdir_lock.WorkdirInUseError):
    return workdir_lock.acquire(workdir)


def _claim_workdir(workdir: str, lead: bool) -> dict[str, Any] | None:
  """`_lock_workdir` on every process; all go on, or none does (StartupError)."""
  lock, failure = None, None
  try:
    lock = _lock_workdir(workdir, lead)
  except StartupError as error:
    failure = error
  failed = _failed_processes(failure is not None)
  if failure is not None:
    raise failure
  if failed:  # a process starting alone would wait for the others forever
    workdir_lock.release(lock)
    raise StartupError(f"process {failed[0]} could not start on the workdir {workdir} "
                       "(its log says why).")
  return lock


def _failed_processes(failed_here: bool) -> list[int]:
  """The indices of the processes that failed; every process must call it."""
  if jax.process_count() == 1:
    return [0] if failed_here else []
  flags = multihost_utils.process_allgather(np.int32(failed_here))
  return [int(i) for i in np.flatnonzero(flags)]


def _stop_and_save(stops: preemption.StopRequests, state: TrainState,
                   checkpointer: Checkpointer | None) -> preemption.Preempted:
  """Saves the step just taken (unless saved already); the exception that ends the run."""
  taken = int(parallel.to_host(state.step))
  if checkpointer is not None and checkpointer.latest_step() != taken:
    checkpointer.save(taken, state)
  return preemption.Preempted(stops.received, taken,
                              checkpointer.directory if checkpointer is not None else None)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       devices: Sequence[jax.Device] | None = None) -> TrainResult:
  """Plans the recipe with DATE, trains it data-parallel, evaluates and checkpoints.

  SIGTERM or SIGINT during the call ends it after the current step, which is
  checkpointed first (with checkpointing on): the same call then resumes.
  The previous signal handlers are back when it returns.

  Args:
    config: a `default_config()`-shaped ConfigDict (see `configs/`).
    workdir: checkpoints, `recipe.json`, `metrics.jsonl` and TensorBoard events;
      a run restarted with the same workdir resumes from its newest checkpoint
      that loads. One live run per workdir (`workdir/run.lock`).
    devices: the mesh's devices (default: every device of every process).

  Returns:
    A `TrainResult` with the recipes, final state (NumPy) and metrics.

  Raises:
    StartupError: the run cannot start (a bad config field, missing data, an
      unwritable or busy workdir, no checkpoint that loads).
    Preempted: a signal stopped the run; the exception says at which step.
  """
  with preemption.StopRequests() as stops:
    with _startup(ValueError, TypeError, FileNotFoundError):
      exp = build_experiment(config, devices)
      tx, _ = build_optimizer(config, exp.recipe)  # the LR each step applied is read from its state
    lock = _claim_workdir(workdir, jax.process_index() == 0)
    try:
      return _train(exp, tx, workdir, stops)
    finally:
      workdir_lock.release(lock)


def _train(exp: Experiment, tx, workdir: str, stops: preemption.StopRequests) -> TrainResult:
  """`train_and_evaluate` once the config is checked and the workdir is ours."""
  config = exp.config
  lead = jax.process_index() == 0
  report = date.explain(exp.baseline, exp.recipe)
  if lead:
    print(f"DATE plan ({exp.baseline.batch_size} -> {exp.recipe.batch_size}, "
          f"strategy {config.strategy!r}, {exp.num_train_steps} steps on {exp.mesh.size} "
          f"devices / {jax.process_count()} processes):\n{report}", flush=True)
  _save_recipes(workdir, exp, report)

  replicated = parallel.replicated(exp.mesh)
  init = jax.jit(functools.partial(create_train_state, exp.model, tx, seed=config.seed),
                 out_shardings=replicated)
  state = init(_example_inputs(exp.dataset))
  with contextlib.ExitStack() as cleanup:  # closed however the run ends: saves finish, rows flush
    checkpointer = None
    if config.checkpoint_every_steps >= 0:
      checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"),
                                  keep=config.keep_checkpoints)
      cleanup.callback(checkpointer.close)
      with _startup(NoUsableCheckpointError):
        state = checkpointer.restore_or(state)
    start_step = int(parallel.to_host(state.step))
    if lead and start_step:
      print(f"Resuming from step {start_step} (checkpoints in {checkpointer.directory}).",
            flush=True)

    step_fn = jax.jit(
        functools.partial(train_step, model=exp.model, tx=tx,
                          num_classes=exp.dataset.num_classes, seed=config.seed,
                          label_smoothing=exp.recipe.label_smoothing,
                          grad_groups=gradient_groups(config), recipe=exp.recipe),
        out_shardings=(replicated, replicated), donate_argnums=0)
    eval_fn = jax.jit(functools.partial(eval_step, model=exp.model,
                                        num_classes=exp.dataset.num_classes),
                      out_shardings=replicated)

    writer = MetricWriter(workdir, enabled=lead, start_step=start_step)
    cleanup.callback(writer.close)
    if start_step == 0:
      writer.write_text("recipe", report)
    steps_per_epoch = exp.dataset.steps_per_epoch(exp.recipe.batch_size)
    eval_every = steps_per_epoch if config.eval_every_steps < 0 else config.eval_every_steps
    last = exp.num_train_steps
    progress = ProgressBar(last, start_step, enabled=lead and config.progress_bar)
    cleanup.callback(progress.close)
    batches = exp.dataset.train_iterator(exp.recipe.batch_size, seed=config.seed,
                                         start_step=start_step,
                                         process_index=jax.process_index(),
                                         process_count=jax.process_count())
    measures = gradient_groups(config) > 1 and config.measure_every_steps > 1
    clock = StepClock(exp.recipe.batch_size)
    train_metrics, eval_metrics, evaluated_at = {}, {}, None
    step = start_step
    for step in range(start_step + 1, last + 1):
      logs_now = _every(step, config.log_every_steps, last)
      record = np.bool_(logs_now) if config.statistics else None  # stats only when logged
      measure = np.bool_(step % config.measure_every_steps == 0) if measures else None
      state, metrics = step_fn(state, parallel.global_batch(next(batches), exp.mesh), record,
                               measure)
      clock.count_step()
      done = False
      if logs_now:
        logged = parallel.to_host(metrics)  # waits for the step: the clock reads true time
        logged.update(clock.lap())
        if exp.recipe.adaptive and logged["date/progress"] >= exp.recipe.total_steps:
          # Covered the baseline's steps at this step, or before it (the steps since are idle).
          done, taken = True, int(parallel.to_host(state.step))
          if taken != step:
            logged, step = None, taken  # an idle step's metrics: nothing to log
        if logged is not None:
          train_metrics = logged
          with clock.paused():
            writer.write(step, {f"train/{k}": v for k, v in train_metrics.items()})
            progress.update(0, loss=train_metrics["loss"],
                            lr=train_metrics.get("learning_rate", 0.0))
      progress.update(1)
      evaluates = done or _every(step, eval_every, last)
      saves = checkpointer is not None and (done or _every(step, config.checkpoint_every_steps,
                                                           last))
      if evaluates or saves:
        with clock.paused(state):  # eval and checkpoints are not step time
          if evaluates:
            eval_metrics, evaluated_at = evaluate(exp, state, eval_fn), step
            writer.write(step, {f"eval/{k}": v for k, v in eval_metrics.items()})
          if saves:
            checkpointer.save(step, state)
      if done:  # the adaptive run has covered the baseline's steps
        break
      if step < last and stops.should_stop(step, shares=logs_now):
        raise _stop_and_save(stops, state, checkpointer)  # the cleanup waits for the save
    jax.block_until_ready(state)
    progress.close()
    steps_taken = int(parallel.to_host(state.step))
    if evaluated_at is None or steps_taken > evaluated_at:
      eval_metrics = evaluate(exp, state, eval_fn)
      writer.write(steps_taken, {f"eval/{k}": v for k, v in eval_metrics.items()})

    if config.polish_batches > 0 and state.batch_stats:
      state = polish_batch_stats(state, exp, config.polish_batches)
      polished = {f"polished_{k}": v for k, v in evaluate(exp, state, eval_fn).items()}
      writer.write(steps_taken, {f"eval/{k}": v for k, v in polished.items()})
      eval_metrics = polished | eval_metrics
    predicted = date.plan_predicted_steps(exp.recipe,
                                          config_lib.to_dict(config.plan).get("noise_scale"))
    summary = {"steps": steps_taken, "examples": steps_taken * exp.recipe.batch_size,
               "predicted_steps": predicted if predicted is not None else float("nan"),
               "steps_per_second": clock.steps_per_second()}
    writer.write(steps_taken, {f"run/{k}": v for k, v in summary.items()})
  return TrainResult(exp.baseline, exp.recipe, parallel.to_host(state), eval_metrics,
                     train_metrics, clock.steps_per_second(), steps_taken, predicted)
