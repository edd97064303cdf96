"""The array (decode-first) image pipeline, in numpy + PIL: the tests' reference for
`dateopt.data.jpeg`, which crops while decoding.

Decode the whole image, then crop and resize it with PIL (bilinear, antialiased),
as torchvision and the MLPerf PyTorch reference do; normalise with ImageNet's
channel statistics.
"""

import numpy as np
from PIL import Image

from dateopt.data.image_ops import IMAGENET_MEAN, IMAGENET_STD, sample_inception_crop


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

def _squeeze_gray(image: np.ndarray) -> np.ndarray:
  # PIL wants (H, W) for one channel.
  return image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image

def _restore_channels(result: np.ndarray, original: np.ndarray) -> np.ndarray:
  return result[..., None] if original.ndim == 3 and result.ndim == 2 else result
