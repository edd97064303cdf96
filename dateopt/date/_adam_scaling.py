"""The Adam family beyond the LR: β₂, ε and weight decay when the batch grows k-fold.

Three rules from the literature (`../shared/REFERENCE.md` §10), each an option
of `plan(..., adam_scaling=...)`, off by default:

  * "b2": β₂ keeps its half-life in examples (Marek et al., NeurIPS 2025):
    β₂' = β₂^k. Derived for a smaller batch; growing it drives β₂ down fast
    (0.99^64 ≈ 0.53), so β₂' is clamped at β₁ (or at β₂, if lower): the second
    moment never averages over fewer steps than the first.
  * "eps": ε' = ε/√k (Malladi et al., NeurIPS 2022, the square-root SDE rule).
  * "weight_decay": the AdamW timescale τ = B/(η·λ·D) held (Bergsma et al.,
    "Power Lines", 2025): λ' = λ · k / (η'/η). Decoupled decay only (adamw, lamb).

A static plan applies them at its batch; DATE's engine and the field's batch
schedules at every step, with the step's batch (k = B/B0) and the LR factor it
applied (η'/η: DATE's gain rule, a schedule's multiplier).

Example:
  >>> rules = rung_hyperparams(("b2", "eps"), b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)
  >>> {k: f"{float(v):.4g}" for k, v in rules(16.0, 4.0).items()}
  {'b2': '0.9841', 'eps': '2.5e-09'}
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Sequence

import jax.numpy as jnp
import optax

from dateopt.validation import check_choice

#: The rules `plan(..., adam_scaling=...)` knows (see the module docstring).
ADAM_SCALINGS = ("b2", "eps", "weight_decay")
#: The optimizer families they apply to: β₂ and ε are Adam's; the decay rule needs decoupled
#: weight decay.
ADAM_FAMILIES = ("adam", "adamw", "lamb")
DECOUPLED_DECAY = ("adamw", "lamb")
# ε where a recipe leaves it to the family (optax.adam's and dateopt.lamb's defaults).
DEFAULT_EPS = {"adam": 1e-8, "adamw": 1e-8, "lamb": 1e-6}


def check_rules(rules: Sequence[str], optimizer: str) -> tuple[str, ...]:
  """The rules as a tuple, each known and valid for `optimizer`."""
  rules = tuple(rules)
  for rule in rules:
    check_choice("adam_scaling", rule, ADAM_SCALINGS)
  if rules and optimizer not in ADAM_FAMILIES:
    raise ValueError(f"adam_scaling={rules} scales the Adam family ({', '.join(ADAM_FAMILIES)}); "
                     f"the optimizer is {optimizer!r}.")
  if "weight_decay" in rules and optimizer not in DECOUPLED_DECAY:
    raise ValueError(f"adam_scaling 'weight_decay' holds the AdamW timescale of decoupled weight "
                     f"decay ({', '.join(DECOUPLED_DECAY)}); {optimizer!r} adds it to the gradient.")
  return rules


def rung_hyperparams(rules: Sequence[str], *, b1: float, b2: float, eps: float,
                     weight_decay: float) -> Callable[..., dict]:
  """`fn(k, lr_factor) -> {name: value}`: the scaled hyper-parameters at batch k·B0 and LR
  η'/η = `lr_factor` (numbers or jax arrays), float32 arrays for `optax.inject_hyperparams`."""

  def at(k, lr_factor):
    k = jnp.asarray(k, jnp.float32)
    scaled = _scaled(rules, k, lr_factor, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                     maximum=jnp.maximum, sqrt=jnp.sqrt)
    return {name: jnp.asarray(value, jnp.float32) for name, value in scaled.items()}

  return at


def planned_values(rules: Sequence[str], *, k: float, lr_factor: float, b1: float, b2: float,
                   eps: float, weight_decay: float) -> dict[str, float]:
  """The static plan's values at batch k·B0 and LR factor η'/η (plain floats).

  Example:
    >>> planned_values(("b2", "weight_decay"), k=64, lr_factor=8.0, b1=0.9, b2=0.99,
    ...                eps=1e-8, weight_decay=0.1)
    {'b2': 0.9, 'weight_decay': 0.8}
  """
  return _scaled(rules, k, lr_factor, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                 maximum=max, sqrt=math.sqrt)


def _scaled(rules, k, lr_factor, *, b1, b2, eps, weight_decay, maximum, sqrt) -> dict:
  """The three rules, once, on floats (`max`, `math.sqrt`) or jax arrays (`jnp`'s)."""
  out = {}
  if "b2" in rules:
    out["b2"] = maximum(b2 ** k, min(b1, b2))
  if "eps" in rules:
    out["eps"] = eps / sqrt(k)
  if "weight_decay" in rules:
    out["weight_decay"] = weight_decay * k / lr_factor
  return out


def _check_takes_learning_rate(make_optimizer: Callable[..., Any]) -> None:
  """A clear error where `make_optimizer` has no `learning_rate` parameter, which
  `optax.inject_hyperparams` sets by name (as optax's own optimizers name it)."""
  try:
    parameters = inspect.signature(make_optimizer).parameters
  except (TypeError, ValueError):  # no signature to read (a builtin): let optax try
    return
  if "learning_rate" in parameters:
    return
  raise TypeError(f"make_optimizer must take the LR as `learning_rate` (as optax's optimizers "
                  f"do: `lambda learning_rate: optax.sgd(learning_rate)`); its parameters "
                  f"are {tuple(parameters)}.")


def injected(make_optimizer: Callable[..., optax.GradientTransformation],
             rung_hyperparams: Callable[..., dict] | None):
  """`(inner, set_step)`: `make_optimizer` under `optax.inject_hyperparams`, and
  `set_step(inner_state, lr, k=..., lr_factor=...)`, its state with the step's LR (and, with
  `rung_hyperparams`, the hyper-parameters of batch k·B0 and LR factor) set: how DATE's
  engine and the batch schedules drive their inner optimizer."""
  scaled = rung_hyperparams or (lambda k, lr_factor: {})
  _check_takes_learning_rate(make_optimizer)
  inner = optax.inject_hyperparams(make_optimizer)(learning_rate=0.0, **scaled(1.0, 1.0))

  def set_step(inner_state, lr, *, k, lr_factor):
    return optax.tree.set(inner_state, learning_rate=lr, **scaled(k, lr_factor))

  return inner, set_step
