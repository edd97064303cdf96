"""The ImageNet recipe's numbers and random draws (no TensorFlow, no image library).

The standard ImageNet recipe of the large-batch papers (Goyal et al. 2017,
the MLPerf ResNet-50 reference): training images get an Inception-style
random-resized crop (Szegedy et al. 2015) and a random horizontal flip;
evaluation images are resized so the shorter side is 256 (for 224 crops) and
center-cropped. Both are then normalised with the ImageNet mean and std, on
the device (`Dataset.input_normalization`).

This module holds the draws and the sizes; `dateopt.data.jpeg` applies them
while decoding. Every random op takes a `numpy.random.Generator`, so a
pipeline can derive one per example from (seed, epoch, example index) and
stay reproducible under random access.

Example:
  >>> top, left, height, width = sample_inception_crop(375, 500, np.random.default_rng(0))
  >>> eval_resize_size(224)
  256
"""

from __future__ import annotations

import math

import numpy as np

# ImageNet channel statistics, in the 0-255 pixel scale.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255.0
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32) * 255.0
# The same as (mean, std) tuples: a Dataset's `input_normalization` for uint8 ImageNet inputs.
IMAGENET_NORMALIZATION = (tuple(IMAGENET_MEAN.tolist()), tuple(IMAGENET_STD.tolist()))

# Inception crop ranges (Szegedy et al. 2015), as in tf.image.sample_distorted_bounding_box
# callers and torchvision's RandomResizedCrop.
CROP_AREA_RANGE = (0.08, 1.0)
CROP_ASPECT_RANGE = (3.0 / 4.0, 4.0 / 3.0)
CROP_ATTEMPTS = 10


def sample_inception_crop(height: int, width: int, rng: np.random.Generator, *,
                          area_range: tuple[float, float] = CROP_AREA_RANGE,
                          aspect_range: tuple[float, float] = CROP_ASPECT_RANGE,
                          attempts: int = CROP_ATTEMPTS) -> tuple[int, int, int, int]:
  """Samples an Inception-style crop box (top, left, crop_height, crop_width).

  Up to `attempts` times, draws an area fraction from `area_range` and a
  log-uniform aspect ratio (width / height) from `aspect_range`, and keeps the
  first box that fits in the image. If none fits, falls back to the largest
  centered box whose aspect ratio is clamped to `aspect_range` (the whole
  image when its aspect is already inside the range), as torchvision does.

  Example:
    >>> box = sample_inception_crop(375, 500, np.random.default_rng(0))
  """
  area = height * width
  log_low, log_high = math.log(aspect_range[0]), math.log(aspect_range[1])
  for _ in range(attempts):
    target_area = area * rng.uniform(*area_range)
    aspect = math.exp(rng.uniform(log_low, log_high))
    crop_width = int(round(math.sqrt(target_area * aspect)))
    crop_height = int(round(math.sqrt(target_area / aspect)))
    if 0 < crop_width <= width and 0 < crop_height <= height:
      top = int(rng.integers(0, height - crop_height + 1))
      left = int(rng.integers(0, width - crop_width + 1))
      return top, left, crop_height, crop_width
  return _center_fallback_box(height, width, aspect_range)


def _center_fallback_box(height: int, width: int,
                         aspect_range: tuple[float, float]) -> tuple[int, int, int, int]:
  aspect = width / height
  if aspect < aspect_range[0]:
    crop_width, crop_height = width, int(round(width / aspect_range[0]))
  elif aspect > aspect_range[1]:
    crop_height, crop_width = height, int(round(height * aspect_range[1]))
  else:
    crop_height, crop_width = height, width
  return (height - crop_height) // 2, (width - crop_width) // 2, crop_height, crop_width


def random_flip_left_right(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Mirrors the image horizontally with probability 1/2.

  Example:
    >>> flipped = random_flip_left_right(np.zeros((4, 4, 3), np.uint8), np.random.default_rng(0))
  """
  return image[:, ::-1] if rng.random() < 0.5 else image


def eval_resize_size(image_size: int) -> int:
  """Shorter side before the eval center crop: 256 for 224, same ratio otherwise."""
  return int(round(image_size * 256 / 224))
