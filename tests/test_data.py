"""Tests for dateopt.data: random access, sharding, eval padding, every dataset, image ops."""

import numpy as np
import pytest

from dateopt.data import (
    DATASET_NAMES,
    ArraySource,
    Dataset,
    get_dataset,
    image_layout,
    process_rows,
)
from dateopt.data import image_ops
import image_reference  # tests/image_reference.py: the decode-first pipeline
from import_isolation import assert_not_loaded  # tests/import_isolation.py

NUM_EXAMPLES = 103  # prime: no batch size divides it, so epochs drop a remainder


def _indexed_dataset(num_train=NUM_EXAMPLES, num_eval=37, num_threads=0) -> Dataset:
  """A dataset whose inputs are the example indices, so batches show which examples they hold."""
  def source(n, offset):
    return ArraySource(np.arange(offset, offset + n)[:, None], np.arange(n, dtype=np.int32) % 3)
  return Dataset(name="indexed", task="classification", num_classes=3, input_shape=(1,),
                 input_dtype=np.dtype(np.int64), train_source=source(num_train, 0),
                 eval_source=source(num_eval, 1000), num_threads=num_threads)


def _indices(batch):
  return batch["inputs"][:, 0]


def _assert_batches_equal(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])


# ---------------------------------------------------------------- sampling and sharding


def test_steps_per_epoch_drops_the_remainder():
  ds = _indexed_dataset()
  assert ds.steps_per_epoch(10) == 10
  assert ds.steps_per_epoch(103) == 1
  with pytest.raises(ValueError, match="exceeds the 103 training examples"):
    ds.steps_per_epoch(104)


def test_each_epoch_is_a_fresh_shuffle_without_repeats():
  ds = _indexed_dataset()
  batch_size, steps = 10, 10
  epochs = [np.concatenate([_indices(ds.train_batch(e * steps + s, batch_size, seed=3))
                            for s in range(steps)]) for e in range(3)]
  for epoch in epochs:
    assert len(np.unique(epoch)) == batch_size * steps  # no example twice in an epoch
    assert set(epoch) <= set(range(NUM_EXAMPLES))
  assert not np.array_equal(epochs[0], epochs[1])
  assert not np.array_equal(np.sort(epochs[0]), np.arange(100))  # shuffled, not the first 100


def test_batches_are_deterministic_in_the_seed():
  ds = _indexed_dataset()
  _assert_batches_equal(ds.train_batch(7, 16, seed=1), ds.train_batch(7, 16, seed=1))
  assert not np.array_equal(_indices(ds.train_batch(7, 16, seed=1)),
                            _indices(ds.train_batch(7, 16, seed=2)))
  # seed + epoch is not what seeds the shuffle: (seed 0, epoch 1) != (seed 1, epoch 0).
  steps = ds.steps_per_epoch(16)
  assert not np.array_equal(_indices(ds.train_batch(steps, 16, seed=0)),
                            _indices(ds.train_batch(0, 16, seed=1)))


@pytest.mark.parametrize("num_threads", [0, 2])
def test_iterator_yields_the_random_access_batches(num_threads):
  ds = _indexed_dataset(num_threads=num_threads)
  iterator = ds.train_iterator(16, seed=5, start_step=4, process_index=1, process_count=2)
  for step in range(4, 4 + 15):  # crosses two epoch boundaries (6 steps per epoch)
    _assert_batches_equal(next(iterator),
                          ds.train_batch(step, 16, seed=5, process_index=1, process_count=2))
  assert len(list(ds.train_iterator(16, seed=5, num_steps=3))) == 3


@pytest.mark.parametrize("process_count", [2, 4])
def test_process_slices_concatenate_to_the_global_batch(process_count):
  ds = _indexed_dataset()
  for step in (0, 5, 13):
    whole = ds.train_batch(step, 24, seed=0)
    parts = [ds.train_batch(step, 24, seed=0, process_index=p, process_count=process_count)
             for p in range(process_count)]
    for key in whole:
      np.testing.assert_array_equal(np.concatenate([part[key] for part in parts]), whole[key])


def test_process_rows_checks_its_arguments():
  assert process_rows(12, 2, 3) == slice(8, 12)
  with pytest.raises(ValueError, match="multiple of process_count"):
    process_rows(10, 0, 4)
  with pytest.raises(ValueError, match="process_index"):
    process_rows(8, 2, 2)
  with pytest.raises(ValueError, match="seed"):
    _indexed_dataset().train_batch(0, 8, seed=-1)
  with pytest.raises(ValueError, match="step"):
    _indexed_dataset().train_batch(-1, 8, seed=0)


@pytest.mark.parametrize("batch_size, process_count", [(8, 1), (8, 2), (37, 1), (64, 4), (5, 1)])
@pytest.mark.parametrize("num_threads", [0, 2])
def test_eval_covers_every_example_exactly_once(batch_size, process_count, num_threads):
  ds = _indexed_dataset(num_eval=37, num_threads=num_threads)
  seen = []
  for p in range(process_count):
    batches = list(ds.eval_batches(batch_size, process_index=p, process_count=process_count))
    assert len(batches) == -(-37 // batch_size)
    for batch in batches:
      assert set(batch) == {"inputs", "labels", "mask"}
      assert batch["mask"].dtype == np.float32
      assert len(batch["mask"]) == batch_size // process_count  # always full-sized
      seen.extend(_indices(batch)[batch["mask"] == 1.0])
  assert sorted(seen) == list(range(1000, 1037))


# ---------------------------------------------------------------- registry and errors


def test_unknown_dataset_lists_the_allowed_names():
  with pytest.raises(ValueError, match="mnist1d.*imagenet2012.*fake_images"):
    get_dataset("cifar10")
  assert set(DATASET_NAMES) == {"mnist1d", "digits", "mnist", "imagenet2012", "ptb",
                                "shakespeare", "text_files", "tfds_text", "fake_images"}


def test_bad_argument_names_the_field():
  with pytest.raises(ValueError, match="layout"):
    get_dataset("digits", layout="columns")
  with pytest.raises(ValueError, match="num_samples"):
    get_dataset("mnist1d", num_samples=0)


@pytest.mark.parametrize("name, kwargs, keyword", [
    ("digits", {"seq_len": 3}, "seq_len"),
    ("ptb", {"seqlen": 3}, "seqlen"),
    ("mnist", {"image_size": 28}, "image_size"),  # fails before any TFDS I/O
])
def test_unknown_keyword_is_pythons_own_type_error_naming_the_builder(name, kwargs, keyword):
  with pytest.raises(TypeError) as info:
    get_dataset(name, **kwargs)
  assert str(info.value) == f"build_{name}() got an unexpected keyword argument {keyword!r}"


def test_type_error_inside_a_builder_is_not_relabelled(monkeypatch):
  from dateopt.data import registry

  def builder(*, data_dir=None, seed=0):
    raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

  monkeypatch.setitem(registry._BUILDERS, "digits", builder)
  with pytest.raises(TypeError, match="^unsupported operand") as info:
    get_dataset("digits", seed=1)
  assert info.value.__cause__ is None


def test_missing_tfds_data_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match=f"'mnist'.*{tmp_path}"):
    get_dataset("mnist", data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match=f"'imagenet2012'.*{tmp_path}"):
    get_dataset("imagenet2012", data_dir=str(tmp_path))


# ---------------------------------------------------------------- offline data


def test_digits_split_range_and_layouts():
  ds = get_dataset("digits")
  assert (ds.num_train_examples, ds.num_eval_examples) == (1437, 360)
  assert ds.input_shape == (8, 8, 1) and ds.num_classes == 10
  batch = ds.train_batch(0, 64, seed=0)
  assert batch["inputs"].shape == (64, 8, 8, 1) and batch["inputs"].dtype == np.float32
  assert batch["labels"].dtype == np.int32
  train = ds.train_source.inputs
  assert train.min() == 0.0 and train.max() == 1.0
  # Stratified: every class has about a fifth of its images in the test split.
  counts = np.bincount(ds.eval_source.labels, minlength=10)
  assert counts.min() >= 35 and counts.max() <= 37
  sequence = get_dataset("digits", layout="sequence")
  assert sequence.input_shape == (8, 8)
  np.testing.assert_array_equal(sequence.train_source.inputs, train[..., 0])


def test_mnist1d_generates_once_then_reads_the_cache(tmp_path, monkeypatch):
  import mnist1d.data

  numpy_state = np.random.get_state()
  ds = get_dataset("mnist1d", num_samples=300, seed=7, cache_dir=str(tmp_path))
  assert ds.metadata["from_cache"] is False
  # The package reseeds numpy's global RNG; get_dataset puts it back.
  assert np.array_equal(np.random.get_state()[1], numpy_state[1])
  assert (ds.num_train_examples, ds.num_eval_examples) == (240, 60)  # the package's 80/20 split
  assert ds.input_shape == (40, 1) and ds.input_dtype == np.float32
  # Same arrays as the package's own generator with its default arguments.
  args = mnist1d.data.get_dataset_args()
  args.num_samples, args.seed = 300, 7
  reference = mnist1d.data.make_dataset(args)
  np.random.set_state(numpy_state)
  np.testing.assert_allclose(ds.train_source.inputs[..., 0], reference["x"], rtol=1e-6)
  np.testing.assert_array_equal(ds.eval_source.labels, reference["y_test"])

  def no_generation(*args, **kwargs):
    raise AssertionError("generated again despite the cache")

  monkeypatch.setattr(mnist1d.data, "make_dataset", no_generation)
  cached = get_dataset("mnist1d", data_dir=str(tmp_path), num_samples=300, seed=7)
  assert cached.metadata["from_cache"] is True
  np.testing.assert_array_equal(cached.train_source.inputs, ds.train_source.inputs)
  batch = cached.train_batch(3, 32, seed=0)
  assert batch["inputs"].shape == (32, 40, 1) and batch["labels"].dtype == np.int32


def test_fake_images_are_cheap_and_deterministic():
  ds = get_dataset("fake_images", image_shape=(16, 16, 3), num_classes=10)
  assert ds.num_train_examples == 1_281_167
  batch = ds.train_batch(123_456, 32, seed=0)
  assert batch["inputs"].shape == (32, 16, 16, 3) and batch["inputs"].dtype == np.float32
  assert batch["labels"].max() < 10
  _assert_batches_equal(batch, ds.train_batch(123_456, 32, seed=0))


# ---------------------------------------------------------------- PTB


def _write_ptb(directory, prefix="ptb.", valid=" c a \n b \n"):
  directory.mkdir(parents=True, exist_ok=True)
  (directory / f"{prefix}train.txt").write_text(" a b c \n b c \n c \n")
  (directory / f"{prefix}valid.txt").write_text(valid)
  (directory / f"{prefix}test.txt").write_text(" b \n")
  return directory


def test_ptb_vocabulary_windows_and_next_token_labels(tmp_path):
  ds = get_dataset("ptb", data_dir=str(_write_ptb(tmp_path / "ptb")), seq_len=2)
  # Counts: c 3, <eos> 3, b 2, a 1; ties alphabetical.
  assert ds.metadata["vocabulary"] == ("<eos>", "c", "b", "a")
  assert ds.num_classes == 4 and ds.task == "language_model"
  # Stream a b c <eos> b c <eos> c <eos> = 3 2 1 0 2 1 0 1 0: four windows of two.
  batch = ds.train_batch(0, 4, seed=0)
  assert batch["inputs"].dtype == np.int32 and batch["inputs"].shape == (4, 2)
  rows = sorted(zip(map(tuple, batch["inputs"]), map(tuple, batch["labels"])))
  assert rows == sorted([((3, 2), (2, 1)), ((1, 0), (0, 2)), ((2, 1), (1, 0)), ((0, 1), (1, 0))])


def test_ptb_out_of_vocabulary_words(tmp_path):
  directory = _write_ptb(tmp_path / "no_unk", valid=" c a \n zz b \n")
  with pytest.raises(ValueError, match="zz"):
    get_dataset("ptb", data_dir=str(directory), seq_len=2)
  (directory / "ptb.train.txt").write_text(" a b c <unk> \n b c \n")
  ds = get_dataset("ptb", data_dir=str(directory), seq_len=3)
  vocabulary = ds.metadata["vocabulary"]
  eval_batch = next(ds.eval_batches(2))
  # valid: c a <eos> <unk>(zz) b <eos>: seq_len 3 -> one window (5 // 3).
  assert ds.num_eval_examples == 1
  assert [vocabulary[i] for i in eval_batch["inputs"][0]] == ["c", "a", "<eos>"]
  assert [vocabulary[i] for i in eval_batch["labels"][0]] == ["a", "<eos>", "<unk>"]
  assert eval_batch["mask"].tolist() == [1.0, 0.0]


def test_ptb_plain_file_names_test_split_and_missing_files(tmp_path):
  ds = get_dataset("ptb", data_dir=str(_write_ptb(tmp_path / "plain", prefix="")), seq_len=1,
                   eval_split="test")
  assert ds.metadata["eval_file"].endswith("test.txt") and ds.num_eval_examples == 1
  with pytest.raises(FileNotFoundError, match=f"ptb.*{tmp_path / 'empty'}"):
    get_dataset("ptb", data_dir=str(tmp_path / "empty"))
  with pytest.raises(FileNotFoundError, match="ptb needs data_dir"):
    get_dataset("ptb")


# ---------------------------------------------------------------- TFDS (mock data)


@pytest.fixture()
def mock_tfds():
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=12):
    yield tfds


def test_mnist_from_tfds_mock_data(mock_tfds):
  ds = get_dataset("mnist")
  records = mock_tfds.data_source("mnist", split="test", download=False)
  assert (ds.num_train_examples, ds.num_eval_examples, ds.num_classes) == (12, 12, 10)
  batches = list(ds.eval_batches(8))
  inputs = np.concatenate([b["inputs"] for b in batches])[:12]
  labels = np.concatenate([b["labels"] for b in batches])[:12]
  assert inputs.shape == (12, 28, 28, 1) and inputs.dtype == np.float32
  np.testing.assert_allclose(inputs, np.stack([r["image"] for r in records]) / 255.0, rtol=1e-6)
  np.testing.assert_array_equal(labels, [r["label"] for r in records])
  iterator = ds.train_iterator(4, seed=1)  # grain threads
  for step in range(5):
    _assert_batches_equal(next(iterator), ds.train_batch(step, 4, seed=1))
  sequence = get_dataset("mnist", layout="sequence")
  assert sequence.train_batch(0, 4, seed=0)["inputs"].shape == (4, 28, 28)


# imagenet2012 reads encoded JPEGs (tfds decoding skipped), which tfds's mock data cannot
# give without TensorFlow: tests/test_jpeg_pipeline.py covers it with a patched data_source.


# ---------------------------------------------------------------- image ops


def test_inception_crop_boxes_respect_area_and_aspect():
  for seed in range(200):
    rng = np.random.default_rng(seed)
    top, left, height, width = image_ops.sample_inception_crop(375, 500, rng)
    assert 0 <= top and top + height <= 375 and 0 <= left and left + width <= 500
    area = height * width / (375 * 500)
    assert 0.08 - 0.01 <= area <= 1.0
    assert 3 / 4 - 0.02 <= width / height <= 4 / 3 + 0.02


def test_inception_crop_falls_back_to_a_clamped_center_crop():
  rng = np.random.default_rng(0)
  assert image_ops.sample_inception_crop(10, 1000, rng, attempts=0) == (0, 493, 10, 13)
  assert image_ops.sample_inception_crop(300, 400, rng, attempts=0) == (0, 0, 300, 400)
  image = np.arange(10 * 1000 * 3, dtype=np.uint8).reshape(10, 1000, 3)
  assert image_reference.inception_crop(image, 24, rng).shape == (24, 24, 3)


def test_flip_center_crop_resize_and_normalize():
  image = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
  flips = [not np.array_equal(image_ops.random_flip_left_right(image, np.random.default_rng(s)),
                              image) for s in range(400)]
  assert 0.4 < np.mean(flips) < 0.6
  flipped = next(image_ops.random_flip_left_right(image, np.random.default_rng(s))
                 for s in range(400) if flips[s])
  np.testing.assert_array_equal(flipped, image[:, ::-1])
  np.testing.assert_array_equal(image_reference.center_crop(image, 20), image[5:25, 10:30])
  assert image_reference.resize_shorter_side(image, 15).shape == (15, 20, 3)
  normalized = image_reference.normalize(image)
  np.testing.assert_allclose(normalized[2, 3, 1], (image[2, 3, 1] - 0.456 * 255) / (0.224 * 255),
                             rtol=1e-5)
  gray = image[..., :1]
  assert image_reference.crop_and_resize(gray, (0, 0, 30, 30), 8).shape == (8, 8, 1)
  assert image_layout(np.zeros((2, 28, 28, 1)), "sequence").shape == (2, 28, 28)


# ---------------------------------------------------------------- layering


def test_offline_data_loads_neither_tfds_nor_grain_nor_models():
  assert_not_loaded("from dateopt.data import get_dataset; ds = get_dataset('digits'); "
                    "list(ds.train_iterator(32, seed=0, num_steps=2))",
                    ("tensorflow", "tensorflow_datasets", "grain", "flax"),
                    ("dateopt.models", "dateopt.train"))


def test_worker_batches_use_grains_public_shared_memory_array():
  # The workers hand batches over as grain's SharedMemoryArray (a name, not a copy of the
  # bytes); a grain release that drops it from `grain.python` fails here, not silently slower.
  from grain import python as grain_python  # pylint: disable=import-outside-toplevel
  from dateopt.data import base  # pylint: disable=import-outside-toplevel
  array = base._shared_array((2, 3), np.dtype(np.float32))  # pylint: disable=protected-access
  try:
    assert isinstance(array, grain_python.SharedMemoryArray)
    assert array.shape == (2, 3) and array.dtype == np.float32
  finally:
    array.unlink_on_del()
