"""The trainer's config schema: defaults, and validation that fails before compiling.

A config file under `configs/` is a `get_config()` returning
`default_config()` with fields overridden. Validation names the offending
field: unknown keys, unknown model or dataset, a batch that does not divide
over the devices, a dataset whose files are missing.
"""

from __future__ import annotations

from typing import Any

import ml_collections

# Sub-dicts passed through to another validator (create_model, get_dataset,
# Recipe, plan, divergence_guard), which names bad keys itself.
FREE_FORM_FIELDS = ("model_kwargs", "dataset_kwargs", "baseline", "plan", "guard_kwargs")


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
  c.data_dir = None
  c.eval_batch_size = None  # None: the training batch size.
  # Model.
  c.model = "lstm_classifier"
  c.model_kwargs = ml_collections.ConfigDict()
  c.compute_dtype = "float32"  # "bfloat16" for bf16 compute (params stay float32).
  # DATE: the tuned baseline recipe (a `dateopt.date.Recipe` dict) and the target batch.
  c.baseline = ml_collections.ConfigDict()
  c.batch_size = None  # None: train the baseline as it is.
  c.strategy = "legw"  # a `date.STRATEGIES` name; "adaptive" is DATE's dynamic mode.
  c.plan = ml_collections.ConfigDict()  # keyword arguments of `date.plan` (gain_rule, noise_scale, ...).
  # In-training DATE statistics and the divergence guard.
  c.statistics = True
  c.grad_groups = 8  # gradient groups for the noise scale (0: off); fixed, not per device.
  c.measure_every_steps = 1  # measure the noise scale on 1 step in N (the others: a plain gradient).
  c.guard = True
  c.guard_kwargs = ml_collections.ConfigDict()
  # Loop.
  c.num_train_steps = -1  # -1: the recipe's epochs.
  c.log_every_steps = 50
  c.eval_every_steps = -1  # -1: once per epoch; 0: only at the end.
  c.checkpoint_every_steps = 500
  c.keep_checkpoints = 3
  c.progress_bar = True
  # Final polishing (Kasagi et al. 2020): re-estimate BN statistics at the end.
  c.polish_batches = 0  # 0: off; else the number of non-augmented training batches.
  return c


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


def to_dict(value: Any) -> dict[str, Any]:
  """A ConfigDict (or dict, or None) as a plain dict."""
  if value is None:
    return {}
  return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else dict(value)
