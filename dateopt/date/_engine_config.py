"""`EngineConfig`: every knob of DATE's adaptive engine, eight fields, each with its principle.

Every threshold, count and EMA decay the engine reads is derived from these
fields (the properties below), so a user can move the engine by one named knob
and a recorded run says all of what steered it (`recipe.json`'s recipe, field
`engine`). The defaults reproduce the engine of `docs/results/engine_rules.md`
exactly: each derived value equals the constant it replaces, in float32.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from dateopt.validation import as_int, check_range, check_type


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """The adaptive engine's knobs (`date.adaptive(..., config=...)`, `Recipe.engine`).

  Attributes:
    horizon: the steps the engine remembers (h). The tr Σ EMA decays 1 − 1/h a
      step, the |G|² EMA 1 − 3/h (|G|² falls tenfold in training, so it needs
      a third of the horizon: McCandlish et al. 2018, App. A); a run without
      learning is judged after h losses; a diverged run is given up after h
      stalled steps; a gradient h times its expected norm (h² in squared norm)
      is an explosion, not noise; a reading moves an EMA at most
      `climb_share`, so it is clipped at 1 + h·climb_share times its expected size.
    warm_in: the measurements before any reading is trusted (w): the loss's start
      is the mean of the first w losses, the gain is set as measured for w
      measurements, readings are clipped after w, a diverged run's LR is looked at
      every w steps. The loss EMAs span 2w (decay 1 − 1/(2w)) and w/2 (1 − 2/w)
      steps; the growth rule looks every 2w steps, and a cut LR wins back ×2
      per 2w healthy steps.
    hold_share: the share of its gains a learnt run's loss may give back before the
      engine holds the gain at 1 and stops measuring (a rising loss's gradient is
      the run's own, not noise). A run has learnt once its loss fell 2·hold_share
      below its start; it still has not learnt at all above 1 − hold_share.
    climb_share: the smallest move that counts (c): a noise reading moves an EMA
      by at most c (it is clipped at 1 + h·c times its expected size), and a
      diverged run whose loss falls by c/3 of its start between two looks is
      recovering.
    gain_rise: the largest relative rise of the gain in one step once `warm_in`
      measurements are in (AdaScale's gain moves slowly on a healthy run).
    early_rungs: before the run has learnt, a growing batch climbs to at most this
      many times its first rung (a plateau's noise readings are not resolved).
    step_price: the growth rule's price of a step in examples of the largest batch:
      climb from B to B' once B·B' ≤ step_price·B_max·B_noise (McCandlish et al.
      2018's B* = √(λ·B_noise) at λ = step_price·B_max).
    noise_batch_exponent: α, a rung B below the largest reads B_noise × (B_max/B)^α
      (a smaller batch's hotter run reads less noise at equal progress); 0: as
      measured.

  The watch's bands are halvings and doublings of the run's own loss (a relapse
  gives back half its gains, a recovery is back within half of that, a blow-up
  doubles the start, a cut halves the LR): definitions, not knobs.

  Example:
    >>> config = EngineConfig()
    >>> config.noise_decay, config.signal_decay, config.growth_interval, config.learnt
    (0.99, 0.97, 20, 0.8)
    >>> EngineConfig(horizon=200).noise_decay
    0.995
  """

  horizon: int = 100
  warm_in: int = 10
  hold_share: float = 0.1
  climb_share: float = 0.03
  gain_rise: float = 0.25
  early_rungs: int = 16
  step_price: float = 1.0
  noise_batch_exponent: float = 0.2

  def __post_init__(self):
    for name in ("horizon", "warm_in", "early_rungs"):
      object.__setattr__(self, name, as_int(f"EngineConfig.{name}", getattr(self, name), low=1))
    # The |G|² EMA's decay 1 − 3/h must be a decay; the fast loss EMA's 1 − 2/w too.
    check_range("EngineConfig.horizon", self.horizon, low=3)
    check_range("EngineConfig.warm_in", self.warm_in, low=2)
    # A learnt run has fallen 2·hold_share below its start: below 1/2 that is a fall.
    check_range("EngineConfig.hold_share", self.hold_share, low=0.0, high=0.5,
                low_inclusive=False, high_inclusive=False)
    check_range("EngineConfig.climb_share", self.climb_share, low=0.0, high=self.hold_share,
                low_inclusive=False)
    check_range("EngineConfig.gain_rise", self.gain_rise, low=0.0, low_inclusive=False)
    check_range("EngineConfig.step_price", self.step_price, low=0.0, low_inclusive=False)
    check_range("EngineConfig.noise_batch_exponent", self.noise_batch_exponent,
                low=0.0, high=1.0)
    for name in ("hold_share", "climb_share", "gain_rise", "step_price",
                 "noise_batch_exponent"):
      object.__setattr__(self, name, float(getattr(self, name)))

  # The noise EMAs (`dateopt.date._noise`), per measured step.
  @property
  def noise_decay(self) -> float:
    return 1 - 1 / self.horizon

  @property
  def signal_decay(self) -> float:
    return 1 - 3 / self.horizon

  @property
  def reading_clip(self) -> float:
    return 1 + self.horizon * self.climb_share

  @property
  def gradient_jump(self) -> float:
    return float(self.horizon ** 2)

  def decays(self, measure_every_steps: int = 1) -> tuple[float, float]:
    """(tr Σ, |G|²) EMA decays per measurement when one step in `measure_every_steps` is
    measured: the horizons stay in steps.

    Example:
      >>> EngineConfig().decays(2)
      (0.9801, 0.9409)
    """
    every = as_int("measure_every_steps", measure_every_steps, low=1)
    return self.noise_decay ** every, self.signal_decay ** every

  # The gain and the ladder (`dateopt.date._progress`).
  @property
  def growth_interval(self) -> int:
    return 2 * self.warm_in

  # The divergence watch (`dateopt.date._divergence`).
  @property
  def patience(self) -> int:
    return self.horizon

  @property
  def loss_decay(self) -> float:
    return 1 - 1 / (2 * self.warm_in)

  @property
  def fast_decay(self) -> float:
    return 1 - 2 / self.warm_in

  @property
  def learnt(self) -> float:
    return 1 - 2 * self.hold_share

  @property
  def stall_drop(self) -> float:
    return 1 - self.hold_share

  @property
  def fall_share(self) -> float:
    return self.climb_share / 3

  # The watch's bands: halvings and doublings, definitions rather than knobs.
  @property
  def relapse(self) -> float:
    """A learnt run that gives back half its gains has relapsed."""
    return 0.5

  @property
  def recovered(self) -> float:
    """A diverged run back within half of that (a quarter of its gains) has recovered: the
    gap keeps a run at the threshold from flapping."""
    return self.relapse / 2

  @property
  def blow_up(self) -> float:
    """A loss at twice its start has blown up."""
    return 2.0

  @property
  def stall_progress(self) -> float:
    """A run judged for "no learning" has covered a quarter of the schedule (and a horizon)."""
    return 0.25

  @property
  def recovery_steps(self) -> int:
    return 2 * self.warm_in

  @property
  def min_lr_scale(self) -> float:
    """The LR scale after a horizon of halvings one warm-in apart: 2^-(h/w)."""
    return 0.5 ** (self.horizon / self.warm_in)

  def to_dict(self) -> dict[str, Any]:
    """The fields as plain JSON values (`recipe.json`).

    Example:
      >>> EngineConfig(step_price=2).to_dict()["step_price"]
      2.0
    """
    return dataclasses.asdict(self)


def engine_config(value: EngineConfig | Mapping[str, Any] | None, field: str = "engine"
                  ) -> EngineConfig:
  """`value` as an `EngineConfig`: one as it is, a mapping of its fields (an unknown key
  raises ValueError naming `field` and the allowed keys), None the defaults.

  Example:
    >>> engine_config({"horizon": 50}).noise_decay
    0.98
  """
  if value is None:
    return EngineConfig()
  if isinstance(value, EngineConfig):
    return value
  if callable(getattr(value, "to_dict", None)):  # an ml_collections ConfigDict
    value = value.to_dict()
  check_type(field, value, Mapping, what="an EngineConfig or a mapping of its fields")
  allowed = [f.name for f in dataclasses.fields(EngineConfig)]
  for key in value:
    if key not in allowed:
      raise ValueError(f"{field}: unknown field {key!r}; allowed: {', '.join(allowed)}.")
  return EngineConfig(**value)
