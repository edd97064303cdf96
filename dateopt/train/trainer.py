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
import functools
import json
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils

from dateopt import data as data_lib
from dateopt import date
from dateopt import masks
from dateopt import models
from dateopt.validation import check_range
from dateopt.train import config as config_lib
from dateopt.train import accumulation, parallel, polish, preemption, workdir_lock, workdirs
from dateopt.train import nonfinite, recipe_record
from dateopt.train.checkpoint import Checkpointer, NoUsableCheckpointError
from dateopt.train.diverged import EngineHealth, learning_rate_of
from dateopt.train.feed import TrainFeed
from dateopt.train.metrics import MetricWriter, ProgressBar, StepClock
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
  examples: int = 0  # training examples the steps took
  largest_batch_size: int = 0
  train_step_compilations: int = 0  # programs compiled for the train step (one per rung)


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
  # Final Polishing: `config.polish` with its defaults filled in, and the window of
  # the last steps on evaluation-style data (in baseline steps of progress for the
  # adaptive strategy; 0 without final epochs).
  polish: dict[str, Any] = dataclasses.field(default_factory=dict)
  final_epochs_steps: int = 0
  # The batches a run trains at: (recipe.batch_size,), or a growing recipe's ladder.
  batch_sizes: tuple[int, ...] = ()

  @property
  def grows(self) -> bool:
    """Whether the batch grows (DATE adaptive with `grow_batch`)."""
    return self.recipe.grow_batch

  @property
  def microbatch_size(self) -> int:
    """The examples one forward pass sees (the batch over `config.grad_accum_steps`)."""
    return self.recipe.batch_size // self.config.grad_accum_steps


def _check_divisible(field: str, batch_size: int, divisor: int, what: str) -> None:
  if batch_size % divisor:
    raise ValueError(f"{field}={batch_size} must be divisible by {what} ({divisor}).")


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
  config_lib.check_is_config_dict(config)
  config_lib.check_known_keys(config)
  config_lib.check_optional_ints(config)
  config_lib.check_loop_fields(config)
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
  batch_sizes = _batch_sizes(config, recipe, mesh, batch_field)
  for batch_size in batch_sizes:
    _check_batch_layout(config, batch_field, batch_size, mesh.size)
  if not recipe.drop_remainder:
    raise ValueError("config.baseline.drop_remainder=False is not supported by the trainer: "
                     "its data pipeline drops the last partial batch of each epoch.")
  if recipe.adaptive and gradient_groups(config) < 2:
    raise ValueError(f"config.strategy='adaptive' measures the gradient noise scale over "
                     f"gradient groups: set config.grad_groups >= 2 (got {config.grad_groups}).")
  microbatch_size = recipe.batch_size // config.grad_accum_steps
  # What fits in memory for training fits for eval (a forward pass only).
  eval_batch_size = int(config.eval_batch_size or microbatch_size)
  eval_field = "config.eval_batch_size" if config.eval_batch_size else batch_field
  _check_divisible(eval_field, eval_batch_size, mesh.size, "the device count")
  num_steps = recipe.max_steps if config.num_train_steps < 0 else int(config.num_train_steps)
  if num_steps > recipe.max_steps:  # its LR is 0 past the end: steps that change nothing
    raise ValueError(f"config.num_train_steps={num_steps} is past the end of the recipe "
                     f"({recipe.max_steps} steps, where its LR reaches its end): use -1 for the "
                     f"recipe's length, at most {recipe.max_steps}, or more "
                     f"config.baseline.num_epochs.")
  settings = config_lib.sub_config_with_defaults(config, "polish")
  polish.check_polish_config(settings)
  return Experiment(config, dataset, model, baseline, recipe, mesh, num_steps, eval_batch_size,
                    polish=settings,
                    final_epochs_steps=_final_epochs_steps(settings, baseline, recipe, num_steps),
                    batch_sizes=batch_sizes)


def _check_batch_layout(config: ml_collections.ConfigDict, batch_field: str, batch_size: int,
                        num_devices: int) -> None:
  """Raises ValueError naming `batch_field` when the step cannot run at `batch_size`."""
  _check_divisible(batch_field, batch_size, num_devices, "the device count")
  _check_divisible(batch_field, batch_size, jax.process_count(), "the process count")
  accumulation.check_grad_accum_steps(
      config.grad_accum_steps, batch_field=batch_field, batch_size=batch_size,
      num_devices=num_devices, grad_groups=gradient_groups(config),
      bn_group_size=config_lib.to_dict(config.model_kwargs).get("bn_group_size"))
  if gradient_groups(config) > 1:
    _check_divisible(batch_field, batch_size, config.grad_groups, "config.grad_groups")
    # Batch norm sees one micro-batch's part of a group at a time.
    _check_groups_keep_batch_norm(
        config, batch_size // config.grad_accum_steps // config.grad_groups)


def batch_quantum(config: ml_collections.ConfigDict, num_devices: int) -> int:
  """The smallest batch step every batch must be a multiple of, on this layout.

  Devices and processes split the batch, each of the `grad_accum_steps`
  micro-batches is split over the devices and holds an equal part of every
  gradient group, and a ghost batch-norm group must fit whole in each.
  """
  accum, groups = config.grad_accum_steps, max(gradient_groups(config), 1)
  quantum = math.lcm(num_devices, jax.process_count(), accum * num_devices, accum * groups)
  bn_group = config_lib.to_dict(config.model_kwargs).get("bn_group_size")
  if bn_group and config.model.startswith("resnet"):
    quantum = math.lcm(quantum, accum * groups * int(bn_group))
  return quantum


def _batch_sizes(config: ml_collections.ConfigDict, recipe: date.Recipe, mesh,
                 batch_field: str) -> tuple[int, ...]:
  """The batches the run trains at: the recipe's, or the ladder of a growing batch.

  The ladder starts at the baseline's batch rounded up to `batch_quantum`
  and doubles up to `recipe.batch_size`, the largest.
  """
  if not recipe.grow_batch:
    return (recipe.batch_size,)
  if not isinstance(config.grad_accum_steps, int) or config.grad_accum_steps < 1:
    return (recipe.batch_size,)  # the layout check names config.grad_accum_steps
  quantum = batch_quantum(config, mesh.size)
  if recipe.batch_size % quantum:
    raise ValueError(f"{batch_field}={recipe.batch_size}, the growing batch's largest, must be "
                     f"a multiple of {quantum} (devices x grad_accum_steps x grad_groups and "
                     f"the batch-norm group, as each rung of the ladder is).")
  ladder = date.batch_ladder(recipe.base_batch_size, recipe.batch_size, multiple_of=quantum)
  if recipe.max_steps * ladder[-1] >= 2 ** 31:  # TrainState.examples_seen is an int32
    raise ValueError(f"{batch_field}={recipe.batch_size}: a growing run of up to "
                     f"{recipe.max_steps} steps could serve 2^31 examples or more, past the "
                     f"data position's int32; use a shorter run or a fixed batch.")
  return ladder


def _final_epochs_steps(settings: dict[str, Any], baseline: date.Recipe, recipe: date.Recipe,
                        num_steps: int) -> int:
  """`polish.polish_window` for this run: adaptive runs count it in baseline steps."""
  if recipe.adaptive:
    return polish.polish_window(settings, baseline.steps_per_epoch, recipe.total_steps)
  return polish.polish_window(settings, recipe.steps_per_epoch, num_steps)


def build_optimizer(config: ml_collections.ConfigDict, recipe: date.Recipe,
                    batch_sizes: Sequence[int] | None = None):
  """DATE's optimizer for the recipe, with noise scale, statistics and guard as configured.

  `batch_sizes`: a growing recipe's ladder (`Experiment.batch_sizes`).
  """
  # The noise EMAs keep a ~100-step horizon however often the noise is measured.
  noise_decay = 0.99 ** config.measure_every_steps
  check_range("config.divergence_patience", config.divergence_patience, low=0)
  tx, schedule = date.build(recipe, noise_decay=noise_decay, batch_sizes=batch_sizes,
                            divergence_patience=config.divergence_patience or None)
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
  root = workdirs.as_path(workdir)  # local or gs://
  root.mkdir(parents=True, exist_ok=True)
  # config.polish rides along for the record; only "planned" is checked on a restart.
  recipes = {"baseline": exp.baseline.to_dict(), "planned": exp.recipe.to_dict(),
             "run": config_lib.resume_fields(exp.config), "polish": dict(exp.polish)}
  # A start killed mid-write must not leave half a file for the restart to judge.
  workdirs.write_atomically(root / recipe_record.RECIPE_FILE,
                            json.dumps(recipes, indent=2, default=str))
  workdirs.write_atomically(root / "recipe.txt", report + "\n")


def make_eval_fn(exp: Experiment):
  """The jitted `eval_step` for `exp`'s model, as `evaluate` takes it."""
  return jax.jit(functools.partial(eval_step, model=exp.model,
                                   num_classes=exp.dataset.num_classes),
                 out_shardings=parallel.replicated(exp.mesh))


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


def _claim_workdir(workdir: str, lead: bool, exp: Experiment) -> dict[str, Any] | None:
  """`_lock_workdir` on every process, and process 0 checks that a run already in the
  workdir was planned with this recipe and `config.RESUME_FIELDS`, and that starting over loses nothing
  it wrote; all go on, or none does (StartupError)."""
  lock, failure = None, None
  try:
    lock = _lock_workdir(workdir, lead)
    if lead:  # after the lock: a live run's files are not ours to judge
      with _startup(recipe_record.RecipeChangedError, recipe_record.WorkdirHoldsRunError):
        recipe_record.check_unchanged(workdir, exp.recipe,
                                     config_lib.resume_fields(exp.config))
        recipe_record.check_nothing_lost(
            workdir, starts_over=exp.config.checkpoint_every_steps < 0,
            overwrite=exp.config.overwrite)
  except StartupError as error:
    failure = error
  failed = _failed_processes(failure is not None)
  if failure is not None:
    workdir_lock.release(lock)
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
                              str(checkpointer.directory) if checkpointer is not None else None)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       devices: Sequence[jax.Device] | None = None) -> TrainResult:
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
      `config.divergence_patience` steps in a row; nothing was checkpointed
      while it was diverged.
  """
  with preemption.StopRequests() as stops:
    with _startup(ValueError, ImportError):  # before any work: an unknown scheme, no gcsfs
      workdirs.require_packages(workdirs.as_path(workdir))
    with _startup(ValueError, TypeError, FileNotFoundError):
      exp = build_experiment(config, devices)
      tx, _ = build_optimizer(config, exp.recipe, exp.batch_sizes)  # the LR each step applied is read from its state
    lock = _claim_workdir(workdir, jax.process_index() == 0, exp)
    stops.on_exit_now.append(lambda: workdir_lock.release(lock))  # a signal inside a compile
    try:
      return _train(exp, tx, workdir, stops)
    finally:
      workdir_lock.release(lock)


def _progress(exp: Experiment, state: TrainState) -> float | None:
  """The adaptive strategy's progress in baseline steps (None for a static recipe)."""
  if not exp.recipe.adaptive:
    return None
  return float(parallel.to_host(optax.tree.get(state.opt_state, "progress")))


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


def _polish_at_end(exp: Experiment, state: TrainState, eval_fn, writer: MetricWriter, step: int,
                   trained: dict[str, float], before: dict[str, float] | None
                   ) -> tuple[TrainState, dict[str, float]]:
  """Precise BN when asked for; the final metrics with those before polishing.

  `before` is the evaluation where the final epochs began (None without them,
  or when this process resumed inside them: metrics.jsonl has it).
  """
  settings = exp.polish
  if settings["mode"] == "none":
    return state, trained
  after = trained
  if polish.uses_precise_bn(settings["mode"]):
    if before is None and not polish.uses_final_epochs(settings["mode"]):
      before = trained  # precise BN alone: "before" is the model as trained
      writer.write(step, {f"eval/before_polish_{k}": v for k, v in before.items()})
    batches = polish.statistics_batches(exp.dataset, exp.microbatch_size, settings["batches"],
                                        seed=exp.config.seed, bn_data=settings["bn_data"])
    state = polish.polish_batch_stats(exp.model, state, batches, exp.mesh)
    after = evaluate(exp, state, eval_fn)
  writer.write(step, {f"eval/polished_{k}": v for k, v in after.items()})
  return state, after | {f"before_polish_{k}": v for k, v in (before or {}).items()}


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
  if polish.uses_precise_bn(exp.polish["mode"]) and not state.batch_stats:
    raise StartupError(f"config.polish.mode={exp.polish['mode']!r} re-estimates batch-norm "
                       f"statistics, but config.model={config.model!r} has no batch norm: use "
                       "'none' or 'final_epochs'.")
  with contextlib.ExitStack() as cleanup:  # closed however the run ends: saves finish, rows flush
    checkpointer = None
    if config.checkpoint_every_steps >= 0:
      checkpointer = Checkpointer(workdirs.as_path(workdir) / "checkpoints",
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
                          grad_groups=gradient_groups(config), recipe=exp.recipe,
                          grad_accum_steps=config.grad_accum_steps),
        # Whether a step measures the noise is a Python bool: two programs, no traced
        # branch around the forward and backward passes (see `steps._gradients`).
        static_argnums=3, out_shardings=(replicated, replicated), donate_argnums=0)
    eval_fn = make_eval_fn(exp)

    writer = MetricWriter(workdir, enabled=lead, start_step=start_step)
    cleanup.callback(writer.close)
    if start_step == 0:
      writer.write_text("recipe", report)
    steps_per_epoch = exp.dataset.steps_per_epoch(exp.recipe.batch_size)
    eval_every = steps_per_epoch if config.eval_every_steps < 0 else config.eval_every_steps
    last = exp.num_train_steps
    start_progress = _progress(exp, state)
    progress = (ProgressBar(exp.recipe.total_steps, start_progress or 0.0,
                            unit="baseline step", enabled=lead and config.progress_bar)
                if exp.recipe.adaptive else
                ProgressBar(last, start_step, enabled=lead and config.progress_bar))
    cleanup.callback(progress.close)
    clean_data = _final_epochs_due(exp, start_step, start_progress)
    host_state = parallel.to_host({"examples": state.examples_seen, "last": state.last_batch_size,
                                   "batch": _engine_batch(exp, state.opt_state)})
    feed = TrainFeed(exp.dataset, seed=config.seed, batch_size=int(host_state["batch"]),
                     grows=exp.grows, start_step=start_step,
                     position=int(host_state["examples"]), clean=clean_data)
    cleanup.callback(feed.close)  # the pipeline in use when the run ends
    # The metrics say the batch of every step: a row where it changes (a resume knows the last).
    largest_batch, logged_batch = feed.batch_size, int(host_state["last"])
    before_polish = None
    measures = gradient_groups(config) > 1 and config.measure_every_steps > 1
    clock = StepClock(exp.recipe.batch_size)
    watch = nonfinite.NonFiniteWatch(
        nonfinite.guard_nonfinite_count(state.opt_state), warn=lead,
        lr_floor=config_lib.to_dict(config.guard_kwargs).get(
            "min_multiplier", date.DEFAULT_MIN_MULTIPLIER))
    train_metrics, eval_metrics, evaluated_at, metrics = {}, {}, None, {}
    step = start_step
    for step in range(start_step + 1, last + 1):
      logs_now = _every(step, config.log_every_steps, last)
      record = np.bool_(logs_now) if config.statistics else None  # stats only when logged
      measure = step % config.measure_every_steps == 0 if measures else None
      step_batch = feed.batch_size
      state, metrics = step_fn(state, parallel.global_batch(feed.next(), exp.mesh), record,
                               measure)
      stops.stepping()  # a signal now waits for this step and saves it
      clock.count_step(step_batch)
      watch.record(step, metrics)
      done, progress_now, wanted_batch = False, None, step_batch
      if step_batch != logged_batch:  # the batch of every step: a row at each change
        writer.write(step, {"train/batch_size": step_batch})
        logged_batch = step_batch
      if exp.grows:  # the engine says every step what the next one takes, and when it is done
        reading = parallel.to_host({k: metrics[k] for k in ("date/progress", "date/batch_size")})
        progress_now, wanted_batch = float(reading["date/progress"]), int(reading["date/batch_size"])
        done = progress_now >= exp.recipe.total_steps
        logs_now = logs_now or done
      elif not clean_data and exp.final_epochs_steps and exp.recipe.adaptive and not logs_now:
        # The window is entered at the step its progress crosses: read it every step until then.
        progress_now = float(parallel.to_host(metrics["date/progress"]))
      evaluates = _every(step, eval_every, last)
      saves = checkpointer is not None and _every(step, config.checkpoint_every_steps, last)
      idle = False
      if exp.recipe.adaptive and not exp.grows and (logs_now or evaluates or saves):
        # Read the end where the loop waits for the step anyway: the steps after the one that
        # covered the baseline's steps are idle, and nothing is logged, evaluated or saved
        # past it.
        progress_now = float(parallel.to_host(metrics["date/progress"]))
        if progress_now >= exp.recipe.total_steps:
          done, taken = True, int(parallel.to_host(state.step))
          idle, step = taken != step, taken
      if logs_now and not idle:
        logged = parallel.to_host(metrics)  # waits for the step: the clock reads true time
        logged.update(clock.lap(), batch_size=step_batch, examples_seen=feed.position)
        progress_now = logged.get("date/progress")
        train_metrics = logged
        with clock.paused():
          writer.write(step, {f"train/{k}": v for k, v in train_metrics.items()})
          progress.update(0, loss=train_metrics["loss"],
                          lr=train_metrics.get("learning_rate", 0.0))
      if exp.recipe.adaptive:  # the bar counts the baseline steps covered
        if progress_now is not None:
          progress.advance_to(progress_now)
      else:
        progress.update(1)
      evaluates, saves = evaluates or done, saves or (done and checkpointer is not None)
      if logs_now or evaluates or saves or watch.due:  # never evaluate or save a non-finite state
        with clock.paused(state):
          watch.check(int(parallel.to_host(state.step)))
          healthy = _engine_healthy(state, metrics, checkpointer)  # raises if it gave up
          saves = saves and healthy
      if evaluates or saves:
        with clock.paused(state):  # eval and checkpoints are not step time
          if evaluates:
            eval_metrics, evaluated_at = evaluate(exp, state, eval_fn), step
            writer.write(step, {f"eval/{k}": v for k, v in eval_metrics.items()})
          if saves:
            checkpointer.save(step, state)
            writer.flush()  # a bucket's metrics.jsonl then holds every row up to the save
      if done:  # the adaptive run has covered the baseline's steps
        break
      if not clean_data and _final_epochs_due(exp, step, progress_now):
        clean_data = True  # Final Polishing: the final epochs on evaluation-style data
        with clock.paused(state):
          watch.check(int(parallel.to_host(state.step)))
          before_polish = (eval_metrics if evaluated_at == step
                           else evaluate(exp, state, eval_fn))
          writer.write(step, {f"eval/before_polish_{k}": v for k, v in before_polish.items()})
        feed.switch_to_clean()
      if wanted_batch != feed.batch_size and not done:  # DATE's next rung
        feed.resize(wanted_batch)
        largest_batch = max(largest_batch, wanted_batch)
      if step < last and stops.should_stop(step, shares=logs_now):
        watch.check(int(parallel.to_host(state.step)))
        raise _stop_and_save(stops, state, checkpointer)  # the cleanup waits for the save
    jax.block_until_ready(state)
    progress.close()
    watch.finish()  # never "finished" at the guard's LR floor
    _engine_healthy(state, metrics, checkpointer, at_end=True)  # never "finished" diverged
    steps_taken = int(parallel.to_host(state.step))
    if evaluated_at is None or steps_taken > evaluated_at:
      eval_metrics = evaluate(exp, state, eval_fn)
      writer.write(steps_taken, {f"eval/{k}": v for k, v in eval_metrics.items()})

    state, eval_metrics = _polish_at_end(exp, state, eval_fn, writer, steps_taken, eval_metrics,
                                         before_polish)
    predicted = date.plan_predicted_steps(exp.recipe,
                                          config_lib.to_dict(config.plan).get("noise_scale"))
    examples = int(parallel.to_host(state.examples_seen))
    compilations = _compilations(step_fn)
    summary = {"steps": steps_taken, "examples": examples,
               "examples_vs_baseline": examples / (exp.baseline.total_steps
                                                   * exp.baseline.batch_size),
               "largest_batch_size": largest_batch, "train_step_compilations": compilations,
               "predicted_steps": predicted if predicted is not None else float("nan"),
               "steps_per_second": clock.steps_per_second()}
    writer.write(steps_taken, {f"run/{k}": v for k, v in summary.items()})
    if lead and exp.grows:
      print(f"DATE grew the batch to {largest_batch:,} (ladder {list(exp.batch_sizes)}): "
            f"{steps_taken:,} steps, {examples:,} examples = "
            f"{summary['examples_vs_baseline']:.2f} x the baseline's, {compilations} train-step "
            f"compilations.", flush=True)
  return TrainResult(exp.baseline, exp.recipe, parallel.to_host(state), eval_metrics,
                     train_metrics, clock.steps_per_second(), steps_taken, predicted,
                     examples, largest_batch, compilations)


def _engine_healthy(state: TrainState, metrics, checkpointer: Checkpointer | None,
                    at_end: bool = False) -> bool:
  """False while an adaptive engine calls the run diverged (no checkpoint then).

  Raises:
    DivergedError: the engine gave up, or the run ended diverged (`at_end`);
      the newest checkpoint is the last healthy one.
  """
  health = EngineHealth.read(state.opt_state)
  if health is None:
    return True
  health.raise_if_gave_up(learning_rate_of(metrics),
                          checkpointer and str(checkpointer.directory),
                          checkpointer and checkpointer.latest_step(), at_end=at_end)
  return not health.diverged


def _engine_batch(exp: Experiment, opt_state: Any) -> Any:
  """The batch the next step takes: a growing engine's choice, else the recipe's."""
  return date.next_batch_size(opt_state) if exp.grows else exp.recipe.batch_size


def _compilations(step_fn) -> int:
  """Programs `jax.jit` compiled for the train step: one per batch (and measure flag)."""
  cache_size = getattr(step_fn, "_cache_size", None)  # jax's jit wrapper; -1 if it goes
  return int(cache_size()) if cache_size is not None else -1
