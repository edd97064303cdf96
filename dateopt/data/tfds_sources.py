"""TFDS datasets read through `tfds.data_source` (ArrayRecord random access), no TensorFlow.

`tfds.data_source` gives random access to the decoded examples of a prepared
dataset without TensorFlow; grain threads prepare batches ahead (see
`base.map_in_order`). tensorflow-datasets, grain and PIL are imported only
when one of these datasets is built.

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
from dateopt.data.base import AugmentKey, Batch, Dataset, example_rng, image_layout
from dateopt.validation import check_range, check_type

DEFAULT_NUM_THREADS = 4


def _import_tfds():
  return extras.require("tensorflow_datasets", extra="data")  # no TensorFlow needed


def open_tfds_split(name: str, split: str, data_dir: str | None) -> Sequence[dict[str, Any]]:
  """Random access to one split of a prepared TFDS dataset; never downloads.

  Raises:
    FileNotFoundError: naming the dataset and directory, when the split is not
      prepared there (in array_record format).

  Example:
    >>> records = open_tfds_split("mnist", "test", data_dir=None)  # doctest: +SKIP
  """
  tfds = _import_tfds()
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
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
  """An `ExampleSource` over TFDS image records, preprocessed one example at a time.

  `eval_fn(image)` is the deterministic preprocessing; `train_fn(image, rng)`,
  when given, the augmentation used when `gather` receives an augment key, and
  `weak_fn(image, rng)` the one for a key of level "weak" (default: `eval_fn`).
  """

  def __init__(self, records: Sequence[dict[str, Any]], eval_fn: Callable[[np.ndarray], np.ndarray],
               train_fn: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
               weak_fn: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None):
    self._records = records
    self._eval_fn = eval_fn
    self._augment_fns = {"full": train_fn, "weak": weak_fn}

  def __len__(self) -> int:
    return len(self._records)

  def gather(self, indices: np.ndarray, augment_key: AugmentKey | None) -> Batch:
    augment_fn = None if augment_key is None else self._augment_fns[augment_key.level]
    inputs, labels = [], []
    for index in indices:
      record = self._records[int(index)]
      if augment_fn is None:
        inputs.append(self._eval_fn(record["image"]))
      else:
        inputs.append(augment_fn(record["image"], example_rng(augment_key, index)))
      labels.append(record["label"])
    return {"inputs": np.stack(inputs), "labels": np.asarray(labels, np.int32)}


def _check_num_threads(num_threads: int) -> None:
  check_type("num_threads", num_threads, int, "a non-negative int")
  check_range("num_threads", num_threads, low=0)


def build_mnist(*, data_dir: str | None = None, layout: str = "image", train_split: str = "train",
                eval_split: str = "test", num_threads: int = DEFAULT_NUM_THREADS) -> Dataset:
  """MNIST from TFDS, pixels scaled to [0, 1]: (28, 28, 1), or 28 rows of 28 ("sequence").

  Example:
    >>> ds = build_mnist(layout="sequence")  # doctest: +SKIP
  """
  _check_num_threads(num_threads)
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
                       num_threads: int = DEFAULT_NUM_THREADS) -> Dataset:
  """ImageNet-1k from TFDS with the standard ResNet preprocessing, normalised float32 HWC.

  Train: Inception crop to image_size, random flip. Eval (and train with
  augment=False): shorter side to image_size * 256 / 224, center crop. Weak
  (augment="weak"): the eval crop, then a random flip.
  Both subtract the ImageNet mean and divide by the std (0-255 scale).

  Example:
    >>> ds = build_imagenet2012(data_dir="/data/tfds")  # doctest: +SKIP
  """
  from dateopt.data import image_ops  # pylint: disable=g-import-not-at-top  (needs PIL)

  _check_num_threads(num_threads)
  check_type("image_size", image_size, int, "a positive int")
  check_range("image_size", image_size, low=1)

  def eval_fn(image):
    return image_ops.preprocess_eval_image(image, image_size)

  def train_fn(image, rng):
    return image_ops.preprocess_train_image(image, image_size, rng)

  def weak_fn(image, rng):
    return image_ops.preprocess_weak_image(image, image_size, rng)

  train = TfdsImageSource(open_tfds_split("imagenet2012", train_split, data_dir), eval_fn,
                          train_fn, weak_fn)
  evaluation = TfdsImageSource(open_tfds_split("imagenet2012", eval_split, data_dir), eval_fn)
  return Dataset(name="imagenet2012", task="classification", num_classes=1000,
                 input_shape=(image_size, image_size, 3), input_dtype=np.dtype(np.float32),
                 train_source=train, eval_source=evaluation, num_threads=num_threads,
                 metadata={"mean": image_ops.IMAGENET_MEAN, "std": image_ops.IMAGENET_STD,
                           "train_split": train_split, "eval_split": eval_split})
