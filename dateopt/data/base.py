"""The `Dataset` every pipeline returns: random-access, per-process batches.

A dataset is two random-access example sources (train, eval) plus the index
arithmetic that turns (seed, global step) into the rows of one batch. The
batch for a step is a pure function of (seed, step, batch size, process), so
resuming from a checkpoint at step k replays exactly the batches an
uninterrupted run would have seen, on any number of hosts.

Sampling: the examples are shuffled once per epoch (a permutation seeded by
(seed, epoch)), cut into global batches, and the last partial batch of every
epoch is dropped. Each process takes its contiguous slice of the global batch:
rows [p * n, (p + 1) * n) with n = global_batch_size // process_count, so the
slices of all processes concatenate to the global batch.

Sources that decode one example at a time (`PerExampleSource`: JPEG images)
are read by worker processes when the dataset has `num_workers`: each worker
maps examples, and the batches are stacked from them in order, so the output
is the same as in-process, and the prefetch is counted in examples.

A batch that grows during training (DATE's growing mode) reads the same
epoch permutations as one stream instead (`stream_batch`): a batch is the
next `global_batch_size` examples from a position (examples served so far),
and runs on into the next epoch's permutation when the current one ends, so
every epoch serves each example exactly once whatever the batch sizes.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import gc
import itertools
import math
import os
import weakref
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Protocol

import numpy as np

from dateopt import epochs, extras
from dateopt.data import workers
from dateopt.data.augment import ShiftScaleNoise, augment_level
from dateopt.validation import check_choice, check_range, check_same_length, check_type

Batch = dict[str, np.ndarray]


class AugmentKey(NamedTuple):
  """What a source needs to augment a batch; None in its place asks for clean data.

  Each example's randomness comes from (seed, epoch, example index)
  (`example_rng`); `level` is "full" (training) or "weak" (`augment.AUGMENT_LEVELS`).
  """

  seed: int
  epoch: int
  level: str = "full"

TASKS = ("classification", "language_model")
LAYOUTS = ("image", "sequence")


def image_layout(images: np.ndarray, layout: str) -> np.ndarray:
  """Images (..., H, W, C) as given ("image") or as H steps of W * C features ("sequence").

  The "sequence" layout feeds an LSTM one image row per step (the MNIST-LSTM
  of You et al. 2019 reads 28 rows of 28 pixels).

  Example:
    >>> image_layout(np.zeros((5, 28, 28, 1)), "sequence").shape
    (5, 28, 28)
  """
  check_choice("layout", layout, LAYOUTS)
  if layout == "image":
    return images
  height, width, channels = images.shape[-3:]
  return images.reshape(images.shape[:-3] + (height, width * channels))


class ExampleSource(Protocol):
  """Random access to the preprocessed examples of one split.

  `gather(indices, augment_key)` returns {"inputs": (len(indices), ...),
  "labels": (len(indices), ...)}; with an `augment_key` it applies the random
  training augmentation, drawing example i's randomness from
  `example_rng(augment_key, i)`.
  """

  def __len__(self) -> int:
    ...

  def gather(self, indices: np.ndarray, augment_key: AugmentKey | None) -> Batch:
    ...


class PerExampleSource(ExampleSource, Protocol):
  """A source whose examples are prepared one at a time (decoding, cropping).

  `example(index, augment_key)` returns {"inputs": one example's input,
  "labels": its label}, the row `gather` would return for it. A `Dataset`
  with `num_workers` maps it in worker processes, so the source must pickle.

  A source that stands one record in for another it cannot read (`jpeg.JpegSource`
  with `max_undecodable_records`) adds `SKIPPED_KEY` to every example: the record it
  stands in for, or -1. In worker processes its count lives in the workers' copies, so
  the batches carry it back and `count_skipped(indices)` counts those records in this
  process (and raises past its bound); the key never reaches a batch.
  """

  def example(self, index: int, augment_key: AugmentKey | None) -> dict[str, Any]:
    ...


SKIPPED_KEY = "skipped_record"


@dataclasses.dataclass(frozen=True, eq=False)  # eq would compare arrays elementwise
class ArraySource:
  """An `ExampleSource` over in-memory arrays, optionally augmented per example.

  Example:
    >>> source = ArraySource(np.zeros((10, 3), np.float32), np.arange(10, dtype=np.int32))
    >>> source.gather(np.array([2, 5]), None)["labels"]
    array([2, 5], dtype=int32)
  """

  inputs: np.ndarray = dataclasses.field(repr=False)
  labels: np.ndarray = dataclasses.field(repr=False)
  augmentation: ShiftScaleNoise | None = None

  def __post_init__(self):
    check_same_length(inputs=self.inputs, labels=self.labels)

  def __len__(self) -> int:
    return len(self.labels)

  def gather(self, indices: np.ndarray, augment_key: AugmentKey | None) -> Batch:
    inputs = self.inputs[indices]
    if augment_key is not None and self.augmentation is not None and self.augmentation.enabled:
      inputs = np.stack([self.augmentation(x, example_rng(augment_key, i), augment_key.level)
                         for x, i in zip(inputs, indices)])
    return {"inputs": inputs, "labels": self.labels[indices]}


def example_rng(augment_key: tuple[int, int] | AugmentKey, index: int) -> np.random.Generator:
  """The augmentation RNG of one example: a function of (seed, epoch, example index) only.

  Example:
    >>> rng = example_rng((0, 3), 17)
  """
  seed, epoch = augment_key[:2]
  return np.random.default_rng((seed, epoch, int(index)))


@functools.lru_cache(maxsize=16)
def epoch_permutation(num_examples: int, seed: int, epoch: int) -> np.ndarray:
  """The example order of one epoch: a permutation seeded by (seed, epoch).

  Seeding with the pair (not seed + epoch) keeps (seed 0, epoch 1) and
  (seed 1, epoch 0) apart. Cached: a training epoch asks for it every step.

  Example:
    >>> epoch_permutation(5, seed=0, epoch=0).shape
    (5,)
  """
  order = np.random.default_rng((seed, epoch)).permutation(num_examples)
  order.flags.writeable = False
  return order


def process_rows(global_batch_size: int, process_index: int = 0,
                 process_count: int = 1) -> slice:
  """The rows of a global batch that belong to `process_index` (contiguous, equal sizes).

  Example:
    >>> process_rows(8, process_index=1, process_count=2)
    slice(4, 8, None)
  """
  check_type("global_batch_size", global_batch_size, int, what="a positive int")
  check_range("global_batch_size", global_batch_size, low=1)
  check_type("process_count", process_count, int, what="a positive int")
  check_range("process_count", process_count, low=1)
  check_type("process_index", process_index, int, what="an int in [0, process_count)")
  check_range("process_index", process_index, low=0, high=process_count, high_inclusive=False)
  if global_batch_size % process_count:
    raise ValueError(f"global_batch_size ({global_batch_size}) must be a multiple of "
                     f"process_count ({process_count}).")
  local = global_batch_size // process_count
  return slice(process_index * local, (process_index + 1) * local)


def map_in_order(fn: Callable[[int], Batch], start: int, stop: int | None, *,
                 num_threads: int) -> Iterator[Batch]:
  """Yields fn(start), fn(start + 1), ... (up to `stop`, or forever), in order.

  With `num_threads` > 0 the calls run ahead in a grain thread pool (grain is
  imported only then); with 0 they run inline, for in-memory data where a
  batch costs microseconds.
  """
  if num_threads == 0:
    steps = itertools.count(start) if stop is None else range(start, stop)
    return (fn(step) for step in steps)
  grain = extras.require("grain", extra="data")  # only pipelines that decode need it

  stop = np.iinfo(np.int64).max if stop is None else stop
  steps = grain.MapDataset.range(start, stop).map(fn)
  options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=2 * num_threads)
  return iter(steps.to_iter_dataset(options))


DEFAULT_PREFETCH_EXAMPLES = 512
EXAMPLES_PER_CHUNK = 32  # examples a worker sends at once


def default_num_workers() -> int:
  """Worker processes for per-example decoding: one per core this process may run on."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True, eq=False)
class ExampleAt:
  """Slot s of this process's example stream -> its example (picklable, for workers).

  Slot s is row s % n of this process's batch s // n (n = the per-process
  batch). `kind` says which stream: "steps" (epoch-aligned batches from step
  `start`), "stream" (a growing run's stream from position `start`) or "eval"
  (the eval split in order, padded with example 0 under mask 0). The example
  is the one `train_batch`, `stream_batch` or `eval_batches` puts in that row.
  """

  source: Any
  kind: str
  num_examples: int
  global_batch_size: int
  process_index: int = 0
  process_count: int = 1
  seed: int = 0
  level: str = "none"
  start: int = 0
  steps_per_epoch: int = 1

  def __call__(self, slot: int) -> dict[str, Any]:
    local = self.global_batch_size // self.process_count
    batch, row = divmod(int(slot), local)
    in_batch = self.process_index * local + row
    if self.kind == "eval":
      position = batch * self.global_batch_size + in_batch
      is_real = position < self.num_examples
      example = self.source.example(position if is_real else 0, None)
      example["mask"] = np.float32(is_real)
      return example
    if self.kind == "steps":
      epoch, step_in_epoch = divmod(self.start + batch, self.steps_per_epoch)
      offset = step_in_epoch * self.global_batch_size + in_batch
    else:
      epoch, offset = divmod(self.start + batch * self.global_batch_size + in_batch,
                             self.num_examples)
    index = epoch_permutation(self.num_examples, self.seed, epoch)[offset]
    key = None if self.level == "none" else AugmentKey(self.seed, epoch, self.level)
    return self.source.example(int(index), key)


@dataclasses.dataclass(frozen=True, eq=False)
class _ExampleChunk:
  """Chunk c: the examples of slots [c * size, (c + 1) * size), stacked (one transfer)."""

  example_at: ExampleAt
  size: int

  def __call__(self, chunk: int) -> Batch:
    stacked = {}
    try:
      for row, slot in enumerate(range(chunk * self.size, (chunk + 1) * self.size)):
        example = self.example_at(slot)
        if not stacked:
          stacked = {key: _shared_array((self.size,) + np.shape(value),
                                        np.asarray(value).dtype)
                     for key, value in example.items()}
        for key, value in example.items():
          stacked[key][row] = value  # the one copy: straight into the memory the batch reads
    except BaseException:
      # A chunk that is never sent frees its shared memory now, not the resource tracker
      # at exit (with a warning of leaked memory); the traceback keeps this frame alive.
      for array in stacked.values():
        getattr(array, "unlink_on_del", lambda: None)()
      stacked.clear()
      raise
    return stacked


def _shared_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
  """An array in shared memory, which grain hands to the main process without a copy."""
  # grain's public class: its workers send it as a name, not as bytes. A grain without it
  # still works (it copies a plain array into shared memory); tests/test_data_pipeline.py
  # fails loudly if a grain release drops it.
  shared = getattr(extras.require("grain.python", extra="data"), "SharedMemoryArray", None)
  if shared is None:
    return np.empty(shape, dtype)
  return shared(shape, dtype)


def _concatenate(chunks: list[Batch]) -> Batch:
  return {key: np.concatenate([chunk[key] for chunk in chunks]) for key in chunks[0]}


def map_examples_in_workers(example_at: ExampleAt, num_batches: int | None, *,
                            num_workers: int, prefetch_examples: int) -> Iterator[Batch]:
  """Batches of `example_at`'s examples, mapped one by one in `num_workers` processes.

  Each worker maps the examples of a chunk (`EXAMPLES_PER_CHUNK`, or fewer to
  divide the batch) and sends them stacked, through shared memory: one
  transfer per chunk rather than per example. The workers take the chunks in
  turn and the batches are assembled in order in a background thread, so the
  output is what an in-process map gives. About `prefetch_examples` examples
  wait in the workers' buffers, plus the batch being assembled and one more.
  """
  grain = extras.require("grain", extra="data")
  _parse_absl_flags()
  rows = example_at.global_batch_size // example_at.process_count
  chunk = math.gcd(rows, EXAMPLES_PER_CHUNK)
  stop = np.iinfo(np.int64).max if num_batches is None else num_batches * (rows // chunk)
  chunks = grain.MapDataset.range(0, stop).map(_ExampleChunk(example_at, chunk))
  chunks = chunks.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  buffered = max(1, prefetch_examples // (chunk * num_workers))  # chunks per worker
  chunks = chunks.mp_prefetch(grain.MultiprocessingOptions(
      num_workers=num_workers, per_worker_buffer_size=buffered),
      worker_init_fn=workers.exit_with_parent(os.getpid()))  # none outlives this process
  count = workers.ChunkCount(num_workers)
  batches = chunks.map(count).batch(rows // chunk, drop_remainder=True,
                                    batch_fn=_concatenate)
  return _WorkerBatches(iter(grain.experimental.ThreadPrefetchIterDataset(
      batches, prefetch_buffer_size=1)), example_at.source, count)


class _WorkerBatches:
  """The workers' batches: closed at their end, on an error or at exit, a dead worker named.

  grain's iterator stops its worker processes in `close`, and again when it
  is collected; collected during interpreter shutdown, after the modules its
  `close` needs, it prints errors. So an exhausted pass (an eval pass) or a
  failed one closes itself and lets go of grain's iterator, and an atexit hook
  does the same for the iterators still open. A worker that died (killed, out
  of memory) ends the iteration with a `WorkerDiedError` rather than grain's
  traceback, and the records the workers skipped are counted on `source`.
  """

  def __init__(self, iterator, source, count: workers.ChunkCount):
    self._iterator, self._source, self._count = iterator, source, count
    _OPEN_WORKER_ITERATORS.add(self)

  def __iter__(self):
    return self

  def __next__(self) -> Batch:
    try:
      batch = next(self._iterator)
      _count_skipped(batch, self._source)
    except StopIteration:
      self.close()
      raise
    except Exception as error:
      self.close()
      died = workers.dead_worker_error(error, self._count)
      if died is None:
        raise
      raise died from None  # grain's traceback of it shows only its own frames
    return batch

  def close(self) -> None:
    iterator, self._iterator = self._iterator, iter(())
    close = getattr(iterator, "close", None)
    if close is not None:
      close()


def _count_skipped(batch: Batch, source: Any) -> None:
  """Takes the workers' `SKIPPED_KEY` out of `batch` and counts its records on `source`."""
  skipped = batch.pop(SKIPPED_KEY, None)
  if skipped is not None and (skipped >= 0).any():
    source.count_skipped(skipped[skipped >= 0])


_OPEN_WORKER_ITERATORS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_worker_iterators() -> None:
  for iterator in list(_OPEN_WORKER_ITERATORS):
    iterator.close()
  # grain's closed iterators sit in reference cycles; collected now, they unlink the shared
  # memory they still hold before Python's resource tracker calls it leaked.
  gc.collect()


def _parse_absl_flags() -> None:
  """Grain's worker processes read absl flags: outside an absl app, take their defaults."""
  from absl import flags  # pylint: disable=g-import-not-at-top  (grain's own dependency)

  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


@dataclasses.dataclass(frozen=True, eq=False)  # eq would compare arrays elementwise
class Dataset:
  """A dataset for training and evaluation, with random-access batches.

  Attributes:
    name: the name `get_dataset` knows it by.
    task: "classification" or "language_model".
    num_classes: number of classes (the vocabulary size for a language model).
    input_shape: shape of one example's inputs (no batch axis).
    input_dtype: dtype of the inputs.
    train_source: random access to the training examples.
    eval_source: random access to the evaluation examples.
    num_threads: threads that prepare batches ahead in iterators (0: inline).
    num_workers: worker processes that prepare the examples of a
      `PerExampleSource` one by one (0: the source's `gather`, in this
      process, with `num_threads`).
    prefetch_examples: examples the workers prepare ahead, in all.
    input_normalization: (mean, std) per channel, for uint8 images that the
      model normalises on the accelerator (`ResNet.input_normalization`);
      None when the inputs are ready to use.
    metadata: dataset-specific facts (vocabulary, normalisation, files, ...).

  Example:
    >>> from dateopt.data import get_dataset
    >>> ds = get_dataset("digits")
    >>> batch = ds.train_batch(0, 32, seed=0)          # {"inputs", "labels"}
    >>> for eval_batch in ds.eval_batches(100):        # {"inputs", "labels", "mask"}
    ...   pass
  """

  name: str
  task: str
  num_classes: int
  input_shape: tuple[int, ...]
  input_dtype: np.dtype
  train_source: ExampleSource = dataclasses.field(repr=False)
  eval_source: ExampleSource = dataclasses.field(repr=False)
  num_threads: int = 0
  num_workers: int = 0
  prefetch_examples: int = DEFAULT_PREFETCH_EXAMPLES
  input_normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)

  def __post_init__(self):
    check_choice("task", self.task, TASKS)
    for name in ("num_threads", "num_workers"):
      check_type(name, getattr(self, name), int, what="a non-negative int")
      check_range(name, getattr(self, name), low=0)
    check_type("prefetch_examples", self.prefetch_examples, int, what="a positive int")
    check_range("prefetch_examples", self.prefetch_examples, low=1)

  def _in_workers(self, source: ExampleSource) -> bool:
    return self.num_workers > 0 and hasattr(source, "example")

  def _map_in_workers(self, example_at: ExampleAt, num_batches: int | None) -> Iterator[Batch]:
    return map_examples_in_workers(example_at, num_batches, num_workers=self.num_workers,
                                   prefetch_examples=self.prefetch_examples)

  @property
  def undecodable_records(self) -> int:
    """Records skipped so far because they do not decode (`max_undecodable_records`)."""
    sources = {id(source): source for source in (self.train_source, self.eval_source)}
    return sum(getattr(source, "undecodable_records", 0) for source in sources.values())

  @property
  def num_train_examples(self) -> int:
    return len(self.train_source)

  @property
  def num_eval_examples(self) -> int:
    return len(self.eval_source)

  @property
  def tokens_per_example(self) -> int | None:
    """Tokens one example trains on (a language model's window); None for classifiers.

    A text workload counts its data in tokens: examples x this.
    """
    return int(np.prod(self.input_shape)) if self.task == "language_model" else None

  def steps_per_epoch(self, global_batch_size: int) -> int:
    """Full global batches per epoch (the last partial batch is dropped).

    Raises:
      ValueError: if the batch is larger than the training set.
    """
    check_type("global_batch_size", global_batch_size, int, what="a positive int")
    check_range("global_batch_size", global_batch_size, low=1)
    if global_batch_size > self.num_train_examples:
      raise ValueError(f"global_batch_size ({global_batch_size}) exceeds the "
                       f"{self.num_train_examples} training examples of {self.name!r}.")
    return epochs.steps_per_epoch(self.num_train_examples, global_batch_size,
                                  drop_remainder=True)

  def train_batch(self, step: int, global_batch_size: int, *, seed: int, process_index: int = 0,
                  process_count: int = 1, augment: bool | str = True) -> Batch:
    """This process's slice of the training batch of global step `step`.

    Deterministic in (seed, step, global_batch_size, process): epoch
    `step // steps_per_epoch` uses the permutation seeded by (seed, epoch),
    and augmentation randomness comes from (seed, epoch, example index).

    Args:
      step: global step, >= 0.
      global_batch_size: examples per step over all processes.
      seed: data seed, >= 0.
      process_index: this process (`jax.process_index()`).
      process_count: number of processes (`jax.process_count()`).
      augment: True (or "full") the training augmentation; "weak" the same
        at a quarter of its magnitude; False (or "none") the evaluation-style
        preprocessing of the same training examples (Final Polishing).

    Returns:
      {"inputs": (global_batch_size // process_count, *input_shape),
       "labels": (global_batch_size // process_count, ...) int32}.
    """
    self._check_seed_and_step(seed, step)
    rows = process_rows(global_batch_size, process_index, process_count)
    epoch, step_in_epoch = divmod(step, self.steps_per_epoch(global_batch_size))
    order = epoch_permutation(self.num_train_examples, seed, epoch)
    indices = order[step_in_epoch * global_batch_size:(step_in_epoch + 1) * global_batch_size][rows]
    level = augment_level(augment)
    key = None if level == "none" else AugmentKey(seed, epoch, level)
    return self.train_source.gather(indices, key)

  def train_iterator(self, global_batch_size: int, *, seed: int, start_step: int = 0,
                     process_index: int = 0, process_count: int = 1, augment: bool | str = True,
                     num_steps: int | None = None) -> Iterator[Batch]:
    """Yields `train_batch(step, ...)` for step = start_step, start_step + 1, ...

    Endless unless `num_steps` is given. Batches are prepared ahead in
    `num_threads` threads when the dataset has any; the output is the same.
    """
    self._check_seed_and_step(seed, start_step)
    augment_level(augment)
    process_rows(global_batch_size, process_index, process_count)
    self.steps_per_epoch(global_batch_size)
    if num_steps is not None:
      check_type("num_steps", num_steps, int, what="a non-negative int or None")
      check_range("num_steps", num_steps, low=0)
    if self._in_workers(self.train_source):
      return self._map_in_workers(ExampleAt(
          self.train_source, "steps", self.num_train_examples, global_batch_size, process_index,
          process_count, seed, augment_level(augment), start_step,
          self.steps_per_epoch(global_batch_size)), num_steps)
    make_batch = functools.partial(self._train_batch_at, global_batch_size=global_batch_size,
                                   seed=seed, process_index=process_index,
                                   process_count=process_count, augment=augment)
    stop = None if num_steps is None else start_step + num_steps
    return map_in_order(make_batch, start_step, stop, num_threads=self.num_threads)

  def stream_batch(self, position: int, global_batch_size: int, *, seed: int,
                   process_index: int = 0, process_count: int = 1,
                   augment: bool | str = True) -> Batch:
    """This process's slice of the `global_batch_size` examples from `position` of the stream.

    The stream is the epoch permutations one after another: example
    `position + i` is `epoch_permutation(seed, epoch)[offset]` with
    (epoch, offset) = divmod(position + i, num_train_examples). A batch
    crossing an epoch's end takes the rest of that epoch and the start of
    the next, so nothing is skipped or repeated within an epoch whatever
    the batch sizes. Deterministic in (seed, position, batch size, process).

    Example:
      >>> from dateopt.data import get_dataset
      >>> ds = get_dataset("digits")
      >>> first = ds.stream_batch(0, 64, seed=0)
      >>> second = ds.stream_batch(64, 128, seed=0)   # the next 128 examples
    """
    self._check_seed_and_step(seed, position)
    rows = process_rows(global_batch_size, process_index, process_count)
    self.steps_per_epoch(global_batch_size)  # a batch larger than the data set is refused
    level = augment_level(augment)
    epoch_of, offset = np.divmod(position + np.arange(global_batch_size)[rows],
                                 self.num_train_examples)
    parts = []
    for epoch in np.unique(epoch_of):  # at most two: the batch is no larger than an epoch
      chosen = epoch_of == epoch
      indices = epoch_permutation(self.num_train_examples, seed, int(epoch))[offset[chosen]]
      key = None if level == "none" else AugmentKey(seed, int(epoch), level)
      parts.append(self.train_source.gather(indices, key))
    if len(parts) == 1:
      return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

  def stream_iterator(self, global_batch_size: int, *, seed: int, start_position: int = 0,
                      process_index: int = 0, process_count: int = 1,
                      augment: bool | str = True) -> Iterator[Batch]:
    """Yields `stream_batch` at start_position, start_position + B, ... (B: the batch), endless.

    A growing run opens a new one at its position when its batch changes.
    """
    self.stream_batch(start_position, global_batch_size, seed=seed,
                      process_index=process_index, process_count=process_count,
                      augment=augment)  # bad arguments fail here, not in a prefetch thread
    if self._in_workers(self.train_source):
      return self._map_in_workers(ExampleAt(
          self.train_source, "stream", self.num_train_examples, global_batch_size,
          process_index, process_count, seed, augment_level(augment), start_position), None)
    make_batch = lambda i: self.stream_batch(
        start_position + i * global_batch_size, global_batch_size, seed=seed,
        process_index=process_index, process_count=process_count, augment=augment)
    return map_in_order(make_batch, 0, None, num_threads=self.num_threads)

  def num_eval_batches(self, global_batch_size: int) -> int:
    """Global eval batches needed to cover every eval example once (last one padded)."""
    check_type("global_batch_size", global_batch_size, int, what="a positive int")
    check_range("global_batch_size", global_batch_size, low=1)
    return -(-self.num_eval_examples // global_batch_size)

  def eval_batches(self, global_batch_size: int, *, process_index: int = 0,
                   process_count: int = 1) -> Iterator[Batch]:
    """One pass over the eval split in order; every batch has "inputs", "labels", "mask".

    All batches are full-sized: the rows past the end of the split (in the
    last batch) repeat example 0 with mask 0.0; real rows have mask 1.0. Over
    all processes every eval example appears exactly once with mask 1.0.
    """
    process_rows(global_batch_size, process_index, process_count)
    if self._in_workers(self.eval_source):
      return self._map_in_workers(ExampleAt(
          self.eval_source, "eval", self.num_eval_examples, global_batch_size, process_index,
          process_count), self.num_eval_batches(global_batch_size))
    make_batch = functools.partial(self._eval_batch_at, global_batch_size=global_batch_size,
                                   process_index=process_index, process_count=process_count)
    return map_in_order(make_batch, 0, self.num_eval_batches(global_batch_size),
                        num_threads=self.num_threads)

  def _train_batch_at(self, step: int, **kwargs) -> Batch:
    return self.train_batch(step, **kwargs)

  def _eval_batch_at(self, batch_index: int, *, global_batch_size: int, process_index: int,
                     process_count: int) -> Batch:
    rows = process_rows(global_batch_size, process_index, process_count)
    positions = np.arange(batch_index * global_batch_size,
                          (batch_index + 1) * global_batch_size)[rows]
    is_real = positions < self.num_eval_examples
    batch = self.eval_source.gather(np.where(is_real, positions, 0), None)
    batch["mask"] = is_real.astype(np.float32)
    return batch

  @staticmethod
  def _check_seed_and_step(seed: int, step: int) -> None:
    check_type("seed", seed, (int, np.integer), what="a non-negative int")
    check_range("seed", seed, low=0)
    check_type("step", step, (int, np.integer), what="a non-negative int")
    check_range("step", step, low=0)
