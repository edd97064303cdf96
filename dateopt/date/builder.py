"""`build(recipe) -> (optimizer, schedule)`: the optax optimizer a trainer uses."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import optax

from dateopt import masks, schedules, transforms
from dateopt.date.recipe import Recipe
from dateopt.validation import check_type


def build_schedule(recipe: Recipe) -> schedules.Schedule:
  """The recipe's learning-rate schedule (step -> LR), an optax schedule.

  A linear warmup from `warmup_init_lr` to `learning_rate` over
  `warmup_epochs`, then `decay` over the rest of `num_epochs`; epochs become
  steps with the recipe's batch size and drop_remainder policy.

  Example:
    >>> r = Recipe(batch_size=256, num_examples=50_000, num_epochs=10,
    ...            learning_rate=0.1, warmup_epochs=1)
    >>> float(build_schedule(r)(r.warmup_steps))
    0.1...
  """
  return schedules.epoch_schedule(
      recipe.learning_rate, recipe.warmup_epochs, recipe.num_epochs,
      recipe.num_examples, recipe.batch_size, recipe.decay,
      drop_remainder=recipe.drop_remainder,
      warmup_init_value=recipe.warmup_init_lr, power=recipe.decay_power,
      end_value=recipe.end_lr, decay_epochs=recipe.decay_epochs,
      rate=recipe.decay_rate, decay_every_epochs=recipe.decay_every_epochs)


def build(recipe: Recipe) -> tuple[optax.GradientTransformation, schedules.Schedule]:
  """The optimizer and LR schedule that `recipe` describes.

  Families: "sgd", "momentum", "nesterov" (`optax.sgd`, weight decay added to
  the gradient), "adam" (`optax.adam`, L2 weight decay added to the gradient),
  "adamw" (`optax.adamw`, decoupled), "lars" (`dateopt.lars`, You et al. 2017)
  and "lamb" (`dateopt.lamb`, You et al. 2019). `recipe.mask` selects the
  parameters that get weight decay (and the trust ratio for lars and lamb);
  `recipe.grad_clip_norm` prepends a global-norm clip;
  `recipe.optimizer_options` are passed to the family's factory.

  Args:
    recipe: the training recipe.

  Returns:
    `(tx, schedule)`: an optax GradientTransformation whose learning rate
    follows `schedule`, and the schedule itself (for logging).

  Example:
    >>> r = Recipe(batch_size=8192, num_examples=1_281_167, num_epochs=42,
    ...            learning_rate=17.0, optimizer="lars", warmup_epochs=5,
    ...            decay="polynomial", end_lr=1e-4, weight_decay=2e-4)
    >>> tx, schedule = build(r)
  """
  check_type("recipe", recipe, Recipe, "a dateopt.date.Recipe")
  schedule = build_schedule(recipe)
  factory, kwargs = _FAMILIES[recipe.optimizer](recipe)
  kwargs.update(_checked_options(recipe, factory, kwargs))
  tx = factory(schedule, **kwargs)
  if recipe.grad_clip_norm is not None:
    tx = optax.chain(optax.clip_by_global_norm(recipe.grad_clip_norm), tx)
  return tx, schedule


def _eps(recipe: Recipe) -> dict[str, float]:
  """`eps` only when the recipe sets it: None keeps the family's default."""
  return {} if recipe.eps is None else {"eps": recipe.eps}


def _decay_mask(recipe: Recipe) -> Callable[[Any], Any]:
  """optax's mask form (params -> bool tree) of the recipe's named/regex mask."""
  mask = masks.from_name(recipe.mask)
  return lambda params: masks.resolve(mask, params)


def _with_coupled_decay(recipe: Recipe, make: Callable[..., optax.GradientTransformation]):
  """A factory that adds `weight_decay·w` to the gradient, then runs `make`."""

  def factory(learning_rate, **kwargs):
    if recipe.weight_decay == 0.0:
      return make(learning_rate, **kwargs)
    return optax.chain(
        optax.add_decayed_weights(recipe.weight_decay, _decay_mask(recipe)),
        make(learning_rate, **kwargs))

  factory.__signature__ = inspect.signature(make)  # options are checked against make
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


_FAMILIES = {"sgd": _sgd, "momentum": _sgd, "nesterov": _sgd, "adam": _adam,
             "adamw": _adamw, "lars": _lars, "lamb": _lamb}


def _checked_options(recipe: Recipe, factory, kwargs: dict) -> dict[str, Any]:
  """`recipe.optimizer_options`, checked against the factory's signature."""
  accepted = set(inspect.signature(factory).parameters) - {"learning_rate"}
  for key in recipe.optimizer_options:
    if key in kwargs:
      raise ValueError(
          f"optimizer_options[{key!r}] duplicates a Recipe field; set the field "
          f"instead.")
    if key not in accepted:
      raise ValueError(
          f"optimizer_options[{key!r}] is not an argument of the "
          f"{recipe.optimizer!r} optimizer; accepted: {', '.join(sorted(accepted - set(kwargs)))}.")
  return dict(recipe.optimizer_options)
