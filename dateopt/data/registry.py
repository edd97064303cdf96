"""`get_dataset`: every dataset by name, with its arguments checked before any I/O."""

from __future__ import annotations

from typing import Any, Callable

from dateopt.data.base import Dataset
from dateopt.data.offline import build_digits, build_fake_images, build_mnist1d
from dateopt.data.text import build_ptb, build_shakespeare, build_text_files, build_tfds_text
from dateopt.data.tfds_sources import build_imagenet2012, build_mnist
from dateopt.validation import check_choice


# tfds_sources (and text, for tfds_text) import tensorflow-datasets, grain and PIL only
# inside their builders, so they load only when a TFDS dataset is asked for.
_BUILDERS: dict[str, Callable[..., Dataset]] = {
    "mnist1d": build_mnist1d,
    "digits": build_digits,
    "mnist": build_mnist,
    "imagenet2012": build_imagenet2012,
    "ptb": build_ptb,
    "shakespeare": build_shakespeare,
    "text_files": build_text_files,
    "tfds_text": build_tfds_text,
    "fake_images": build_fake_images,
}
#: The names `get_dataset` knows.
DATASET_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def get_dataset(name: str, /, *, data_dir: str | None = None, **kwargs: Any) -> Dataset:
  """Builds a dataset by name; missing files fail here, before any model compiles.

  Names and their keyword arguments:
    - "mnist1d": MNIST-1D (Greydanus 2020) generated offline by the `mnist1d`
      package and cached: `num_samples` (10,000: 8,000 train / 2,000 test),
      `seed` (42), `cache_dir` (~/.cache/dateopt/mnist1d; `data_dir` also
      works), and the training augmentation `augment_shift`, `augment_scale`,
      `augment_noise` (0: off). Inputs (40, 1).
    - "digits": scikit-learn's 8x8 digits in [0, 1]: `seed` (0),
      `test_fraction` (0.2), `layout` ("image" (8, 8, 1) or "sequence" (8, 8)),
      and the same `augment_*` arguments as "mnist1d".
    - "mnist": TFDS MNIST in [0, 1]: `layout` ("image" (28, 28, 1) or
      "sequence" (28, 28)), `train_split`, `eval_split`, `num_threads`.
    - "imagenet2012": TFDS ImageNet with Inception crop + flip (train) and
      resize + center crop (eval), uint8 (the model normalises them):
      `image_size` (224), `train_split`, `eval_split`, `num_workers` (one per
      core), `prefetch_examples` (512), `max_undecodable_records` (0: a record
      that does not decode stops the run; N: up to N per split are skipped).
    - "ptb": PTB-format text files in `data_dir`: `seq_len` (35),
      `eval_split` ("valid" or "test").
    - "shakespeare": the 42 Gutenberg works of Shakespeare as UTF-8 bytes
      (256 classes, a 0 byte ends each work), prepared once by `python
      scripts/prepare_data.py shakespeare` into `data_dir`
      (~/.cache/dateopt/shakespeare): `seq_len` (128), `eval_share` (0.1 of
      the works held out, chosen by name hash). Inputs (seq_len,) int32.
    - "text_files": every file matching `pattern` (`*.txt`) under `data_dir`
      (recursively) as one document of bytes, as "shakespeare": `seq_len`
      (128), `eval_share` (0.1), `pattern`.
    - "tfds_text": a prepared TFDS text dataset as bytes, one record one
      document, tfds's own splits: `name` (e.g. "tiny_shakespeare", "lm1b"),
      `seq_len` (128), `train_split` ("train"), `eval_split` ("validation"),
      `text_key` ("text").
      The three byte corpora also take `eval_windows` (None: evaluate on
      every validation window; N: on N windows spread evenly over them).
    - "fake_images": random images for benchmarks: `image_shape`,
      `num_classes`, `num_train_examples`, `num_eval_examples`, `pool_size`,
      `uint8` (False: float32 that looks normalised; True: uint8 pixels the
      model normalises, as imagenet2012's).

  Args:
    name: one of `DATASET_NAMES` (positional only, so "tfds_text" can take
      its own `name=`).
    data_dir: where the data lives (TFDS data dir, PTB or text directory,
      MNIST-1D or Shakespeare cache); None for each dataset's default.
      Ignored by digits and fake_images.
    **kwargs: dataset-specific arguments, listed above; passed straight to
      the dataset's builder.

  Raises:
    ValueError: unknown name (listing the allowed ones) or bad value (naming
      it).
    TypeError: Python's own, for a keyword argument the dataset's builder
      does not take: "build_ptb() got an unexpected keyword argument 'foo'".
    FileNotFoundError: the dataset's files are not where it looked (the
      message names the dataset and the path).

  Example:
    >>> ds = get_dataset("mnist1d", num_samples=5000)
    >>> batch = ds.train_batch(0, 128, seed=0)
  """
  check_choice("dataset name", name, DATASET_NAMES)
  try:
    return _BUILDERS[name](data_dir=data_dir, **kwargs)
  except OSError as error:  # an unreadable or unwritable data_dir: say which field it was
    if data_dir is None or "data_dir" in str(error):
      raise
    raise type(error)(f"data_dir={data_dir!r} of dataset {name!r}: "
                      f"{error.strerror or error}.") from error
