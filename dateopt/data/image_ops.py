"""Per-example image preprocessing in numpy + PIL (no TensorFlow).

The standard ImageNet recipe of the large-batch papers (Goyal et al. 2017,
the MLPerf ResNet-50 reference): training images get an Inception-style
random-resized crop (Szegedy et al. 2015) and a random horizontal flip;
evaluation images are resized so the shorter side is 256 (for 224 crops) and
center-cropped. Both are then normalised with the ImageNet mean and std.

Every random op takes a `numpy.random.Generator`, so a pipeline can derive one
per example from (seed, epoch, example index) and stay reproducible under
random access.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

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


def crop_and_resize(image: np.ndarray, box: tuple[int, int, int, int], size: int) -> np.ndarray:
  """Crops `box` (top, left, height, width) from a uint8 HWC image and resizes it to size x size.

  Bilinear (antialiased) resampling with PIL, which crops and resizes in one pass.

  Example:
    >>> patch = crop_and_resize(np.zeros((50, 60, 3), np.uint8), (5, 5, 40, 40), 32)
  """
  top, left, crop_height, crop_width = box
  pil = Image.fromarray(_squeeze_gray(image))
  pil = pil.resize((size, size), Image.BILINEAR,
                   box=(left, top, left + crop_width, top + crop_height))
  return _restore_channels(np.asarray(pil), image)


def inception_crop(image: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  """Random-resized crop to size x size (the training crop of Szegedy et al. 2015).

  Example:
    >>> patch = inception_crop(np.zeros((375, 500, 3), np.uint8), 224, np.random.default_rng(0))
  """
  box = sample_inception_crop(image.shape[0], image.shape[1], rng)
  return crop_and_resize(image, box, size)


def random_flip_left_right(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Mirrors the image horizontally with probability 1/2.

  Example:
    >>> flipped = random_flip_left_right(np.zeros((4, 4, 3), np.uint8), np.random.default_rng(0))
  """
  return image[:, ::-1] if rng.random() < 0.5 else image


def resize_shorter_side(image: np.ndarray, shorter_side: int) -> np.ndarray:
  """Resizes so that min(height, width) == shorter_side, keeping the aspect ratio.

  Example:
    >>> resize_shorter_side(np.zeros((300, 400, 3), np.uint8), 256).shape
    (256, 341, 3)
  """
  height, width = image.shape[:2]
  scale = shorter_side / min(height, width)
  new_height = max(shorter_side, int(round(height * scale)))
  new_width = max(shorter_side, int(round(width * scale)))
  pil = Image.fromarray(_squeeze_gray(image)).resize((new_width, new_height), Image.BILINEAR)
  return _restore_channels(np.asarray(pil), image)


def center_crop(image: np.ndarray, size: int) -> np.ndarray:
  """The central size x size patch of an image at least that large.

  Example:
    >>> center_crop(np.zeros((256, 341, 3), np.uint8), 224).shape
    (224, 224, 3)
  """
  height, width = image.shape[:2]
  if height < size or width < size:
    raise ValueError(f"center_crop needs an image of at least {size}x{size}; got {height}x{width}.")
  top, left = (height - size) // 2, (width - size) // 2
  return image[top:top + size, left:left + size]


def normalize(image: np.ndarray, mean: np.ndarray = IMAGENET_MEAN,
              std: np.ndarray = IMAGENET_STD) -> np.ndarray:
  """(image - mean) / std per channel, as float32; mean and std in the 0-255 scale.

  Example:
    >>> normalize(np.full((2, 2, 3), 255, np.uint8)).dtype
    dtype('float32')
  """
  return (image.astype(np.float32) - mean) / std


def eval_resize_size(image_size: int) -> int:
  """Shorter side before the eval center crop: 256 for 224, same ratio otherwise."""
  return int(round(image_size * 256 / 224))


def preprocess_train_image(image: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  """Training preprocessing: inception crop, random flip, normalisation.

  Example:
    >>> x = preprocess_train_image(np.zeros((375, 500, 3), np.uint8), 224,
    ...                            np.random.default_rng(0))
  """
  return normalize(random_flip_left_right(inception_crop(image, size, rng), rng))


def preprocess_weak_image(image: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  """Weak augmentation: the evaluation resize and center crop, then a random flip.

  For batch-norm statistics from weakly augmented images (Merchant, Zoph &
  Cubuk 2020), between the training and the evaluation preprocessing.

  Example:
    >>> x = preprocess_weak_image(np.zeros((375, 500, 3), np.uint8), 224,
    ...                           np.random.default_rng(0))
  """
  cropped = center_crop(resize_shorter_side(image, eval_resize_size(size)), size)
  return normalize(random_flip_left_right(cropped, rng))


def preprocess_eval_image(image: np.ndarray, size: int) -> np.ndarray:
  """Evaluation preprocessing: resize the shorter side, center crop, normalisation.

  Example:
    >>> preprocess_eval_image(np.zeros((375, 500, 3), np.uint8), 224).shape
    (224, 224, 3)
  """
  return normalize(center_crop(resize_shorter_side(image, eval_resize_size(size)), size))


def _squeeze_gray(image: np.ndarray) -> np.ndarray:
  # PIL wants (H, W) for one channel.
  return image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image


def _restore_channels(result: np.ndarray, original: np.ndarray) -> np.ndarray:
  return result[..., None] if original.ndim == 3 and result.ndim == 2 else result
