"""Datasets that need no download: MNIST-1D, scikit-learn's digits, fake images.

- MNIST-1D (Greydanus 2020, "Scaling down Deep Learning"): generated
  procedurally by the `mnist1d` package (`make_dataset`, never its downloading
  `get_dataset`) and cached as .npz, keyed by (num_samples, seed).
- digits: the 8x8 handwritten digits bundled with scikit-learn (1,797 images).
- fake_images: random images for throughput benchmarks; any length, cheap.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import numpy as np

from dateopt import extras
from dateopt.data.augment import ShiftScaleNoise
from dateopt.data import image_ops
from dateopt.data.base import ArraySource, AugmentKey, Batch, Dataset, image_layout
from dateopt.validation import check_range, check_type

MNIST1D_DEFAULT_CACHE_DIR = Path("~/.cache/dateopt/mnist1d")
MNIST1D_DEFAULT_NUM_SAMPLES = 10_000
MNIST1D_DEFAULT_SEED = 42  # the package's own default seed


def mnist1d_arrays(
    num_samples: int = MNIST1D_DEFAULT_NUM_SAMPLES, seed: int = MNIST1D_DEFAULT_SEED,
    cache_dir: str | os.PathLike | None = None) -> tuple[dict[str, np.ndarray], bool]:
  """MNIST-1D train/test arrays, generated once and then read from the cache.

  Uses the package's default generation arguments
  (`mnist1d.data.get_dataset_args()`: 40-step sequences, 80/20 train/test
  split) with `num_samples` and `seed` set. The package seeds Python's and
  numpy's global RNGs while generating; their states are restored afterwards.

  Args:
    num_samples: train + test examples (10 classes, num_samples // 10 each).
    seed: generation seed.
    cache_dir: where the .npz lives (default ~/.cache/dateopt/mnist1d).

  Returns:
    ({"x", "y", "x_test", "y_test"} as float32 (N, 40) / int32 (N,), from_cache).

  Example:
    >>> arrays, from_cache = mnist1d_arrays(num_samples=1000, cache_dir="/tmp/mnist1d")
  """
  mnist1d_data = extras.require("mnist1d.data", extra="data")

  args = mnist1d_data.get_dataset_args(as_dict=True)
  args.update(num_samples=num_samples, seed=seed)
  path = _mnist1d_cache_path(num_samples, seed, cache_dir)
  cached = _read_mnist1d_cache(path, args)
  if cached is not None:
    return cached, True
  generated = _generate_mnist1d(args)
  _write_npz_atomically(path, generated, args)
  return generated, False


def _mnist1d_cache_path(num_samples: int, seed: int, cache_dir) -> Path:
  cache_dir = Path(os.path.expanduser(cache_dir or MNIST1D_DEFAULT_CACHE_DIR))
  return cache_dir / f"mnist1d_n{num_samples}_seed{seed}.npz"


def _read_mnist1d_cache(path: Path, args: dict) -> dict[str, np.ndarray] | None:
  """The cached arrays, or None when absent or made with other generation arguments."""
  if not path.exists():
    return None
  with np.load(path) as stored:
    if str(stored["args_json"]) != json.dumps(args, sort_keys=True):
      return None
    return {key: stored[key] for key in ("x", "y", "x_test", "y_test")}


def _generate_mnist1d(args: dict) -> dict[str, np.ndarray]:
  mnist1d_data = extras.require("mnist1d.data", extra="data")

  python_state, numpy_state = random.getstate(), np.random.get_state()
  try:
    data = mnist1d_data.make_dataset(mnist1d_data.ObjectView(dict(args)))
  finally:
    random.setstate(python_state)
    np.random.set_state(numpy_state)
  return {"x": data["x"].astype(np.float32), "y": data["y"].astype(np.int32),
          "x_test": data["x_test"].astype(np.float32), "y_test": data["y_test"].astype(np.int32)}


def _write_npz_atomically(path: Path, arrays: dict[str, np.ndarray], args: dict) -> None:
  # Write then rename: a concurrent reader (another host or worker) never sees half a file.
  path.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz.tmp", delete=False) as tmp:
    np.savez(tmp, args_json=np.array(json.dumps(args, sort_keys=True)), **arrays)
  os.replace(tmp.name, path)


def build_mnist1d(*, data_dir: str | None = None, num_samples: int = MNIST1D_DEFAULT_NUM_SAMPLES,
                  seed: int = MNIST1D_DEFAULT_SEED, cache_dir: str | None = None,
                  augment_shift: int = 0, augment_scale: float = 0.0,
                  augment_noise: float = 0.0) -> Dataset:
  """MNIST-1D as 40-step sequences of one feature: inputs (40, 1) float32, 10 classes.

  `data_dir`, when given, is the cache directory (an alias of `cache_dir`).
  The default 10,000 samples give 8,000 train / 2,000 test; the paper's
  benchmark split (4,000 / 1,000) is `num_samples=5000`. Training batches are
  augmented when any `augment_*` is set (`augment.ShiftScaleNoise`): a shift
  of up to `augment_shift` steps, amplitude x U(1 ± `augment_scale`),
  Gaussian noise of std `augment_noise`.

  Example:
    >>> ds = build_mnist1d(num_samples=5000, augment_shift=4, augment_noise=0.2)
  """
  check_type("num_samples", num_samples, int, what="an int >= 20")
  check_range("num_samples", num_samples, low=20)
  check_type("seed", seed, int, what="a non-negative int")
  check_range("seed", seed, low=0)
  if data_dir is not None and cache_dir is not None and Path(data_dir) != Path(cache_dir):
    raise ValueError(f"mnist1d: data_dir ({data_dir}) and cache_dir ({cache_dir}) name the "
                     "same thing; give one.")
  arrays, from_cache = mnist1d_arrays(num_samples, seed, cache_dir or data_dir)
  return Dataset(
      name="mnist1d", task="classification", num_classes=10, input_shape=(40, 1),
      input_dtype=np.dtype(np.float32),
      train_source=ArraySource(arrays["x"][..., None], arrays["y"],
                               ShiftScaleNoise(augment_shift, augment_scale, augment_noise)),
      eval_source=ArraySource(arrays["x_test"][..., None], arrays["y_test"]),
      metadata={"from_cache": from_cache,
                "cache_path": str(_mnist1d_cache_path(num_samples, seed, cache_dir or data_dir))})


def build_digits(*, data_dir: str | None = None, seed: int = 0, test_fraction: float = 0.2,
                 layout: str = "image", augment_shift: int = 0, augment_scale: float = 0.0,
                 augment_noise: float = 0.0) -> Dataset:
  """scikit-learn's 8x8 digits scaled to [0, 1], with a stratified train/test split.

  Args:
    data_dir: unused (the data ships with scikit-learn).
    seed: seed of the train/test split.
    test_fraction: share of the 1,797 images held out.
    layout: "image" gives (8, 8, 1); "sequence" gives 8 rows of 8 features (8, 8).
    augment_shift, augment_scale, augment_noise: training augmentation
      (`augment.ShiftScaleNoise`: shifts in pixels, amplitude spread, noise
      std); all 0 (the default) is none.

  Example:
    >>> ds = build_digits(layout="sequence")
  """
  del data_dir
  load_digits = extras.require("sklearn.datasets", extra="data").load_digits
  train_test_split = extras.require("sklearn.model_selection", extra="data").train_test_split

  check_type("seed", seed, int, what="a non-negative int")
  check_range("seed", seed, low=0)
  check_range("test_fraction", test_fraction, low=0.0, high=1.0, low_inclusive=False,
              high_inclusive=False)
  digits = load_digits()
  images = image_layout((digits.images / 16.0).astype(np.float32)[..., None], layout)
  labels = digits.target.astype(np.int32)
  x_train, x_test, y_train, y_test = train_test_split(
      images, labels, test_size=test_fraction, random_state=seed, stratify=labels)
  return Dataset(name="digits", task="classification", num_classes=10,
                 input_shape=images.shape[1:], input_dtype=np.dtype(np.float32),
                 train_source=ArraySource(x_train, y_train, ShiftScaleNoise(
                     augment_shift, augment_scale, augment_noise)),
                 eval_source=ArraySource(x_test, y_test))


class FakeImageSource:
  """`num_examples` random images that cycle through a small pool: any length, cheap.

  Example i is pool[i % pool_size] with label i % num_classes. The pool is
  standard normal float32, or uniform uint8 pixels with `uint8`.
  """

  def __init__(self, num_examples: int, image_shape: tuple[int, ...], num_classes: int, *,
               pool_size: int, seed: int, uint8: bool = False):
    self._num_examples = num_examples
    self._num_classes = num_classes
    rng = np.random.default_rng(seed)
    shape = (pool_size,) + tuple(image_shape)
    self._pool = (rng.integers(0, 256, shape, dtype=np.uint8) if uint8
                  else rng.standard_normal(shape, dtype=np.float32))

  def __len__(self) -> int:
    return self._num_examples

  def gather(self, indices: np.ndarray, augment_key: AugmentKey | None) -> Batch:
    del augment_key
    indices = np.asarray(indices)
    return {"inputs": self._pool[indices % len(self._pool)],
            "labels": (indices % self._num_classes).astype(np.int32)}


def build_fake_images(*, data_dir: str | None = None,
                      image_shape: tuple[int, ...] = (224, 224, 3), num_classes: int = 1000,
                      num_train_examples: int = 1_281_167, num_eval_examples: int = 10_000,
                      pool_size: int = 64, uint8: bool = False) -> Dataset:
  """Random images for benchmarks (ImageNet-sized by default).

  float32 images that look normalised, or with `uint8` random pixels that the
  model normalises on the accelerator as it does imagenet2012's (the same
  input bytes and the same step).

  Example:
    >>> ds = build_fake_images(image_shape=(32, 32, 3), num_classes=10)
  """
  del data_dir
  image_shape = tuple(image_shape)
  if not image_shape or any(not isinstance(d, int) or d < 1 for d in image_shape):
    raise ValueError(f"image_shape must be a tuple of positive ints; got {image_shape!r}.")
  for name, value in [("num_classes", num_classes), ("num_train_examples", num_train_examples),
                      ("num_eval_examples", num_eval_examples), ("pool_size", pool_size)]:
    check_type(name, value, int, what="a positive int")
    check_range(name, value, low=1)
  check_type("uint8", uint8, bool, what="True or False")
  return Dataset(
      name="fake_images", task="classification", num_classes=num_classes,
      input_shape=image_shape, input_dtype=np.dtype(np.uint8 if uint8 else np.float32),
      train_source=FakeImageSource(num_train_examples, image_shape, num_classes,
                                   pool_size=pool_size, seed=0, uint8=uint8),
      eval_source=FakeImageSource(num_eval_examples, image_shape, num_classes,
                                  pool_size=pool_size, seed=1, uint8=uint8),
      input_normalization=image_ops.IMAGENET_NORMALIZATION if uint8 else None)
