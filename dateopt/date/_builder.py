"""`build(recipe) -> (optimizer, schedule)`: the optax optimizer a trainer uses."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import optax

from dateopt import masks, schedules, transforms
from dateopt.date import _adam_scaling as adam_scaling
from dateopt.date._batch_schedules import BatchSchedule, scheduled_batch, schedule_of
from dateopt.date._divergence import as_optax_state
from dateopt.date._progress import adaptive, batch_ladder
from dateopt.date._recipe import Recipe
from dateopt.validation import check_type

OptimizerFactory = Callable[[optax.ScalarOrSchedule], optax.GradientTransformation]


def build_schedule(recipe: Recipe) -> optax.Schedule:
  """The recipe's learning-rate schedule (step -> LR), an optax schedule.

  `schedules.warmup_decay_schedule` over the recipe's own steps: a linear
  warmup from `init_value` to `learning_rate` over `recipe.warmup_steps`,
  then `decay` until `recipe.total_steps` (epochs count at the recipe's
  `schedule_batch_size`: its batch, or the baseline's for an adaptive recipe).

  Example:
    >>> r = Recipe(batch_size=256, num_examples=50_000, num_epochs=10,
    ...            learning_rate=0.1, warmup_epochs=1)
    >>> float(build_schedule(r)(r.warmup_steps))
    0.1...
  """
  milestones = recipe.decay_epochs if recipe.decay == "multistep" else ()
  return schedules.warmup_decay_schedule(
      recipe.learning_rate, recipe.warmup_steps, recipe.total_steps, decay=recipe.decay,
      init_value=recipe.init_value, power=recipe.power, end_value=recipe.end_value,
      boundaries=[recipe.epochs_to_steps(e) for e in milestones],
      decay_rate=recipe.decay_rate,
      transition_steps=max(1, recipe.epochs_to_steps(recipe.decay_every_epochs)))


def build(recipe: Recipe, *, batch_sizes: Sequence[int] | None = None,
          batch_schedule: BatchSchedule | None = None, measure_every_steps: int = 1,
          watch: bool = True, rules_off: Sequence[str] = (),
          ) -> tuple[optax.GradientTransformationExtraArgs, optax.Schedule]:
  """The optimizer and LR schedule that `recipe` describes.

  Families: "sgd", "momentum", "nesterov" (`optax.sgd`), "adam" (`optax.adam`; their weight
  decay is added to the gradient), "adamw" (`optax.adamw`, decoupled), "lars" (`dateopt.lars`,
  You et al. 2017) and "lamb" (`dateopt.lamb`, You et al. 2019). `recipe.mask` selects the
  parameters that get weight decay (and the trust ratio); `recipe.grad_clip_norm` prepends a
  global-norm clip; `recipe.optimizer_options` go to the family's factory.

  A static recipe's optimizer is `optax.inject_hyperparams` of the family with the schedule
  as its learning rate (the LR applied is `optax.tree.get(state, "learning_rate")`); an
  adaptive recipe's is `dateopt.date.adaptive` over the same family.

  Args:
    recipe: the training recipe.
    measure_every_steps, watch, rules_off: adaptive recipes: as in `dateopt.date.adaptive`,
      whose knobs are the recipe's `engine`.
    batch_sizes: a growing recipe (`grow_batch`): the ladder of batches, when the devices
      need other rungs than `batch_ladder(base, max)`. Ignored for a fixed batch.
    batch_schedule: a recipe with a field `batch_schedule`: its schedule as the
      devices round it (`batch_schedule_of(recipe, multiple_of=...)`); None:
      `batch_schedule_of(recipe)`.

  Returns:
    `(tx, schedule)`: the optax optimizer, and the schedule it follows (for
    an adaptive recipe, the baseline's, in baseline steps).

  Example:
    >>> r = Recipe(batch_size=8192, num_examples=1_281_167, num_epochs=42,
    ...            learning_rate=17.0, optimizer="lars", warmup_epochs=5,
    ...            decay="polynomial", end_value=1e-4, weight_decay=2e-4)
    >>> tx, schedule = build(r)
  """
  check_type("recipe", recipe, Recipe, what="a dateopt.date.Recipe")
  schedule = build_schedule(recipe)
  make = optimizer_factory(recipe)
  rung_hyperparams = _rung_hyperparams(recipe)
  if recipe.scheduled:
    given = batch_schedule_of(recipe) if batch_schedule is None else batch_schedule
    tx = scheduled_batch(make, schedule, given, base_steps=recipe.total_steps,
                         rung_hyperparams=rung_hyperparams)
  elif recipe.adaptive:
    tx = adaptive(make, schedule, rung_hyperparams=rung_hyperparams, **adaptive_settings(
        recipe, batch_sizes=batch_sizes, measure_every_steps=measure_every_steps, watch=watch,
        rules_off=rules_off))
  else:
    tx = optax.inject_hyperparams(make)(learning_rate=schedule)
  return tx, schedule


def adaptive_settings(recipe: Recipe, *, batch_sizes: Sequence[int] | None = None,
                      measure_every_steps: int = 1, watch: bool = True,
                      rules_off: Sequence[str] = ()) -> dict[str, Any]:
  """The keyword arguments `build` gives `adaptive` for an adaptive `recipe` (its
  `make_optimizer`, schedule and `rung_hyperparams` aside), as plain JSON values: what the
  trainer records in `recipe.json` and `replay` takes.

  Example:
    >>> r = Recipe(batch_size=512, num_examples=51_200, num_epochs=10, learning_rate=0.1,
    ...            base_batch_size=128)
    >>> adaptive_settings(r)["base_steps"], adaptive_settings(r)["batch_sizes"]
    (4000, None)
  """
  ladder = _ladder(recipe, batch_sizes)
  return {"base_batch_size": recipe.base_batch_size, "batch_size": recipe.batch_size,
          "base_steps": recipe.total_steps, "warmup_steps": recipe.warmup_steps,
          "gain_rule": recipe.gain_rule,
          "batch_sizes": None if ladder is None else [int(b) for b in ladder],
          "config": dict(recipe.engine), "measure_every_steps": measure_every_steps,
          "watch": watch, "rules_off": list(rules_off)}


def _ladder(recipe: Recipe, batch_sizes: Sequence[int] | None) -> Sequence[int] | None:
  """A growing recipe's rungs: `batch_sizes` where given, else `batch_ladder`; None for a
  fixed batch."""
  if not recipe.grow_batch:
    return None
  given = batch_sizes is not None and len(batch_sizes) > 0  # a numpy array too
  return batch_sizes if given else batch_ladder(recipe.base_batch_size, recipe.batch_size)


def _rung_hyperparams(recipe: Recipe):
  """`recipe.adam_scaling` as the engines' `rung_hyperparams` (None without rules)."""
  if not recipe.adam_scaling:
    return None
  eps = adam_scaling.DEFAULT_EPS[recipe.optimizer] if recipe.eps is None else recipe.eps
  return adam_scaling.rung_hyperparams(recipe.adam_scaling, b1=recipe.b1, b2=recipe.b2, eps=eps,
                                       weight_decay=recipe.weight_decay)


def batch_schedule_of(recipe: Recipe, *, multiple_of: int = 1) -> BatchSchedule:
  """The field batch schedule a recipe with `batch_schedule` follows, each batch rounded
  up to a multiple of `multiple_of` (the devices' batch layout).

  Example:
    >>> r = Recipe(batch_size=256, num_examples=24_000, num_epochs=10, learning_rate=1e-3,
    ...            optimizer="adam", base_batch_size=32, batch_schedule="doubling",
    ...            batch_schedule_options={"start_batch": 32, "ramp_examples": 48_000})
    >>> batch_schedule_of(r).batch_sizes, batch_schedule_of(r).boundaries
    ((32, 64, 128, 256), (16000, 32000, 48000))
  """
  check_type("recipe", recipe, Recipe, what="a dateopt.date.Recipe")
  if not recipe.scheduled:
    raise ValueError(f"batch_schedule_of needs a recipe with a batch_schedule; this one has "
                     f"batch_schedule={recipe.batch_schedule!r}.")
  schedule = schedule_of(recipe.batch_schedule, recipe.batch_schedule_options,
                         base_batch_size=recipe.base_batch_size,
                         max_batch_size=recipe.batch_size,
                         base_schedule=build_schedule(recipe), base_steps=recipe.total_steps,
                         warmup_steps=recipe.warmup_steps)
  return schedule.rounded(multiple_of)


def optimizer_factory(recipe: Recipe) -> OptimizerFactory:
  """`make(learning_rate)`: the recipe's optimizer family with every other field bound.

  Example:
    >>> r = Recipe(batch_size=256, num_examples=50_000, num_epochs=10,
    ...            learning_rate=0.1, optimizer="adam", weight_decay=1e-4)
    >>> tx = optimizer_factory(r)(1e-3)
  """
  family, kwargs = _family_and_kwargs(recipe)

  def make(learning_rate, *, b2=None, eps=None, weight_decay=None):
    # b2, eps and weight_decay: the engines set them at each step (`Recipe.adam_scaling`).
    scaled = {k: v for k, v in (("b2", b2), ("eps", eps), ("weight_decay", weight_decay))
              if v is not None}
    tx = family(learning_rate, **{**kwargs, **scaled})
    if recipe.grad_clip_norm is None:
      return tx
    return optax.chain(optax.clip_by_global_norm(recipe.grad_clip_norm), tx)

  try:
    make(recipe.learning_rate)  # a bad option fails here, not inside the first step
  except TypeError as error:
    raise TypeError(f"optimizer_options of the {recipe.optimizer!r} optimizer: "
                    f"{error}") from error
  return make


def _family_and_kwargs(recipe: Recipe) -> tuple[Callable[..., Any], dict[str, Any]]:
  """The optimizer family and every keyword it takes: the recipe's fields, then its options."""
  family, kwargs = _FAMILIES[recipe.optimizer](recipe)
  for key in recipe.optimizer_options:
    if key in kwargs:
      raise ValueError(f"optimizer_options[{key!r}] duplicates a Recipe field; set the "
                       f"field instead.")
  return family, {**kwargs, **recipe.optimizer_options}


# The keywords of `transforms.lars` that its trust ratios read (`transforms.lars_trust_ratios`).
_TRUST_RATIO_KEYWORDS = ("weight_decay", "trust_coefficient", "eps", "mode", "mask", "axis_name")


def noise_leaf_scales(recipe: Recipe, params: Any, opt_state: Any = None
                      ) -> Callable[[Any], Any] | None:
  """What the recipe measures its noise scale through (`Recipe.noise_of`), for
  `grouped_value_and_grad` / `cross_replica_sq_norms`'s `leaf_scales=`.

  None when it measures the gradient (`Recipe.measured_noise_of`). For
  "lars_step" (and "auto" on plain LARS), `fn(mean_grads)`: each leaf's LARS
  trust ratio λ_l at `params`, 1 on the leaves the mask leaves out, with the
  recipe's optimizer's own settings (You et al. 2017, eq. 6). The measured
  norms are then Σ_l λ_l²·|g_l|², those of the gradient part of LARS's step
  λ_l·(g_l + β·w_l) (the weight-decay part carries no noise): AdaScale's
  gain (Johnson et al. 2020) is defined for the step an optimizer takes, and
  LARS's step is not its gradient. For "adam_step", `fn` gives Adam's
  per-coordinate preconditioner 1/(√v̂ + ε) read from `opt_state`
  (`adam_preconditioner`): the norms are those of the gradient in the metric
  Adam steps in.

  Example:
    >>> import jax.numpy as jnp
    >>> r = Recipe(batch_size=256, num_examples=50_000, num_epochs=10, learning_rate=1.0,
    ...            optimizer="lars", base_batch_size=32, noise_of="lars_step")
    >>> params = {"kernel": jnp.array([[3.0], [4.0]]), "bias": jnp.zeros(1)}
    >>> scales = noise_leaf_scales(r, params)({"kernel": jnp.array([[0.6], [0.8]]),
    ...                                        "bias": jnp.ones(1)})
    >>> round(float(scales["kernel"]), 6), float(scales["bias"])   # 0.001 · 5 / 1; masked
    (0.005, 1.0)
  """
  measured = recipe.measured_noise_of
  if measured == "gradient":
    return None
  if measured == "adam_step":
    eps = 1e-8 if recipe.eps is None else recipe.eps  # optax.adam's default
    scales = adam_preconditioner(opt_state, b2=recipe.b2, eps=eps)
    return lambda grads: scales
  _, lars_kwargs = _family_and_kwargs(recipe)
  kwargs = {key: value for key, value in lars_kwargs.items() if key in _TRUST_RATIO_KEYWORDS}
  return lambda grads: transforms.lars_trust_ratios(grads, params, **kwargs)


def adam_preconditioner(opt_state: Any, *, b2: float, eps: float) -> Any:
  """Adam's per-coordinate factor 1/(√v̂ + ε), v̂ = ν/(1 − b2^t), from an optimizer state.

  Reads the first `optax.ScaleByAdamState` in `opt_state` (any chain or
  wrapper around `optax.adam`/`optax.adamw`; a Flax nnx `Optimizer` or its
  `opt_state` too, `as_optax_state`). Before the first update (t = 0)
  v̂ is undefined and every factor is 1: the plain gradient. Kingma & Ba 2015.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> state = optax.adam(1e-3).init({"w": jnp.zeros(2)})
    >>> adam_preconditioner(state, b2=0.999, eps=1e-8)["w"].tolist()   # t = 0
    [1.0, 1.0]
  """
  found = [leaf for leaf in jax.tree.leaves(
      as_optax_state(opt_state), is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
           if isinstance(leaf, optax.ScaleByAdamState)]
  if not found:
    raise ValueError("noise_of='adam_step' reads Adam's second moments from the optimizer "
                     "state; pass the state of an adam or adamw optimizer as opt_state.")
  count, nu = found[0].count, found[0].nu
  debias = 1.0 - jnp.power(jnp.asarray(b2, jnp.float32), count)
  factor = lambda v: jnp.where(count > 0, 1.0 / (jnp.sqrt(v / jnp.maximum(debias, 1e-30)) + eps),
                               jnp.ones_like(v))
  return jax.tree.map(factor, nu)


def _eps(recipe: Recipe) -> dict[str, float]:
  """`eps` only when the recipe sets it: None keeps the family's default."""
  return {} if recipe.eps is None else {"eps": recipe.eps}


def _decay_mask(recipe: Recipe) -> Callable[[Any], Any]:
  """optax's mask form (params -> bool tree) of the recipe's named/regex mask."""
  mask = masks.from_name(recipe.mask)
  return lambda params: masks.resolve(mask, params)


def _with_coupled_decay(recipe: Recipe, family: OptimizerFactory) -> Callable[..., Any]:
  """`family`, after adding `weight_decay·w` (masked) to the gradient."""

  def factory(learning_rate, **kwargs):
    if recipe.weight_decay == 0.0:
      return family(learning_rate, **kwargs)
    return optax.chain(optax.add_decayed_weights(recipe.weight_decay, _decay_mask(recipe)),
                       family(learning_rate, **kwargs))

  return factory


def _sgd(recipe):
  momentum = None if recipe.optimizer == "sgd" else recipe.momentum
  return _with_coupled_decay(recipe, optax.sgd), {
      "momentum": momentum, "nesterov": recipe.optimizer == "nesterov"}


def _adam(recipe):
  return _with_coupled_decay(recipe, optax.adam), {
      "b1": recipe.b1, "b2": recipe.b2, **_eps(recipe)}


def _adamw(recipe):
  return optax.adamw, {"b1": recipe.b1, "b2": recipe.b2, **_eps(recipe),
                       "weight_decay": recipe.weight_decay,
                       "mask": _decay_mask(recipe)}


def _lars(recipe):
  return transforms.lars, {"momentum": recipe.momentum,
                           "weight_decay": recipe.weight_decay,
                           "trust_coefficient": recipe.trust_coefficient,
                           **_eps(recipe), "mask": masks.from_name(recipe.mask)}


def _lamb(recipe):
  return transforms.lamb, {"b1": recipe.b1, "b2": recipe.b2, **_eps(recipe),
                           "weight_decay": recipe.weight_decay,
                           "mask": masks.from_name(recipe.mask)}


# Adding a family: an entry here and its fields in recipe.OPTIMIZERS / _OPTIMIZER_FIELDS.
_FAMILIES = {"sgd": _sgd, "momentum": _sgd, "nesterov": _sgd, "adam": _adam,
             "adamw": _adamw, "lars": _lars, "lamb": _lamb}
