"""`Recipe`: a frozen, validated, serialisable description of a training recipe."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Mapping

from dateopt import extras, masks, schedules
from dateopt.date import _adam_scaling as adam_scaling
from dateopt.date._batch_schedules import BATCH_SCHEDULES, SCHEDULE_OPTIONS
from dateopt.date._engine_config import EngineConfig, engine_config
from dateopt.validation import check_choice, check_range, check_type

#: The optimizer families a `Recipe` can name.
OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw", "lars", "lamb")
MOMENTUM_OPTIMIZERS = ("momentum", "nesterov", "lars")

# Which hyper-parameters each optimizer family and each decay actually reads.
_OPTIMIZER_FIELDS = {
    "sgd": (),
    "momentum": ("momentum",),
    "nesterov": ("momentum",),
    "adam": ("b1", "b2", "eps"),
    "adamw": ("b1", "b2", "eps"),
    "lars": ("momentum", "trust_coefficient", "eps"),
    "lamb": ("b1", "b2", "eps"),
}
_DECAY_FIELDS = {
    "polynomial": ("power", "end_value"),
    "cosine": ("end_value",),
    "exponential": ("decay_rate", "decay_every_epochs", "end_value"),
    "multistep": ("decay_epochs", "decay_rate"),
    "constant": (),
}
#: How an adaptive run scales its LR by the gain r: "linear" (×r) or "sqrt" (×√r).
GAIN_RULES = ("linear", "sqrt")
#: What DATE can measure the noise scale of: "gradient", "lars_step" (each leaf's gradient
#: times its LARS trust ratio), "adam_step" (the gradient in Adam's metric, 1/(√v̂ + ε) per
#: coordinate; opt-in) or "auto" (the step LARS takes where DATE can measure it:
#: `Recipe.measured_noise_of`).
NOISE_OF = ("auto", "gradient", "lars_step", "adam_step")
ADAM_STEP_OPTIMIZERS = ("adam", "adamw")
_ADAPTIVE_FIELDS = ("base_batch_size", "gain_rule", "grow_batch", "noise_of", "engine")
_ALWAYS_USED = ("batch_size", "num_examples", "num_epochs", "learning_rate",
                "optimizer", "weight_decay", "mask", "warmup_epochs",
                "init_value", "decay", "grad_clip_norm", "label_smoothing",
                "optimizer_options")


def _spec(default: Any = dataclasses.MISSING, *, kind: str, **checks) -> Any:
  """A dataclass field whose metadata says how `Recipe` validates it."""
  metadata = {"kind": kind, **checks}
  if kind == "mapping":  # dicts: built per instance, left out of the hash
    return dataclasses.field(default_factory=dict, hash=False, metadata=metadata)
  if kind == "engine":  # every field of the engine's config, as a dict
    return dataclasses.field(default_factory=lambda: EngineConfig().to_dict(), hash=False,
                             metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


def _normalise(name: str, value: Any, kind: str) -> Any:
  """Checks `value`'s type for a field of `kind` and returns its canonical form."""
  if kind == "int":
    check_type(name, value, numbers.Integral, what="an int")
    return int(value)
  if kind == "float":
    check_type(name, value, numbers.Real, what="a number")
    return float(value)
  if kind == "optional_float":
    return None if value is None else _normalise(name, value, "float")
  if kind == "optional_int":
    return None if value is None else _normalise(name, value, "int")
  if kind == "str":
    check_type(name, value, str, what="a string")
    return value
  if kind == "bool":
    check_type(name, value, bool, what="a bool")
    return value
  if kind == "float_tuple":
    check_type(name, value, (list, tuple), what="a list of numbers")
    return tuple(_normalise(f"{name}[{i}]", v, "float") for i, v in enumerate(value))
  if kind == "str_tuple":
    check_type(name, value, (list, tuple), what="a list of strings")
    return tuple(_normalise(f"{name}[{i}]", v, "str") for i, v in enumerate(value))
  if kind == "mapping":
    check_type(name, value, Mapping, what="a mapping")
    return {_normalise(f"{name} key", k, "str"): _freeze(v) for k, v in value.items()}
  if kind == "engine":
    return engine_config(value, name).to_dict()
  raise AssertionError(kind)


def _freeze(value: Any) -> Any:
  """Lists become tuples so that a recipe compares equal after a round trip."""
  return tuple(value) if isinstance(value, list) else value


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A complete training recipe: batch, length, optimizer, schedule, regularisers.

  Validated on construction: a field of the wrong type or out of range raises a
  ValueError that names it. Serialises to a plain dict or an
  `ml_collections.ConfigDict` and back. An epoch is num_examples // batch_size
  steps: its last partial batch is dropped, as a jitted step (one batch shape)
  needs.

  Attributes:
    batch_size: global batch size.
    num_examples: training-set size (epochs → steps).
    num_epochs: training length in epochs.
    learning_rate: peak learning rate (reached at the end of the warmup).
    optimizer: one of "sgd", "momentum", "nesterov", "adam", "adamw", "lars",
      "lamb".
    momentum: heavy-ball momentum (momentum, nesterov, lars).
    b1: first-moment decay (adam, adamw, lamb).
    b2: second-moment decay (adam, adamw, lamb).
    eps: the family's epsilon (Adam denominator, LARS trust-ratio
      denominator); None keeps the family's default.
    trust_coefficient: LARS trust coefficient η.
    weight_decay: weight decay (coupled L2 for sgd/momentum/nesterov/adam and
      lars, decoupled for adamw and lamb).
    mask: which parameters get weight decay (and the trust ratio, for lars and
      lamb): a name in `dateopt.masks.NAMED_MASKS` ("exclude_bias_and_norm",
      "all", "kernels") or a regex searched in the '/'-joined parameter path
      (e.g. "/kernel$").
    warmup_epochs: length of the linear warmup in epochs; < num_epochs.
    init_value: learning rate at step 0.
    decay: "polynomial", "cosine", "exponential", "multistep" or "constant".
    power: polynomial power.
    end_value: polynomial/cosine end LR, exponential floor.
    decay_epochs: multistep milestones in absolute epochs.
    decay_rate: multistep factor, or exponential rate per decay_every_epochs.
    decay_every_epochs: exponential decay period in epochs.
    grad_clip_norm: clip gradients to this global norm first (None: no clip).
    label_smoothing: label smoothing for the loss (read by the trainer).
    optimizer_options: extra keyword arguments of the optimizer factory
      (e.g. {"mode": "optax"} for lars, {"trust_bounds": (0, 10)} for lamb).
    base_batch_size: DATE's adaptive mode (`plan(..., strategy="adaptive")`):
      the baseline's batch size B0. The LR schedule then counts baseline
      steps (warmup, decay and epochs are the baseline's), and the
      optimizer walks it at the measured gain r_t per step
      (`dateopt.date.adaptive`). None: a static recipe, whose schedule counts
      its own steps.
    gain_rule: adaptive mode only: the LR is the baseline's × r_t ("linear")
      or × √r_t ("sqrt").
    grow_batch: adaptive mode only: `batch_size` is the largest batch, and the
      run starts at the baseline's and climbs a ladder of doublings as the
      measured noise scale grows (`dateopt.date.adaptive`'s `batch_sizes`).
    engine: adaptive mode only: the engine's knobs, every field of an
      `EngineConfig` as a dict (an `EngineConfig` or a partial mapping is
      completed with the defaults): its horizon, warm-in, loss bands, gain rise,
      early rungs, and a growing batch's step price and noise credit.
    noise_of: what the noise scale is measured on (and, in adaptive mode,
      the gain and the batch's growth with it): "gradient"; "lars_step"
      (lars only): each leaf's gradient times its trust ratio, the gradient
      part of the step LARS takes (`dateopt.date._builder.noise_leaf_scales`);
      "adam_step" (adam, adamw only): the gradient times Adam's
      preconditioner 1/(√v̂ + ε), coordinate by coordinate; or
      "auto" (the default): "lars_step" for a lars recipe without
      `trust_clip` or `grad_clip_norm`, else "gradient"
      (`measured_noise_of`). An adaptive plan keeps the baseline's unless
      told otherwise.
    batch_schedule: "none", or one of the field's fixed batch schedules
      (`dateopt.date._batch_schedules`: "linear_ramp", "doubling", "seesaw",
      "batch_for_decay"): with `base_batch_size` set, the LR schedule counts
      examples (baseline steps), the batch follows the schedule up to
      `batch_size`, and the run stops at the budget (`num_epochs`).
    batch_schedule_options: the schedule's resolved options (its start batch
      and its ramp in examples, or its α).
    adam_scaling: DATE's engine and the batch schedules (adam, adamw, lamb):
      the rules of `dateopt.date._adam_scaling` ("b2", "eps", "weight_decay")
      applied at every step with its batch and LR factor; () by default.
    rationale: why each hyper-parameter has its value, keyed by field name
      (filled by `plan`, shown by `explain`).

  Example:
    >>> r = Recipe(batch_size=1024, num_examples=1_281_167, num_epochs=90,
    ...            learning_rate=2**2.5, optimizer="lars", warmup_epochs=0.3125,
    ...            decay="polynomial", end_value=1e-4, weight_decay=1e-4)
    >>> r.steps_per_epoch, r.warmup_steps, r.total_steps
    (1251, 391, 112590)
  """

  batch_size: int = _spec(kind="int", low=1)
  num_examples: int = _spec(kind="int", low=1)
  num_epochs: float = _spec(kind="float", low=0.0, low_inclusive=False)
  learning_rate: float = _spec(kind="float", low=0.0, low_inclusive=False)
  optimizer: str = _spec("momentum", kind="str", choices=OPTIMIZERS)
  momentum: float = _spec(0.9, kind="float", low=0.0, high=1.0, high_inclusive=False)
  b1: float = _spec(0.9, kind="float", low=0.0, high=1.0, high_inclusive=False)
  b2: float = _spec(0.999, kind="float", low=0.0, high=1.0, high_inclusive=False)
  eps: float | None = _spec(None, kind="optional_float", low=0.0)
  trust_coefficient: float = _spec(0.001, kind="float", low=0.0, low_inclusive=False)
  weight_decay: float = _spec(0.0, kind="float", low=0.0)
  mask: str = _spec("exclude_bias_and_norm", kind="str")
  warmup_epochs: float = _spec(0.0, kind="float", low=0.0)
  init_value: float = _spec(0.0, kind="float", low=0.0)
  decay: str = _spec("cosine", kind="str", choices=schedules.DECAYS)
  power: float = _spec(2.0, kind="float", low=0.0, low_inclusive=False)
  end_value: float = _spec(0.0, kind="float", low=0.0)
  decay_epochs: tuple[float, ...] = _spec(
      schedules.GOYAL_DECAY_EPOCHS, kind="float_tuple")
  decay_rate: float = _spec(0.1, kind="float", low=0.0, high=1.0,
                            low_inclusive=False)
  decay_every_epochs: float = _spec(1.0, kind="float", low=0.0, low_inclusive=False)
  grad_clip_norm: float | None = _spec(None, kind="optional_float", low=0.0,
                                       low_inclusive=False)
  label_smoothing: float = _spec(0.0, kind="float", low=0.0, high=1.0,
                                 high_inclusive=False)
  optimizer_options: Mapping[str, Any] = _spec(kind="mapping")
  base_batch_size: int | None = _spec(None, kind="optional_int", low=1)
  gain_rule: str = _spec("linear", kind="str", choices=GAIN_RULES)
  grow_batch: bool = _spec(False, kind="bool")
  engine: Mapping[str, Any] = _spec(kind="engine")
  noise_of: str = _spec("auto", kind="str", choices=NOISE_OF)
  batch_schedule: str = _spec("none", kind="str", choices=("none",) + BATCH_SCHEDULES)
  batch_schedule_options: Mapping[str, Any] = _spec(kind="mapping")
  adam_scaling: tuple[str, ...] = _spec((), kind="str_tuple")
  rationale: Mapping[str, str] = _spec(kind="mapping")

  def __post_init__(self):
    for f in dataclasses.fields(self):
      checks = dict(f.metadata)
      value = _normalise(f.name, getattr(self, f.name), checks.pop("kind"))
      choices = checks.pop("choices", None)
      if choices is not None:
        check_choice(f.name, value, choices)
      elif checks and value is not None:
        check_range(f.name, value, **checks)
      object.__setattr__(self, f.name, value)
    self._check_consistency()

  def _check_consistency(self) -> None:
    """Checks that involve more than one field."""
    if self.batch_size > self.num_examples:
      raise ValueError(f"batch_size={self.batch_size} is larger than the data set "
                       f"(num_examples={self.num_examples}): no epoch would hold a full batch.")
    check_range("warmup_epochs", self.warmup_epochs, low=0.0,
                high=self.num_epochs, high_inclusive=False)
    check_range("init_value", self.init_value, low=0.0, high=self.learning_rate)
    if self.decay in ("polynomial", "cosine", "exponential"):  # the decays that read it
      check_range("end_value", self.end_value, low=0.0, high=self.learning_rate)
    if self.decay == "multistep":
      for i, epoch in enumerate(self.decay_epochs):
        check_range(f"decay_epochs[{i}]", epoch, low=self.warmup_epochs,
                    high=self.num_epochs)
      if list(self.decay_epochs) != sorted(self.decay_epochs):
        raise ValueError(f"decay_epochs must be increasing; got {self.decay_epochs}.")
    if self.adaptive:
      check_range("base_batch_size", self.base_batch_size, low=1, high=self.batch_size)
    self._check_batch_schedule()
    adam_scaling.check_rules(self.adam_scaling, self.optimizer)
    if self.measured_noise_of == "adam_step" and {"b2", "eps"} & set(self.adam_scaling):
      raise ValueError("noise_of='adam_step' reads Adam's preconditioner with the recipe's b2 and "
                       "eps; adam_scaling's 'b2' and 'eps' change them at every step: use one.")
    if self.adam_scaling and not self.adaptive:
      raise ValueError(f"adam_scaling={self.adam_scaling} is applied step by step by DATE's "
                       f"engine or a batch schedule (base_batch_size set); a static plan writes "
                       f"the scaled b2, eps and weight_decay into the recipe instead.")
    if not self.adaptive and self.grow_batch:
      raise ValueError("grow_batch=True needs an adaptive recipe (base_batch_size set): "
                       "plan(baseline, max_batch, 'adaptive', grow_batch=True).")
    self._check_noise_of()
    masks.from_name(self.mask)  # a known name, else a regex that must compile
    for key, value in self.rationale.items():
      check_type(f"rationale[{key!r}]", value, str, what="a string")
    # Rounding to whole steps can still leave no training or no decay steps.
    if self.total_steps < 1:
      raise ValueError(f"num_epochs={self.num_epochs} is less than one step.")
    if self.warmup_steps >= self.total_steps:
      raise ValueError(
          f"warmup_epochs={self.warmup_epochs} rounds to {self.warmup_steps} "
          f"steps, not fewer than the {self.total_steps} training steps.")

  def _check_batch_schedule(self) -> None:
    """A field batch schedule counts baseline steps and has its own options."""
    if not self.scheduled:
      if self.batch_schedule_options:
        raise ValueError(f"batch_schedule_options={dict(self.batch_schedule_options)} needs a "
                         f"batch_schedule (one of {', '.join(BATCH_SCHEDULES)}).")
      return
    if not self.adaptive or self.grow_batch:
      raise ValueError(f"batch_schedule={self.batch_schedule!r} needs base_batch_size set and "
                       f"grow_batch=False: plan(baseline, max_batch, {self.batch_schedule!r}).")
    wanted = SCHEDULE_OPTIONS[self.batch_schedule]
    if sorted(self.batch_schedule_options) != sorted(wanted):
      raise ValueError(f"batch_schedule_options of {self.batch_schedule!r} must hold exactly "
                       f"{', '.join(wanted)}; got {dict(self.batch_schedule_options)}.")

  def _check_noise_of(self) -> None:
    if self.noise_of == "adam_step" and self.optimizer not in ADAM_STEP_OPTIMIZERS:
      raise ValueError(f"noise_of='adam_step' measures the step Adam takes; optimizer="
                       f"{self.optimizer!r} takes another. Use noise_of='gradient', or "
                       f"optimizer in {ADAM_STEP_OPTIMIZERS}.")
    if self.noise_of != "lars_step" or self._lars_step_measurable():
      return
    if self.optimizer != "lars":
      raise ValueError(f"noise_of='lars_step' measures the step LARS takes; optimizer="
                       f"{self.optimizer!r} takes another. Use noise_of='gradient', or "
                       "optimizer='lars'.")
    if self.optimizer_options.get("trust_clip"):
      raise ValueError("noise_of='lars_step' takes the plain trust ratios; with "
                       "optimizer_options['trust_clip'] (LARC) use noise_of='gradient'.")
    if self.grad_clip_norm is not None:
      raise ValueError("noise_of='lars_step' takes the trust ratios of the unclipped "
                       "gradient; with grad_clip_norm set use noise_of='gradient'.")

  def _lars_step_measurable(self) -> bool:
    """Whether the step's noise is LARS's plain trust ratios × the raw gradient."""
    return (self.optimizer == "lars" and not self.optimizer_options.get("trust_clip")
            and self.grad_clip_norm is None)

  @property
  def measured_noise_of(self) -> str:
    """What DATE measures: `noise_of`, with "auto" resolved.

    "auto" is the optimizer's own step where DATE can measure it: "lars_step"
    for plain LARS (AdaScale's gain is defined for the step the optimizer takes,
    Johnson et al. 2020; the evidence: docs/results/engine_rules.md, 'The noise of
    the step LARS takes'), "gradient" for every other optimizer, LARC's clipped
    trust ratios and a clipped gradient.

    Example:
      >>> r = Recipe(batch_size=256, num_examples=50_000, num_epochs=10, learning_rate=1.0,
      ...            optimizer="lars")
      >>> r.measured_noise_of, r.replace(optimizer="adam").measured_noise_of
      ('lars_step', 'gradient')
    """
    if self.noise_of != "auto":
      return self.noise_of
    return "lars_step" if self._lars_step_measurable() else "gradient"

  # ---- steps, through the one epochs→steps converter -------------------

  @property
  def adaptive(self) -> bool:
    """Whether this is a DATE adaptive recipe (its schedule counts baseline steps)."""
    return self.base_batch_size is not None

  @property
  def engine_config(self) -> EngineConfig:
    """`engine` as the `EngineConfig` that `build` gives `adaptive`."""
    return EngineConfig(**self.engine)

  @property
  def scheduled(self) -> bool:
    """Whether the batch follows one of the field's fixed schedules (`batch_schedule`)."""
    return self.batch_schedule != "none"

  @property
  def schedule_batch_size(self) -> int:
    """The batch size whose steps the LR schedule counts (B0 when adaptive)."""
    return self.base_batch_size if self.adaptive else self.batch_size

  def epochs_to_steps(self, epochs: float) -> int:
    """`schedules.epochs_to_steps` at `schedule_batch_size`, with this recipe's policy."""
    return schedules.epochs_to_steps(epochs, self.num_examples, self.schedule_batch_size)

  @property
  def steps_per_epoch(self) -> int:
    """Optimizer steps per epoch: whole batches only (the last partial one is dropped)."""
    return schedules.steps_per_epoch(self.num_examples, self.batch_size)

  @property
  def total_steps(self) -> int:
    """Schedule steps in the whole run.

    Static: the run's optimizer steps. Adaptive: the baseline's steps T0, the
    progress budget, which is also the most steps the run can take (gain ≥ 1).
    """
    return self.epochs_to_steps(self.num_epochs)

  @property
  def max_steps(self) -> int:
    """The most optimizer steps the run can take.

    Static: `total_steps`. Adaptive: T0 plus the warmup, since each step
    covers at least one baseline step (gain ≥ 1) once the ramp is over.
    """
    return self.total_steps + (self.warmup_steps if self.adaptive else 0)

  @property
  def warmup_steps(self) -> int:
    """Steps of linear warmup (the same at the large batch in adaptive mode: LEGW)."""
    return self.epochs_to_steps(self.warmup_epochs)

  def used_fields(self) -> tuple[str, ...]:
    """Names of the fields this recipe's optimizer family and decay read."""
    used = set(_ALWAYS_USED) | set(_OPTIMIZER_FIELDS[self.optimizer])
    used |= set(_DECAY_FIELDS[self.decay])
    if self.adam_scaling:
      used.add("adam_scaling")
    if self.scheduled:
      used |= {"base_batch_size", "batch_schedule", "batch_schedule_options"}
    elif self.adaptive:
      used |= set(_ADAPTIVE_FIELDS)
    if self.measured_noise_of != "gradient":
      used.add("noise_of")
    return tuple(f.name for f in dataclasses.fields(self) if f.name in used)

  # ---- serialisation ----------------------------------------------------

  def replace(self, **changes) -> "Recipe":
    """A validated copy with `changes` applied."""
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    """A plain-Python dict of every field (tuples stay tuples)."""
    return {f.name: _copy(getattr(self, f.name)) for f in dataclasses.fields(self)}

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "Recipe":
    """Builds a recipe from a dict; unknown keys raise a ValueError naming them."""
    check_type("values", values, Mapping, what="a mapping")
    names = [f.name for f in dataclasses.fields(cls)]
    values = _without_retired_fields(values)
    for key in values:
      if key not in names:
        raise ValueError(f"Unknown Recipe field {key!r}; known fields: {', '.join(names)}.")
    return cls(**{k: _copy(v) for k, v in values.items()})

  def to_config(self) -> Any:
    """The recipe as an `ml_collections.ConfigDict` (e.g. for a config file; needs the
    `train` extra, which brings ml_collections)."""
    return extras.require("ml_collections", extra="train").ConfigDict(self.to_dict())

  @classmethod
  def from_config(cls, config: Any) -> "Recipe":
    """Builds a recipe from a `ConfigDict` (as written by `to_config`) or a mapping."""
    if not isinstance(config, Mapping) and not callable(getattr(config, "to_dict", None)):
      check_type("config", config, Mapping, what="an ml_collections.ConfigDict")
    values = config if isinstance(config, Mapping) else config.to_dict()
    return cls.from_dict(values)


def _without_retired_fields(values: Mapping[str, Any]) -> Mapping[str, Any]:
  """`values` less `drop_remainder: True`, which recipes saved before its removal hold, and
  with `step_price` and `noise_batch_exponent`, fields of their own before, in `engine`.

  Every epoch drops its last partial batch: the trainer's batches have one
  shape per compiled step, so keeping a smaller last batch was never run.
  """
  moved = {key: values[key] for key in _ENGINE_FIELDS_BEFORE if key in values}
  if moved:
    values = {key: value for key, value in values.items() if key not in moved}
    values["engine"] = {**values.get("engine", {}), **moved}
  if "drop_remainder" not in values:
    return values
  if values["drop_remainder"] is not True:
    raise ValueError(f"drop_remainder={values['drop_remainder']!r} is not supported: every "
                     "epoch drops its last partial batch (a jitted step has one batch shape), "
                     "so the field was removed from Recipe.")
  return {key: value for key, value in values.items() if key != "drop_remainder"}


_ENGINE_FIELDS_BEFORE = ("step_price", "noise_batch_exponent")


def _copy(value: Any) -> Any:
  return dict(value) if isinstance(value, Mapping) else value
