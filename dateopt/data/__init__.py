"""Input pipelines: random-access, per-process batches for every dataset.

`get_dataset(name, ...)` returns a `Dataset` whose `train_batch(step, ...)`
is a pure function of (seed, step): checkpoint-resume and multi-host runs see
exactly the same data. Offline datasets (MNIST-1D, digits, fake images) need
nothing beyond numpy, scikit-learn and `mnist1d`; TFDS datasets (mnist,
imagenet2012) load tensorflow-datasets and grain only when asked for, and
never TensorFlow.

This package is independent of `dateopt.models` and `dateopt.train`.

Example:
  >>> from dateopt.data import get_dataset
  >>> ds = get_dataset("mnist1d", num_samples=5000)
  >>> batch = ds.train_batch(step=0, global_batch_size=128, seed=0)
  >>> batch["inputs"].shape, batch["labels"].shape
  ((128, 40, 1), (128,))
"""

from dateopt.data.base import (
    LAYOUTS,
    TASKS,
    ArraySource,
    Dataset,
    ExampleSource,
    epoch_permutation,
    example_rng,
    image_layout,
    process_rows,
)
from dateopt.data.errors import UndecodableRecordError, WorkerDiedError
from dateopt.data.registry import DATASET_NAMES, get_dataset

__all__ = [
    "ArraySource",
    "DATASET_NAMES",
    "Dataset",
    "ExampleSource",
    "LAYOUTS",
    "TASKS",
    "UndecodableRecordError",
    "WorkerDiedError",
    "epoch_permutation",
    "example_rng",
    "get_dataset",
    "image_layout",
    "process_rows",
]
