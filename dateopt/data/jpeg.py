"""JPEG examples decoded straight into their training or evaluation crop, as uint8.

The ResNet recipe's crops (Szegedy et al. 2015 for training; shorter side to
256, center 224 for evaluation: `image_ops`) cut away part of every image and
then shrink what is left. Two things make that cheap here:

- **One decode at the scale the crop needs.** libjpeg-turbo (through
  simplejpeg) can scale by 1/2, 1/4 or 1/8 inside the inverse DCT at no
  extra cost. The image is decoded at the smallest of those scales that
  still leaves the crop box at least as large as the output, so nothing is
  upsampled that the full decode would have had, and the resize that
  follows has a half, a quarter or an eighth as many pixels to read. (Its
  other scales, 3/8 to 7/8, decode more slowly than the full image: measured
  1.12 ms against 0.93 ms for a 500x375 JPEG at quality 90.)
- **One resize of the box, bilinear, with OpenCV.** The box is a view of the
  decoded image, resized by `cv2.resize` (INTER_LINEAR: bilinear at pixel
  centres, the resize of tf.data's ResNet pipeline, `tf.image.resize`): 0.12 ms
  for a 300-pixel box to 224, against 0.58 ms for PIL's antialiased bilinear
  (which adds little once the DCT has done every reduction by 2). The result
  stays uint8. Normalisation happens on the accelerator, inside the jitted
  step (`ResNet.input_normalization`), where it is free, and the batch
  crosses to the device at a quarter of float32's size.

Grayscale JPEGs come out as RGB. The few JPEGs libjpeg-turbo cannot convert
to RGB (CMYK), and non-JPEG bytes, are decoded by PIL instead. Bytes neither
decodes (a truncated file, an empty record, no image at all) stop the pipeline
with an `UndecodableRecordError` naming the record, or, up to a bound, are
skipped (`JpegSource.max_undecodable_records`).

Example:
  >>> import numpy as np, simplejpeg
  >>> data = simplejpeg.encode_jpeg(np.zeros((375, 500, 3), np.uint8))
  >>> train_crop(data, 224, np.random.default_rng(0)).shape
  (224, 224, 3)
  >>> eval_crop(data, 224).dtype
  dtype('uint8')
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import os
import re
import struct
import threading
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from PIL import Image

from dateopt import extras
from dateopt.data import image_ops
from dateopt.data.base import SKIPPED_KEY, AugmentKey, Batch, example_rng
from dateopt.data.errors import UndecodableRecordError, where_records_are
from dateopt.validation import check_range, check_same_length, check_type

Box = tuple[int, int, int, int]  # top, left, height, width in the full image's pixels
DCT_FACTORS = (1, 2, 4, 8)  # the reductions libjpeg-turbo does for free
# What the decoders raise for bytes that hold no image they can read: simplejpeg a
# ValueError, PIL an OSError (a truncated file; UnidentifiedImageError for no image) or,
# from some of its plugins, one of the others.
DECODE_ERRORS = (ValueError, OSError, SyntaxError, EOFError, IndexError, struct.error,
                 ZeroDivisionError, Image.DecompressionBombError)

_log = logging.getLogger(__name__)


def _simplejpeg():
  return extras.require("simplejpeg", extra="data")


def _cv2():
  cv2 = extras.require("cv2", extra="data")
  # One thread: the pipeline runs one example per worker process, a process per core.
  if cv2.getNumThreads() != 1:
    cv2.setNumThreads(1)
  return cv2


def image_size(data: bytes) -> tuple[int, int]:
  """(height, width) of an encoded image, read from its header only.

  Example:
    >>> import numpy as np, simplejpeg
    >>> image_size(simplejpeg.encode_jpeg(np.zeros((30, 40, 3), np.uint8)))
    (30, 40)
  """
  try:
    height, width, _, _ = _simplejpeg().decode_jpeg_header(data)
    return int(height), int(width)
  except ValueError:  # not a JPEG libjpeg-turbo reads: PIL reads the header
    with Image.open(io.BytesIO(data)) as image:
      return image.height, image.width


def decode_box(data: bytes, box: Box, size: int) -> np.ndarray:
  """The `box` of an encoded image, resized to size x size RGB uint8 (bilinear).

  The decode is scaled down by libjpeg-turbo by 2, 4 or 8 as far as the box
  allows without falling below `size` on either side; the box, scaled with
  it, is rounded to whole pixels of that decode (it moves by at most half
  the factor in the full image's pixels: under half an output pixel).

  Example:
    >>> import numpy as np, simplejpeg
    >>> data = simplejpeg.encode_jpeg(np.zeros((375, 500, 3), np.uint8))
    >>> decode_box(data, (0, 0, 375, 375), 64).shape
    (64, 64, 3)
  """
  return _decode_box(data, image_size(data), box, size)


def _decode_box(data: bytes, full_size: tuple[int, int], box: Box, size: int) -> np.ndarray:
  """`decode_box` with the image's (height, width) already read from its header."""
  height, width = full_size
  top, left, box_height, box_width = box
  factor = DCT_FACTORS[-1]
  while factor > 1 and min(box_height, box_width) < size * factor:
    factor //= 2
  image = _decode_at_least(data, math.ceil(height / factor), math.ceil(width / factor))
  scale_y, scale_x = image.shape[0] / height, image.shape[1] / width
  rows = _scaled_span(top, box_height, scale_y)
  columns = _scaled_span(left, box_width, scale_x)
  cv2 = _cv2()
  return cv2.resize(image[rows, columns], (size, size), interpolation=cv2.INTER_LINEAR)


def _scaled_span(start: int, length: int, scale: float) -> slice:
  """[start, start + length) in a decode scaled by `scale`, in whole pixels (at least one)."""
  first = round(start * scale)
  return slice(first, max(first + 1, round((start + length) * scale)))


def _decode_at_least(data: bytes, min_height: int, min_width: int) -> np.ndarray:
  """RGB uint8 at the smallest libjpeg-turbo scale (M/8) with both sides >= the minimums."""
  simplejpeg = _simplejpeg()
  try:
    return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=min_height,
                                  min_width=min_width)
  except ValueError:  # CMYK, or not a JPEG: PIL decodes it whole
    with Image.open(io.BytesIO(data)) as image:
      return np.asarray(image.convert("RGB"))


def eval_box(height: int, width: int, size: int) -> Box:
  """The evaluation crop in the full image: what "shorter side to 256, center 224" keeps.

  The same pixels a decode-first pipeline keeps (tests/image_reference.py), with its rounding
  (the resized sides and the crop's offset are whole pixels there), mapped
  back to the full image.

  Example:
    >>> eval_box(375, 500, 224)   # 224 / 256 of the shorter side
    (23, 85, 328, 328)
  """
  shorter = image_ops.eval_resize_size(size)
  scale = shorter / min(height, width)
  resized_height = max(shorter, int(round(height * scale)))
  resized_width = max(shorter, int(round(width * scale)))
  scale_y, scale_x = height / resized_height, width / resized_width
  top = round((resized_height - size) // 2 * scale_y)
  left = round((resized_width - size) // 2 * scale_x)
  return top, left, max(1, round(size * scale_y)), max(1, round(size * scale_x))


def train_crop(data: bytes, size: int, rng: np.random.Generator) -> np.ndarray:
  """Training example: an Inception crop to size x size, then a random flip (uint8).

  Example:
    >>> import numpy as np, simplejpeg
    >>> data = simplejpeg.encode_jpeg(np.zeros((375, 500, 3), np.uint8))
    >>> train_crop(data, 32, np.random.default_rng(0)).shape
    (32, 32, 3)
  """
  full_size = image_size(data)
  box = image_ops.sample_inception_crop(*full_size, rng)
  return _random_flip(_decode_box(data, full_size, box, size), rng)


def eval_crop(data: bytes, size: int) -> np.ndarray:
  """Evaluation example: the center crop of `eval_box`, resized to size x size (uint8)."""
  full_size = image_size(data)
  return _decode_box(data, full_size, eval_box(*full_size, size), size)


def weak_crop(data: bytes, size: int, rng: np.random.Generator) -> np.ndarray:
  """Weak augmentation (Merchant, Zoph & Cubuk 2020): the evaluation crop, randomly flipped."""
  return _random_flip(eval_crop(data, size), rng)


def _random_flip(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """`image_ops.random_flip_left_right`'s draw, flipped by OpenCV into a contiguous array.

  A reversed numpy view costs ~75 us per 224x224 image to copy later (3-byte
  runs); cv2.flip writes it in ~10 us.
  """
  return _cv2().flip(image, 1) if rng.random() < 0.5 else image


@dataclasses.dataclass(frozen=True, eq=False)
class JpegSource:
  """A `PerExampleSource` over records {"image": encoded bytes, "label": int}.

  With no augment key an example is `eval_crop`; with one of level "full"
  `train_crop`, of level "weak" `weak_crop`, their randomness drawn from
  `example_rng(augment_key, index)`. Inputs are (size, size, 3) uint8.

  A record whose image does not decode stops the pipeline with an
  `UndecodableRecordError` naming it (`dataset`, `split` and its index), unless
  `max_undecodable_records` allows more: then up to that many are skipped,
  each replaced by the next decodable record of the split (its image and
  label, cropped with the skipped record's randomness, so every run serves the
  same), logged once as a warning and counted (`undecodable_records`); one more
  stops the pipeline.

  Example:
    >>> import numpy as np, simplejpeg
    >>> records = [{"image": simplejpeg.encode_jpeg(np.zeros((40, 60, 3), np.uint8)),
    ...             "label": 3}]
    >>> JpegSource(records, image_size=32).example(0, None)["inputs"].shape
    (32, 32, 3)
  """

  records: Sequence[Mapping[str, Any]] = dataclasses.field(repr=False)
  image_size: int = 224
  dataset: str = ""
  split: str = ""
  max_undecodable_records: int = 0
  _undecodable: UndecodableRecords = dataclasses.field(init=False, repr=False)

  def __post_init__(self):
    check_type("max_undecodable_records", self.max_undecodable_records, int,
               what="a non-negative int")
    check_range("max_undecodable_records", self.max_undecodable_records, low=0)
    object.__setattr__(self, "_undecodable", UndecodableRecords(
        self.dataset, self.split, self.max_undecodable_records))

  def __len__(self) -> int:
    return len(self.records)

  @property
  def undecodable_records(self) -> int:
    """The undecodable records skipped so far (in worker processes too)."""
    return len(self._undecodable)

  def example(self, index: int, augment_key: AugmentKey | None) -> dict[str, Any]:
    index, skipped = int(index), []
    for offset in range(len(self)):
      served = (index + offset) % len(self)
      record = self.records[served]  # a failed read is no bad record: it is not caught
      try:
        example = self._crop(record, augment_key, index)
      except DECODE_ERRORS as error:
        reason = decode_failure(error)
        if self._undecodable.add(served, reason):  # raises past the bound
          skipped.append((served, reason))
        continue
      for bad, reason in skipped:
        self._undecodable.warn(bad, reason, served)
      if self.max_undecodable_records:  # the workers' batches carry it back
        example[SKIPPED_KEY] = np.int64(index if offset else -1)
      return example
    raise UndecodableRecordError(self.dataset, self.split, index,
                                 reason="no record of the split decodes",
                                 allowed=self.max_undecodable_records, found=len(self))

  def _crop(self, record: Mapping[str, Any], augment_key: AugmentKey | None,
            index: int) -> dict[str, Any]:
    """The example of `record`, with the randomness of example `index`."""
    data, size = record["image"], self.image_size
    if not len(data):
      raise ValueError("the image is empty (0 bytes)")
    if augment_key is None:
      image = eval_crop(data, size)
    else:
      crop = train_crop if augment_key.level == "full" else weak_crop
      image = crop(data, size, example_rng(augment_key, index))
    return {"inputs": image, "labels": np.int32(record["label"])}

  def count_skipped(self, indices: Iterable[int]) -> None:
    """Counts records that worker processes skipped; raises past the bound, as they would."""
    for index in indices:
      self._undecodable.add(int(index), "its decode failed in a data worker process, whose "
                            "warning names the decoder's error")

  def gather(self, indices: np.ndarray, augment_key: AugmentKey | None) -> Batch:
    examples = [self.example(int(index), augment_key) for index in indices]
    return {"inputs": np.stack([example["inputs"] for example in examples]),
            "labels": np.array([example["labels"] for example in examples], np.int32)}


class UndecodableRecords:
  """The undecodable records one source has met, against its bound (thread-safe, pickles)."""

  def __init__(self, dataset: str, split: str, allowed: int):
    self.dataset, self.split, self.allowed = dataset, split, allowed
    self._found: set[int] = set()
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return len(self._found)

  def __getstate__(self):
    return {key: value for key, value in self.__dict__.items() if key != "_lock"}

  def __setstate__(self, state):
    self.__dict__.update(state, _lock=threading.Lock())

  def add(self, index: int, reason: str) -> bool:
    """Counts record `index`: True the first time.

    Raises:
      UndecodableRecordError: when it is one more than `allowed` (any, with the skip off).
    """
    with self._lock:
      if index in self._found:
        return False
      if len(self._found) >= self.allowed:
        raise UndecodableRecordError(self.dataset, self.split, index, reason=reason,
                                     allowed=self.allowed, found=len(self._found) + 1)
      self._found.add(index)
      return True

  def warn(self, index: int, reason: str, replacement: int) -> None:
    _log.warning("%s: record %d cannot be decoded (%s); replaced by record %d (skipped: "
                 "max_undecodable_records=%d)", where_records_are(self.dataset, self.split),
                 index, reason, replacement, self.allowed)


def decode_failure(error: BaseException) -> str:
  """What the decoders said of bytes they could not read: both, when PIL was the fallback."""
  first = error.__context__
  if isinstance(first, ValueError) and not error.__suppress_context__:  # PIL after simplejpeg
    return f"libjpeg-turbo: {_said(first)}; PIL: {_said(error)}"
  return f"{type(error).__name__}: {_said(error)}"


def _said(error: BaseException) -> str:
  # PIL names the BytesIO it read, by address: nothing a reader can use.
  return re.sub(r" <_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", str(error))


@dataclasses.dataclass(frozen=True)
class JpegFiles(Sequence):
  """Records {"image": bytes, "label": int} read from image files (a `JpegSource`'s records).

  For a directory of JPEGs, and for `scripts/bench_input_pipeline.py`.

  Example:
    >>> records = JpegFiles(("a.jpg", "b.jpg"), (0, 1))  # doctest: +SKIP
  """

  paths: tuple[str, ...]
  labels: tuple[int, ...]

  def __post_init__(self):
    check_same_length(paths=self.paths, labels=self.labels)

  def __len__(self) -> int:
    return len(self.paths)

  def __getitem__(self, index):
    with open(os.fspath(self.paths[index]), "rb") as file:
      return {"image": file.read(), "label": self.labels[index]}
