"""The experiment a config describes: data, model, recipes, mesh and batch layout, checked.

`build_experiment` turns a `default_config()`-shaped ConfigDict into an
`Experiment` before anything compiles: it names the config field at fault for
every bad value, plans the large-batch recipe with DATE (`plan_recipe`), and
resolves the batches the run trains at (one, or a growing batch's ladder).
`build_optimizer` wraps DATE's optimizer with the noise scale, statistics and
divergence guard the config asks for.

Example:
  >>> from dateopt import train
  >>> exp = train.build_experiment(train.default_config())
  >>> exp.recipe.batch_size, exp.num_train_steps
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Sequence

import jax
import ml_collections

from dateopt import data as data_lib
from dateopt import date
from dateopt.date._progress import ENGINE_RULES
from dateopt import masks
from dateopt import models
from dateopt.train import parallel, polish, profiling, rungs
from dateopt.train import config as config_lib
from dateopt.train.cadence import Cadence
from dateopt.train.layout import BatchLayout
from dateopt.validation import check_type
from dateopt.date import _batch_schedules as batch_schedules_lib
from dateopt.date import _builder as builder_lib


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
  layout: BatchLayout | None = None  # how each of them splits (devices, micro-batches, groups)
  # A field batch schedule (`recipe.scheduled`), its batches rounded to the layout.
  batch_schedule: date.BatchSchedule | None = None

  @property
  def grows(self) -> bool:
    """Whether the batch grows: DATE adaptive with `grow_batch`, or a field batch schedule."""
    return self.recipe.grow_batch or self.recipe.scheduled

  @property
  def compiles_rungs_ahead(self) -> bool:
    """Whether a growing run compiles its rungs in a background thread (`dateopt.train.rungs`)."""
    return self.grows and self.config.compile_rungs_ahead

  @property
  def cadence(self) -> Cadence:
    """When the loop logs, evaluates and saves (the `config.*_every_steps`, resolved)."""
    config = self.config
    eval_every = (self.dataset.steps_per_epoch(self.recipe.batch_size)
                  if config.eval_every_steps < 0 else config.eval_every_steps)
    return Cadence(last=self.num_train_steps, log_every=config.log_every_steps,
                   eval_every=eval_every, save_every=config.checkpoint_every_steps)

  @property
  def microbatch_size(self) -> int:
    """The examples one forward pass sees (the batch over `config.grad_accum_steps`)."""
    return self.recipe.batch_size // self.config.grad_accum_steps


def gradient_groups(config: ml_collections.ConfigDict) -> int:
  """Groups the gradient is taken over for the noise scale (0: a plain gradient).

  The adaptive strategy needs the noise scale; otherwise it is measured only
  with the statistics on.
  """
  wanted = config.statistics or config.strategy == "adaptive"
  return config.grad_groups if wanted and config.grad_groups > 1 else 0


def plan_recipe(config: ml_collections.ConfigDict, num_examples: int
                ) -> tuple[date.Recipe, date.Recipe]:
  """The baseline recipe from the config and DATE's plan for `config.batch_size`."""
  baseline_fields = {"num_examples": num_examples, **config_lib.to_dict(config.baseline)}
  try:
    baseline = date.Recipe.from_dict(baseline_fields)
  except ValueError as error:
    raise ValueError(f"config.baseline: {error}") from error
  if config.batch_size is None:
    _check_nothing_needs_a_target(config, baseline)
    return baseline, baseline
  try:
    planned = date.plan(baseline, int(config.batch_size), config.strategy,
                        **_plan_kwargs(config))
  except TypeError as error:  # an unknown keyword in config.plan
    raise ValueError(f"config.plan: {error}") from error
  return baseline, planned


def _plan_kwargs(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """`config.plan` as `date.plan`'s keywords; a batch schedule's options may sit in it flat
  (`--config.plan.start_batch=512`: a flag cannot add a nested key) or in `schedule_options`."""
  kwargs = config_lib.to_dict(config.plan)
  flat = {k: kwargs.pop(k) for k in batch_schedules_lib.USER_OPTIONS if k in kwargs}
  if flat:
    kwargs["schedule_options"] = dict(kwargs.get("schedule_options") or {}, **flat)
  return kwargs


def _check_nothing_needs_a_target(config: ml_collections.ConfigDict,
                                  baseline: date.Recipe) -> None:
  """Raises ValueError when `config.batch_size=None` (the baseline as it is) would ignore
  what the config asks for: DATE's adaptive strategy, a growing batch, a batch schedule or a
  budget plan a target batch."""
  plan = config_lib.to_dict(config.plan)
  dynamic = config.strategy == "adaptive" or config.strategy in batch_schedules_lib.BATCH_SCHEDULES
  ignored = ([f"config.strategy={config.strategy!r}"] if dynamic else []) + [
      f"config.plan.{key}={plan[key]!r}" for key in ("grow_batch", "budget", "schedule_options",
                                                      *batch_schedules_lib.USER_OPTIONS)
      if plan.get(key) not in (None, False) and not (key == "budget" and plan[key] == 1)]
  if ignored:
    raise ValueError(
        f"config.batch_size=None trains the baseline as it is, at its batch of "
        f"{baseline.batch_size}, which would ignore {' and '.join(ignored)}: set "
        f"config.batch_size to the target batch (for a growing batch, the largest it grows "
        f"to from {baseline.batch_size}), or leave {'them' if len(ignored) > 1 else 'it'} out "
        f"to train the baseline.")


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
  profiling.parse_profile_steps(config.profile_steps)
  rungs.check_config(config.compile_rungs_ahead)
  with _config_field("config.dataset_kwargs"):
    dataset = data_lib.get_dataset(config.dataset, data_dir=config.data_dir,
                                   **config_lib.to_dict(config.dataset_kwargs))
  model_kwargs = config_lib.to_dict(config.model_kwargs)
  if dataset.input_normalization is not None:  # uint8 images, normalised in the step
    model_kwargs.setdefault("input_normalization", dataset.input_normalization)
  with _config_field("config.model_kwargs"):
    model = models.create_model(config.model, num_classes=dataset.num_classes,
                                dtype=config.compute_dtype, **model_kwargs)
  baseline, recipe = plan_recipe(config, dataset.num_train_examples)
  mesh = parallel.make_mesh(devices)
  batch_field = "config.batch_size" if config.batch_size is not None else "config.baseline.batch_size"
  layout = BatchLayout.from_config(config, mesh.size, gradient_groups(config))
  schedule = _batch_schedule(recipe, layout, batch_field)
  batch_sizes = schedule.batch_sizes if schedule else _batch_sizes(recipe, layout, batch_field)
  recipe = _with_ladder_noted(recipe, batch_sizes, layout)
  if schedule is not None and schedule != builder_lib.batch_schedule_of(recipe):
    recipe = recipe.replace(rationale=dict(recipe.rationale) | {
        "batch schedule": f"{schedule.describe()} (rounded to the batch layout's quantum of "
                          f"{layout.quantum}: {layout.quantum_reason()})"})
  for batch_size in batch_sizes:
    layout.check(batch_field, batch_size)
  if recipe.adaptive and not recipe.scheduled and layout.grad_groups < 2:
    raise ValueError(f"config.strategy='adaptive' measures the gradient noise scale over "
                     f"gradient groups: set config.grad_groups >= 2 (got {config.grad_groups}).")
  microbatch_size = layout.sizes(recipe.batch_size)["per_microbatch"]
  # What fits in memory for training fits for eval (a forward pass only).
  eval_batch_size = int(config.eval_batch_size or microbatch_size)
  eval_field = "config.eval_batch_size" if config.eval_batch_size else batch_field
  if eval_batch_size % mesh.size:
    raise ValueError(f"{eval_field}={eval_batch_size} must be divisible by the device count "
                     f"({mesh.size}).")
  num_steps = recipe.max_steps if config.num_train_steps < 0 else int(config.num_train_steps)
  if num_steps > recipe.max_steps:  # its LR is 0 past the end: steps that change nothing
    raise ValueError(f"config.num_train_steps={num_steps} is past the end of the recipe "
                     f"({recipe.max_steps} steps, where its LR reaches its end): use -1 for the "
                     f"recipe's length, at most {recipe.max_steps}, or more "
                     f"config.baseline.num_epochs.")
  profiling.check_within_run(config.profile_steps, num_steps, may_end_sooner=recipe.adaptive)
  settings = config_lib.sub_config_with_defaults(config, "polish")
  polish.check_polish_config(settings)
  return Experiment(config, dataset, model, baseline, recipe, mesh, num_steps, eval_batch_size,
                    polish=settings,
                    final_epochs_steps=_final_epochs_steps(settings, baseline, recipe, num_steps),
                    batch_sizes=batch_sizes, layout=layout, batch_schedule=schedule)


def _batch_schedule(recipe: date.Recipe, layout: BatchLayout, batch_field: str
                    ) -> date.BatchSchedule | None:
  """A field batch schedule's batches, each rounded up to the layout's quantum."""
  if not recipe.scheduled:
    return None
  if recipe.batch_size % layout.quantum:
    raise ValueError(f"{batch_field}={recipe.batch_size}, the batch schedule's largest, must be "
                     f"a multiple of {layout.quantum} (devices x grad_accum_steps x grad_groups "
                     f"and the batch-norm group, as each of its batches is).")
  if recipe.total_steps * recipe.base_batch_size + recipe.batch_size >= 2 ** 31:
    raise ValueError(f"{batch_field}: the budget of {recipe.total_steps} baseline steps serves "
                     f"2^31 examples or more, past the data position's int32.")
  return builder_lib.batch_schedule_of(recipe, multiple_of=layout.quantum)


def _batch_sizes(recipe: date.Recipe, layout: BatchLayout, batch_field: str
                 ) -> tuple[int, ...]:
  """The batches the run trains at: the recipe's, or the ladder of a growing batch.

  The ladder starts at the baseline's batch rounded up to the layout's
  `quantum` and doubles up to `recipe.batch_size`, the largest.
  """
  if not recipe.grow_batch:
    return (recipe.batch_size,)
  quantum = layout.quantum
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


def _with_ladder_noted(recipe: date.Recipe, ladder: tuple[int, ...], layout: BatchLayout
                       ) -> date.Recipe:
  """`recipe`, its rationale showing the ladder the run trains: DATE plans the rungs from
  the baseline's batch, the layout rounds them (a row says which, and why)."""
  if not recipe.grow_batch:
    return recipe
  planned = date.batch_ladder(recipe.base_batch_size, recipe.batch_size)
  if tuple(ladder) == planned:
    return recipe
  why = dict(recipe.rationale)
  why["batch ladder"] = ", ".join(f"{b:,}" for b in ladder)
  if "grow_batch" in why:
    why["grow_batch"] = why["grow_batch"].replace(f"start at {planned[0]},",
                                                  f"start at {ladder[0]},", 1)
  quantum = f"the batch layout's quantum of {layout.quantum} ({layout.quantum_reason()})"
  below = [f"{b:,}" for b in planned if b < ladder[0]]
  if ladder[0] in planned:
    rungs = f"rung {below[0]} is" if len(below) == 1 else (
        f"rungs {', '.join(below[:-1])} and {below[-1]} are")
    why["ladder rounded"] = f"{rungs} below {quantum}: the ladder starts at {ladder[0]:,}"
  else:
    why["ladder rounded"] = (f"the baseline's batch {recipe.base_batch_size:,} is not a "
                             f"multiple of {quantum}: the ladder starts at {ladder[0]:,}, the "
                             f"next multiple")
  return recipe.replace(rationale=why)


def _final_epochs_steps(settings: dict[str, Any], baseline: date.Recipe, recipe: date.Recipe,
                        num_steps: int) -> int:
  """`polish.polish_window` for this run: adaptive runs count it in baseline steps."""
  if recipe.adaptive:
    return polish.polish_window(settings, baseline.steps_per_epoch, recipe.total_steps)
  return polish.polish_window(settings, recipe.steps_per_epoch, num_steps)


def engine_rules_off(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """`config.engine_rules_off` ("early_climb,rising_hold") as rule names, each checked
  against `dateopt.date._progress.ENGINE_RULES`."""
  value = config.get("engine_rules_off", "") or ""
  if not isinstance(value, str):
    raise ValueError(f"config.engine_rules_off must be a comma-separated string of rule names "
                     f"(from {', '.join(ENGINE_RULES)}); got {value!r}.")
  names = tuple(name.strip() for name in value.split(",") if name.strip())
  for name in names:
    if name not in ENGINE_RULES:
      raise ValueError(f"config.engine_rules_off: unknown rule {name!r}; allowed: "
                       f"{', '.join(ENGINE_RULES)}.")
  return names


def engine_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The engine's settings that come from the run's config, not its recipe (whose `engine`
  holds the knobs), checked: what `date.build` takes besides the recipe
  (`measure_every_steps`, `watch`, `rules_off`)."""
  check_type("config.divergence_watch", config.divergence_watch, bool, what="True or False")
  return {"measure_every_steps": config.measure_every_steps, "watch": config.divergence_watch,
          "rules_off": engine_rules_off(config)}


def build_optimizer(config: ml_collections.ConfigDict, recipe: date.Recipe,
                    batch_sizes: Sequence[int] | None = None, *,
                    batch_schedule: date.BatchSchedule | None = None):
  """DATE's optimizer for the recipe, with noise scale, statistics and guard as configured.

  `batch_sizes`: a growing recipe's ladder (`Experiment.batch_sizes`);
  `batch_schedule`: a field batch schedule as the layout rounds it
  (`Experiment.batch_schedule`).
  """
  settings = engine_settings(config)
  if settings["rules_off"] and not (recipe.adaptive and not recipe.scheduled):
    raise ValueError(f"config.engine_rules_off={config.engine_rules_off!r} switches off rules "
                     f"of DATE's adaptive engine, but this run's strategy "
                     f"{config.strategy!r} plans no adaptive recipe; set it to \"\".")
  tx, schedule = date.build(recipe, batch_sizes=batch_sizes, batch_schedule=batch_schedule,
                            **settings)
  # The adaptive engine keeps its own EMAs; the others measure only to log the noise.
  if (not recipe.adaptive or recipe.scheduled) and gradient_groups(config) > 1:
    tx = date.measure_noise_scale(tx, config=recipe.engine_config,
                                  measure_every_steps=config.measure_every_steps)
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
