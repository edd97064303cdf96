"""Argument checks shared by every layer: errors name the field and the allowed values.

Checks run on Python numbers only. Traced values (inside `jax.jit` or
`optax.inject_hyperparams`) and schedules (callables) are left alone, so a
transform built from a schedule or an injected hyper-parameter still works.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable

import numpy as np


def _as_concrete_float(name: str, value: Any, allow_none: bool = True) -> float | None:
  """`value` as a float when it is a concrete real scalar; None when it cannot be
  checked here (a schedule, a jax array or tracer); TypeError for anything else
  (a string, a bool, a container). None is an unset optional: not checked,
  unless `allow_none=False` (a required argument: None would fail inside JAX)."""
  if value is None and allow_none:
    return None
  if callable(value) and not isinstance(value, (numbers.Number, np.ndarray)):
    return None
  if isinstance(value, numbers.Real) and not isinstance(value, bool):
    return float(value)
  if isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype,
                                                                          np.number):
    return float(value)
  if type(value).__module__.startswith("jax"):  # jax arrays, possibly traced
    return None
  raise TypeError(f"{name} must be a number (or a schedule); got {value!r} of type "
                  f"{type(value).__name__}.")


def check_range(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    finite: bool = True,
    allow_none: bool = True,
) -> None:
  """Raises ValueError naming `name` when a concrete `value` is outside the range.

  A non-number (a string, a list) raises TypeError; None (an unset optional)
  is not checked, unless `allow_none=False` (then TypeError); ±inf raises ValueError
  unless `finite=False` (a hyper-parameter of inf gives NaN updates).
  Schedules and jax arrays (possibly traced) are not checked.

  Example:
    >>> check_range("momentum", 0.9, low=0.0, high=1.0, high_inclusive=False)
  """
  number = _as_concrete_float(name, value, allow_none)
  if number is None:
    return
  if finite and math.isinf(number):
    raise ValueError(f"{name} must be finite, got {value!r}.")
  lo_ok = low is None or (number >= low if low_inclusive else number > low)
  hi_ok = high is None or (number <= high if high_inclusive else number < high)
  if math.isnan(number) or not (lo_ok and hi_ok):
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    interval = f"{'[' if low_inclusive and low is not None else '('}{lo}, {hi}{']' if high_inclusive and high is not None else ')'}"
    raise ValueError(f"{name} must be in {interval}, got {value!r}.")


def as_int(name: str, value: Any, *, low: int | None = None) -> Any:
  """`value` as an int, checked: ints, numpy integers and whole floats (16.0) pass.

  A bool or a non-number raises TypeError naming `name`; a fraction (2.5), or
  a value below `low`, ValueError. A jax array (possibly traced) is returned
  as it is: it cannot be checked here.

  Example:
    >>> as_int("batch_size", 16.0), as_int("batch_size", np.int64(16))
    (16, 16)
  """
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value[()]
  if type(value).__module__.startswith("jax"):
    return value
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
    raise TypeError(f"{name} must be an int; got {value!r} of type {type(value).__name__}.")
  if not isinstance(value, numbers.Integral) and not (math.isfinite(value)
                                                      and float(value).is_integer()):
    raise ValueError(f"{name} must be a whole number (an int); got {value!r}.")
  number = int(value)
  check_range(name, number, low=low)
  return number


def check_scalar(name: str, value: Any, *, what: str) -> None:
  """Raises ValueError naming `name` unless `value` (a number or an array, traced or
  not) is a scalar; `what` says what it stands for.

  Example:
    >>> check_scalar("value=", np.ones(3), what="the scalar loss")
    Traceback (most recent call last):
    ValueError: value= must be the scalar loss; got an array of shape (3,).
  """
  if np.ndim(value) != 0:
    raise ValueError(f"{name} must be {what}; got an array of shape {np.shape(value)}.")


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
  """Raises ValueError naming `name` and the allowed values when `value` is not one of them."""
  choices = tuple(choices)
  if value not in choices:
    allowed = ", ".join(repr(c) for c in choices)
    raise ValueError(f"{name} must be one of {allowed}; got {value!r}.")


def check_type(name: str, value: Any, types: type | tuple[type, ...], *, what: str) -> None:
  """Raises TypeError naming `name` when `value` is not an instance of `types`."""
  if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
    raise TypeError(f"{name} must be {what}; got {value!r} of type {type(value).__name__}.")


def _as_tuple(types):
  return types if isinstance(types, tuple) else (types,)


def check_same_length(**sequences: Any) -> None:
  """Raises ValueError naming each sequence's length when they differ.

  Example:
    >>> check_same_length(inputs=[1, 2, 3], labels=[0, 1])
    Traceback (most recent call last):
    ValueError: inputs (3) and labels (2) differ in length.
  """
  lengths = {name: len(value) for name, value in sequences.items()}
  if len(set(lengths.values())) > 1:
    shown = " and ".join(f"{name} ({length})" for name, length in lengths.items())
    raise ValueError(f"{shown} differ in length.")
