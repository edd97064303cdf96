"""Training augmentation for in-memory signals and small images: shift, scale, noise.

Three strengths, named by `AUGMENT_LEVELS`:
  - "full": the training augmentation;
  - "weak": the same operations at a quarter of their magnitude, for batch-norm
    statistics "from weakly augmented images" (Merchant, Zoph & Cubuk 2020,
    "Does data augmentation benefit from split BatchNorms?", found they
    helped where statistics from clean images did not);
  - "none": the evaluation-style (clean) preprocessing, as Final Polishing
    (Kasagi et al., HPDC 2020) trains its last epochs on.

Every example's randomness comes from its own generator (`example_rng`), so a
batch is a pure function of (seed, epoch, example index, strength).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dateopt.validation import check_choice, check_range, check_type

AUGMENT_LEVELS = ("full", "weak", "none")
# "weak" keeps this share of every magnitude (shift, scale spread, noise).
WEAK_STRENGTH = 0.25


def augment_level(augment: Any) -> str:
  """`augment` as one of `AUGMENT_LEVELS`: True is "full", False "none".

  Example:
    >>> augment_level(True), augment_level("weak"), augment_level(False)
    ('full', 'weak', 'none')
  """
  if augment is True:
    return "full"
  if augment is False or augment is None:
    return "none"
  check_choice("augment", augment, AUGMENT_LEVELS)
  return augment


@dataclasses.dataclass(frozen=True)
class ShiftScaleNoise:
  """Random shift (zero-filled), amplitude scaling and Gaussian noise, per example.

  Inputs are (L, C) signals (MNIST-1D) or (H, W, C) images: every axis but the
  last is shifted by its own integer in [-max_shift, max_shift]; the whole
  example is multiplied by a factor uniform in [1 - scale, 1 + scale]; noise of
  standard deviation `noise_std` is added.

  Example:
    >>> aug = ShiftScaleNoise(max_shift=3, scale=0.2, noise_std=0.1)
    >>> x = aug(np.ones((40, 1), np.float32), np.random.default_rng(0), "full")
  """

  max_shift: int = 0
  scale: float = 0.0
  noise_std: float = 0.0

  def __post_init__(self):
    check_type("augment_shift", self.max_shift, int, what="a non-negative int")
    check_range("augment_shift", self.max_shift, low=0)
    check_range("augment_scale", self.scale, low=0.0, high=1.0, high_inclusive=False)
    check_range("augment_noise", self.noise_std, low=0.0)

  @property
  def enabled(self) -> bool:
    return self.max_shift > 0 or self.scale > 0 or self.noise_std > 0

  def magnitudes(self, level: str) -> tuple[int, float, float]:
    """(max_shift, scale, noise_std) at strength `level`."""
    share = {"full": 1.0, "weak": WEAK_STRENGTH, "none": 0.0}[level]
    # A weak shift of at least one position whenever shifts are on at all.
    shift = 0 if share == 0 else max(int(round(self.max_shift * share)), min(self.max_shift, 1))
    return shift, self.scale * share, self.noise_std * share

  def __call__(self, example: np.ndarray, rng: np.random.Generator, level: str) -> np.ndarray:
    max_shift, scale, noise_std = self.magnitudes(level)
    out = np.asarray(example, np.float32)
    for axis in range(out.ndim - 1):
      if max_shift:
        out = _shift(out, int(rng.integers(-max_shift, max_shift + 1)), axis)
    if scale:
      out = out * np.float32(rng.uniform(1.0 - scale, 1.0 + scale))
    if noise_std:
      out = out + np.float32(noise_std) * rng.standard_normal(out.shape, dtype=np.float32)
    return out


def _shift(x: np.ndarray, offset: int, axis: int) -> np.ndarray:
  """`x` moved by `offset` positions along `axis`, the vacated positions zero."""
  if offset == 0:
    return x
  out = np.zeros_like(x)
  length = x.shape[axis]
  source = [slice(None)] * x.ndim
  target = [slice(None)] * x.ndim
  if offset > 0:
    source[axis], target[axis] = slice(0, length - offset), slice(offset, length)
  else:
    source[axis], target[axis] = slice(-offset, length), slice(0, length + offset)
  out[tuple(target)] = x[tuple(source)]
  return out
