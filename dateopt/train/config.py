"""The trainer's config schema: defaults, and validation that fails before compiling.

A config file under `configs/` is a `get_config()` returning
`default_config()` with fields overridden. Validation names the offending
field: unknown keys, unknown model or dataset, a batch that does not divide
over the devices, a dataset whose files are missing.
"""

from __future__ import annotations

import numbers
from typing import Any

import ml_collections

# Sub-dicts passed through to another validator (create_model, get_dataset,
# Recipe, plan, divergence_guard), which names bad keys itself.
FREE_FORM_FIELDS = ("model_kwargs", "dataset_kwargs", "baseline", "plan", "guard_kwargs")


def optional_int() -> ml_collections.FieldReference:
  """A field that defaults to None and takes an int or None from the command line.

  A plain None default has no type, so `--config.<field>=...` cannot be
  parsed (ml_collections refuses it); `placeholder(int)` parses 512 but not
  None. An `object` placeholder parses both as Python literals, and
  `check_optional_ints` checks the value before anything is built.
  """
  return ml_collections.config_dict.placeholder(object)


# The fields `optional_int` makes: each is None or an int >= 1.
OPTIONAL_INT_FIELDS = ("batch_size", "eval_batch_size")


def default_config() -> ml_collections.ConfigDict:
  """Every field the trainer reads, with its default.

  Example:
    >>> config = default_config()
    >>> config.dataset, config.strategy
    ('mnist1d', 'legw')
  """
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Data.
  c.dataset = "mnist1d"
  c.dataset_kwargs = ml_collections.ConfigDict()
  c.data_dir = ml_collections.config_dict.placeholder(str)  # typed: --config.data_dir=... parses
  c.eval_batch_size = optional_int()  # None: the training batch size (per micro-batch, see grad_accum_steps).
  # Model.
  c.model = "lstm_classifier"
  c.model_kwargs = ml_collections.ConfigDict()
  c.compute_dtype = "float32"  # "bfloat16" for bf16 compute (params stay float32).
  # DATE: the tuned baseline recipe (a `dateopt.date.Recipe` dict) and the target batch.
  c.baseline = ml_collections.ConfigDict()
  c.batch_size = optional_int()  # None: train the baseline as it is (no adaptive, no growth).
  # Gradient accumulation: each optimizer step takes its batch as k micro-batches in turn
  # (one scan in the jitted step), so only batch / k examples' activations are in memory.
  c.grad_accum_steps = 1
  c.strategy = "legw"  # a planner strategy (`date.plan`); "adaptive" is DATE's dynamic mode.
  c.plan = ml_collections.ConfigDict()  # keyword arguments of `date.plan` (gain_rule, noise_scale, ...).
  # In-training DATE statistics and the divergence guard.
  c.statistics = True
  c.grad_groups = 8  # gradient groups for the noise scale (0: off); fixed, not per device.
  c.measure_every_steps = 1  # measure the noise scale on 1 step in N (the others: a plain gradient).
  c.guard = True
  c.guard_kwargs = ml_collections.ConfigDict()
  # Adaptive runs: DATE's divergence watch holds a diverged run, cuts its LR and stops it with
  # status 1 after the engine's horizon of stalled steps (False: no watch, so no hold, LR cut
  # or stop; see dateopt.date._divergence). The engine's knobs are the recipe's `engine`
  # (`config.plan.engine = {"horizon": 200}`, fields of `date.EngineConfig`).
  c.divergence_watch = True
  # Adaptive runs: DATE's engine rules switched off, comma-separated names of
  # `dateopt.date._progress.ENGINE_RULES` (an ablation: what each rule buys); "": every rule on.
  c.engine_rules_off = ""
  # A growing batch's train step for every rung, compiled in a background thread while the
  # run trains (dateopt.train.rungs).
  c.compile_rungs_ahead = False
  # Loop.
  c.num_train_steps = -1  # -1: the recipe's epochs.
  c.log_every_steps = 50
  c.eval_every_steps = -1  # -1: once per epoch; 0: only at the end.
  c.checkpoint_every_steps = 500
  c.keep_checkpoints = 3
  c.progress_bar = True
  # A jax.profiler trace of steps "first:last" into the workdir (TensorBoard's Profile tab);
  # "": none. See dateopt.train.profiling.
  c.profile_steps = ""
  # True: a run that starts over (checkpointing off, or no checkpoint left) may replace the
  # metrics of an earlier run in its workdir; else it is refused (see recipe_record).
  c.overwrite = False
  # Final Polishing (Kasagi et al. 2020): BN fitted to evaluation-style data at the end.
  c.polish = ml_collections.ConfigDict()
  c.polish.mode = "none"  # "none", "precise_bn", "final_epochs" or "both".
  c.polish.epochs = ml_collections.config_dict.placeholder(float)  # final_epochs; None: 5/90 of the run.
  c.polish.batches = 50  # precise_bn: training batches the BN statistics are averaged over.
  c.polish.bn_data = "clean"  # precise_bn: "clean" (eval-style) or "weak" (weakly augmented).
  return c


def check_is_config_dict(config: Any) -> None:
  """Raises TypeError unless `config` is a ConfigDict (a `get_config()` may return a dict)."""
  if not isinstance(config, ml_collections.ConfigDict):
    # ml_collections' stand-in for a config file that did not load holds its error.
    error = vars(config).get("_error") if hasattr(type(config), "_ReportError") else None
    if isinstance(error, Exception):
      raise FileNotFoundError(f"--config: {error}") from error
    raise TypeError(f"the config must be an ml_collections.ConfigDict: get_config() returns "
                    f"dateopt.train.default_config() with its fields set; got "
                    f"{type(config).__name__}.")


def check_known_keys(config: ml_collections.ConfigDict,
                     defaults: ml_collections.ConfigDict | None = None,
                     prefix: str = "config") -> None:
  """Raises ValueError naming the first key `config` has that the schema lacks."""
  defaults = default_config() if defaults is None else defaults
  for key in config.keys():
    name = f"{prefix}.{key}"
    if key not in defaults:
      allowed = ", ".join(sorted(defaults.keys()))
      raise ValueError(f"unknown config key {name!r}; allowed keys: {allowed}.")
    value, default = config[key], defaults[key]
    if isinstance(default, ml_collections.ConfigDict) and key not in FREE_FORM_FIELDS:
      check_known_keys(value, default, name)


def check_optional_ints(config: ml_collections.ConfigDict) -> None:
  """Raises TypeError or ValueError naming the field of OPTIONAL_INT_FIELDS that is
  neither None nor a positive int (a command-line `--config.batch_size=abc` lands here)."""
  for key in OPTIONAL_INT_FIELDS:
    value = config[key]
    if value is None:
      continue
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise TypeError(f"config.{key} must be a positive int or None; got {value!r} of type "
                      f"{type(value).__name__}.")
    if value < 1:
      raise ValueError(f"config.{key} must be a positive int or None; got {value!r}.")


# The loop's integer fields: the smallest value allowed (without special values), and the
# special values below 1 with what they mean. Every other value is refused, never reinterpreted.
LOOP_FIELDS: dict[str, tuple[int, dict[int, str]]] = {
    "seed": (0, {}),
    "num_train_steps": (-1, {-1: "the recipe's length"}),
    "log_every_steps": (1, {}),
    "eval_every_steps": (-1, {-1: "once per epoch", 0: "only at the end"}),
    "checkpoint_every_steps": (-1, {-1: "never", 0: "only at the end (and when stopped)"}),
    "keep_checkpoints": (1, {}),  # orbax reads 0 as "keep none": each deleted once written
    "measure_every_steps": (1, {}),
}


# The fields besides the recipe that a resumed run must share with the run in its workdir:
# the seed (data order, dropout), the model, and what shapes or steers the optimizer's state.
# `recipe.json` records them; a resume that changes one is refused, naming it.
RESUME_FIELDS = ("seed", "model", "model_kwargs", "guard", "guard_kwargs", "statistics",
                 "grad_groups", "measure_every_steps", "divergence_watch",
                 "engine_rules_off")


def resume_fields(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """`RESUME_FIELDS` of `config` as plain JSON values (sub-configs as dicts).

  Example:
    >>> resume_fields(default_config())["guard"]
    True
  """
  return {key: to_dict(config[key]) if isinstance(config[key], (ml_collections.ConfigDict, dict))
          else config[key] for key in RESUME_FIELDS}


def check_loop_fields(config: ml_collections.ConfigDict) -> None:
  """Raises TypeError or ValueError naming the `LOOP_FIELDS` field that is not an int
  in its range, with the values allowed and what the special ones mean.

  Example:
    >>> config = default_config()
    >>> config.checkpoint_every_steps = -5
    >>> check_loop_fields(config)
    Traceback (most recent call last):
    ValueError: config.checkpoint_every_steps must be -1 (never), 0 (only at the end (and when stopped)) or an int >= 1; got -5.
  """
  for key, (low, meanings) in LOOP_FIELDS.items():
    value = config[key]
    special = ", ".join(f"{v} ({what})" for v, what in meanings.items())
    allowed = f"{special} or an int >= 1" if special else f"an int >= {low}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise TypeError(f"config.{key} must be {allowed}; got {value!r} of type "
                      f"{type(value).__name__}.")
    if value not in meanings and value < (1 if meanings else low):
      raise ValueError(f"config.{key} must be {allowed}; got {value!r}.")


def sub_config_with_defaults(config: ml_collections.ConfigDict, field: str) -> dict[str, Any]:
  """`config.<field>` as a dict, its left-out keys at their defaults.

  A config file may replace a whole sub-config (`config.polish = dict(mode="both")`).

  Example:
    >>> config = default_config()
    >>> config.polish = dict(mode="both")
    >>> sub_config_with_defaults(config, "polish")["batches"]
    50
  """
  return {**to_dict(default_config()[field]), **to_dict(config[field])}


def to_dict(value: Any) -> dict[str, Any]:
  """A ConfigDict (or dict, or None) as a plain dict."""
  if value is None:
    return {}
  return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else dict(value)
