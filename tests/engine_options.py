"""Tests' way to the engine's knobs by the names its arithmetic tests read.

`date.EngineConfig` derives every decay, count and band from its eight fields. An
arithmetic test wants some of them set on their own: both noise EMAs at decay 0
(each holds the last reading, so a gain is hand arithmetic), a growth interval
that never comes, a patience of 15. `config(**values)` gives such a config: a
subclass of `EngineConfig` whose named derived values are fixed, the fields as given.
`options(**kwargs)` turns `adaptive`'s keyword arguments, with those names among
them, into the ones it takes (`config=`, `watch=`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from dateopt import date

_FIELDS = frozenset(f.name for f in dataclasses.fields(date.EngineConfig))


@functools.cache
def _fixed(derived: tuple[tuple[str, Any], ...]) -> type:
  """An `EngineConfig` subclass whose `derived` values are constants."""
  for name, _ in derived:
    if not isinstance(getattr(date.EngineConfig, name, None), property):
      raise AttributeError(f"EngineConfig has no derived value {name!r}")
  return type("FixedEngineConfig", (date.EngineConfig,),
              {name: property(lambda self, v=value: v) for name, value in derived})


def config(**values) -> date.EngineConfig:
  """An `EngineConfig` with `values`: fields as given, derived values fixed.

  `signal_decay=None` gives the |G|² EMA the tr Σ EMA's decay (one horizon).
  """
  if values.get("signal_decay", 0.0) is None:
    values["signal_decay"] = values.get("noise_decay", date.EngineConfig().noise_decay)
  given = {k: v for k, v in values.items() if k in _FIELDS}
  derived = tuple(sorted((k, v) for k, v in values.items() if k not in _FIELDS))
  return _fixed(derived)(**given) if derived else date.EngineConfig(**given)


def options(**kwargs) -> dict[str, Any]:
  """`kwargs` with the engine's knobs (`noise_decay`, `signal_decay`, `growth_interval`,
  `step_price`, `noise_batch_exponent`, `divergence_patience`, ...) gathered in `config=`
  and `divergence_patience=None` as `watch=False`."""
  knobs = {k: kwargs.pop(k) for k in list(kwargs)
           if k in _FIELDS or isinstance(getattr(date.EngineConfig, k, None), property)
           or k == "divergence_patience"}
  if "divergence_patience" in knobs:
    patience = knobs.pop("divergence_patience")
    if patience is None:
      kwargs["watch"] = False
    else:
      knobs["patience"] = patience
  knobs.update(kwargs.pop("config", None) or {})  # a config given as a mapping joins them
  if knobs:
    kwargs["config"] = config(**knobs)
  return kwargs
