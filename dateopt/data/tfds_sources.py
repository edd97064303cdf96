"""TFDS datasets read through `tfds.data_source` (ArrayRecord random access), no TensorFlow.

`tfds.data_source` gives random access to the examples of a prepared dataset
without TensorFlow. MNIST's are decoded by tfds, and grain threads prepare
its batches ahead (`base.map_in_order`); ImageNet's JPEGs are read encoded and
decoded into their crops in worker processes (`dateopt.data.jpeg`).
tensorflow-datasets, grain and PIL are imported only when one of these
datasets is built.

The datasets must already be prepared in the array_record format, once, by
`python scripts/prepare_data.py mnist --data_dir=DIR` (ImageNet: add
`--manual_dir=` the directory of its ILSVRC2012 archives). That step runs TFDS's
builders, which need TensorFlow: `pip install 'dateopt[prepare]'`.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

from dateopt import extras
from dateopt.data.base import (DEFAULT_PREFETCH_EXAMPLES, AugmentKey, Batch, Dataset,
                               default_num_workers, image_layout)
from dateopt.validation import check_range, check_type

DEFAULT_NUM_THREADS = 4


def _import_tfds():
  return extras.require("tensorflow_datasets", extra="data")  # no TensorFlow needed


def open_tfds_split(name: str, split: str, data_dir: str | None, *,
                    encoded_images: bool = False) -> Sequence[dict[str, Any]]:
  """Random access to one split of a prepared TFDS dataset; never downloads.

  With `encoded_images`, each record's "image" is the file's encoded bytes
  (tfds's own decoding skipped), for a decoder that crops as it decodes.

  Raises:
    FileNotFoundError: naming the dataset and directory, when the split is not
      prepared there (in array_record format).

  Example:
    >>> records = open_tfds_split("mnist", "test", data_dir=None)  # doctest: +SKIP
  """
  tfds = _import_tfds()
  try:
    decoders = {"image": tfds.decode.SkipDecoding()} if encoded_images else None
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False,
                            decoders=decoders)
  except Exception as error:  # a missing dataset surfaces as one of several tfds error types
    where = data_dir or os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets")
    manual = " --manual_dir=<dir of its ILSVRC2012 .tar files>" if name == "imagenet2012" else ""
    raise FileNotFoundError(
        f"TFDS dataset {name!r} (split {split!r}) is not prepared in array_record format under "
        f"{where}. Prepare it once with `python scripts/prepare_data.py {name} "
        f"--data_dir={where}{manual}` (in the dateopt repository; it needs TensorFlow: "
        f"pip install 'dateopt[prepare]'), or pass data_dir=. "
        f"({type(error).__name__}: {error})") from error


class TfdsImageSource:
  """An `ExampleSource` over TFDS image records, each preprocessed by `to_inputs(image)`.

  No augmentation: an augment key gives the same inputs as none (MNIST).
  """

  def __init__(self, records: Sequence[dict[str, Any]],
               to_inputs: Callable[[np.ndarray], np.ndarray]):
    self._records = records
    self._to_inputs = to_inputs

  def __len__(self) -> int:
    return len(self._records)

  def gather(self, indices: np.ndarray, augment_key: AugmentKey | None) -> Batch:
    del augment_key  # nothing random to draw
    records = [self._records[int(index)] for index in indices]
    return {"inputs": np.stack([self._to_inputs(record["image"]) for record in records]),
            "labels": np.asarray([record["label"] for record in records], np.int32)}


def _check_count(name: str, value: int) -> None:
  check_type(name, value, int, what="a non-negative int")
  check_range(name, value, low=0)


def build_mnist(*, data_dir: str | None = None, layout: str = "image", train_split: str = "train",
                eval_split: str = "test", num_threads: int = DEFAULT_NUM_THREADS) -> Dataset:
  """MNIST from TFDS, pixels scaled to [0, 1]: (28, 28, 1), or 28 rows of 28 ("sequence").

  Example:
    >>> ds = build_mnist(layout="sequence")  # doctest: +SKIP
  """
  _check_count("num_threads", num_threads)
  image_layout(np.zeros((28, 28, 1)), layout)  # validates `layout` before any I/O

  def to_inputs(image: np.ndarray) -> np.ndarray:
    return image_layout(image.astype(np.float32) / 255.0, layout)

  train = TfdsImageSource(open_tfds_split("mnist", train_split, data_dir), to_inputs)
  evaluation = TfdsImageSource(open_tfds_split("mnist", eval_split, data_dir), to_inputs)
  return Dataset(name="mnist", task="classification", num_classes=10,
                 input_shape=to_inputs(np.zeros((28, 28, 1), np.uint8)).shape,
                 input_dtype=np.dtype(np.float32), train_source=train, eval_source=evaluation,
                 num_threads=num_threads,
                 metadata={"train_split": train_split, "eval_split": eval_split})


def build_imagenet2012(*, data_dir: str | None = None, image_size: int = 224,
                       train_split: str = "train", eval_split: str = "validation",
                       num_workers: int | None = None,
                       prefetch_examples: int = DEFAULT_PREFETCH_EXAMPLES,
                       max_undecodable_records: int = 0) -> Dataset:
  """ImageNet-1k from TFDS with the standard ResNet preprocessing, as uint8 HWC images.

  Train: Inception crop to image_size, random flip. Eval (and train with
  augment=False): shorter side to image_size * 256 / 224, center crop. Weak
  (augment="weak"): the eval crop, then a random flip. The JPEGs are
  decoded at the scale their crop needs (`dateopt.data.jpeg`), one example at
  a time in `num_workers` processes (default: one per core). The model
  subtracts the ImageNet mean and divides by the std (0-255 scale) on the
  accelerator: the dataset's `input_normalization`.

  A record that does not decode stops the run with an `UndecodableRecordError`
  naming it; `max_undecodable_records` = N skips up to N per split instead, each
  replaced by the next decodable record (`jpeg.JpegSource`; counted in the
  dataset's `undecodable_records`).

  Example:
    >>> ds = build_imagenet2012(data_dir="/data/tfds")  # doctest: +SKIP
  """
  from dateopt.data import image_ops, jpeg  # pylint: disable=g-import-not-at-top  (PIL)

  num_workers = default_num_workers() if num_workers is None else num_workers
  _check_count("num_workers", num_workers)
  _check_count("max_undecodable_records", max_undecodable_records)
  check_type("image_size", image_size, int, what="a positive int")
  check_range("image_size", image_size, low=1)
  train, evaluation = (
      jpeg.JpegSource(open_tfds_split("imagenet2012", split, data_dir, encoded_images=True),
                      image_size, dataset="imagenet2012", split=split,
                      max_undecodable_records=max_undecodable_records)
      for split in (train_split, eval_split))
  return Dataset(name="imagenet2012", task="classification", num_classes=1000,
                 input_shape=(image_size, image_size, 3), input_dtype=np.dtype(np.uint8),
                 train_source=train, eval_source=evaluation, num_workers=num_workers,
                 prefetch_examples=prefetch_examples,
                 input_normalization=image_ops.IMAGENET_NORMALIZATION,
                 metadata={"mean": image_ops.IMAGENET_MEAN, "std": image_ops.IMAGENET_STD,
                           "train_split": train_split, "eval_split": eval_split})
