"""The JPEG pipeline: crops decoded at their scale, worker processes, uint8 inputs
normalised by the model, and the trainer's device prefetch."""

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

simplejpeg = pytest.importorskip("simplejpeg")

from dateopt import models  # noqa: E402
from dateopt.data import ArraySource, Dataset, get_dataset, image_ops, jpeg  # noqa: E402
from dateopt.data.base import epoch_permutation  # noqa: E402
from dateopt.train import parallel  # noqa: E402
from dateopt.train.feed import TrainFeed  # noqa: E402
import image_reference  # noqa: E402  tests/image_reference.py: the decode-first pipeline


def _photo(height, width, seed, blob=8):
  """A smooth random colour field with some noise: a JPEG that compresses like a photo."""
  rng = np.random.default_rng(seed)
  coarse = rng.uniform(0, 255, (height // blob + 2, width // blob + 2, 3)).astype(np.uint8)
  image = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), np.float32)
  return np.clip(image + rng.normal(0, 4, image.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def jpeg_records():
  sizes = [(75, 100), (100, 75), (60, 60), (90, 120)] * 6  # 24 images, some portrait
  return [{"image": simplejpeg.encode_jpeg(_photo(h, w, seed), quality=90), "label": seed % 5}
          for seed, (h, w) in enumerate(sizes)]


@pytest.fixture(scope="module")
def jpeg_files(tmp_path_factory, jpeg_records):
  directory = tmp_path_factory.mktemp("jpegs")
  paths = []
  for index, record in enumerate(jpeg_records):
    paths.append(str(directory / f"{index}.jpg"))
    with open(paths[-1], "wb") as file:
      file.write(record["image"])
  return jpeg.JpegFiles(tuple(paths), tuple(r["label"] for r in jpeg_records))


def _bilinear(image, size):
  """Independent reference: bilinear at pixel centres (no antialiasing), in float64 numpy."""
  def taps(n_in):
    centres = np.clip((np.arange(size) + 0.5) * n_in / size - 0.5, 0, n_in - 1)
    low = np.floor(centres).astype(int)
    return low, np.minimum(low + 1, n_in - 1), centres - low
  top, bottom, dy = taps(image.shape[0])
  left, right, dx = taps(image.shape[1])
  image = image.astype(float)
  rows = image[top] * (1 - dy)[:, None, None] + image[bottom] * dy[:, None, None]
  return rows[:, left] * (1 - dx)[None, :, None] + rows[:, right] * dx[None, :, None]


def _full_decode(data):
  return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_a_crop_that_cannot_be_reduced_is_the_full_decode_resized_bilinearly(jpeg_records):
  data = jpeg_records[0]["image"]  # 75 x 100: every box is under 2 x 48 on a side
  full = _full_decode(data)
  for top, left, height, width in [(0, 0, 75, 75), (10, 20, 40, 50), (0, 0, 75, 100)]:
    expected = _bilinear(full[top:top + height, left:left + width], 48)
    got = jpeg.decode_box(data, (top, left, height, width), 48)
    assert got.dtype == np.uint8 and got.shape == (48, 48, 3)
    # OpenCV's weights are 11-bit fixed point: within one level of the exact value.
    assert np.abs(got - expected).max() <= 1.0


def _box_average(image, factor):
  height, width = image.shape[0] // factor, image.shape[1] // factor
  image = image[:height * factor, :width * factor].astype(float)
  return image.reshape(height, factor, width, factor, -1).mean(axis=(1, 3))


def test_a_large_crop_is_decoded_reduced_in_the_dct_as_a_box_average_would(jpeg_records,
                                                                           monkeypatch):
  data = jpeg_records[3]["image"]  # 90 x 120: a 16-pixel output allows a 1/4 decode
  decoded = []
  real = jpeg._decode_at_least
  monkeypatch.setattr(jpeg, "_decode_at_least",
                      lambda *args: decoded.append(real(*args)) or decoded[-1])
  patch = jpeg.decode_box(data, (0, 0, 88, 120), 16)
  assert decoded[0].shape == (23, 30, 3)  # ceil(90 / 4) x ceil(120 / 4)
  # libjpeg-turbo's 1/4 scale is close to averaging 4 x 4 blocks of the full decode.
  expected = _bilinear(_box_average(_full_decode(data), 4), 16)
  assert np.abs(patch - expected).mean() < 1.0


def test_eval_box_is_what_resize_then_center_crop_keeps():
  # 375 x 500 -> 256 x 341 (scale 256/375); the 224 crop starts at (16, 58) there, which is
  # (16 * 375/256, 58 * 500/341) = (23.4, 85.0) in the full image, 224 * 375/256 = 328.1 tall
  # and 224 * 500/341 = 328.4 wide.
  assert jpeg.eval_box(375, 500, 224) == (23, 85, 328, 328)
  # Portrait: 500 x 375 -> 341 x 256; the crop starts at (58, 16).
  assert jpeg.eval_box(500, 375, 224) == (85, 23, 328, 328)
  assert all(isinstance(value, int) for value in jpeg.eval_box(333, 517, 224))


@pytest.mark.parametrize("size", [64, 96])  # a 1/2 decode at 64, the full decode at 96
def test_the_eval_crop_matches_the_array_pipeline_it_replaces(size):
  data = simplejpeg.encode_jpeg(_photo(150, 200, 0, blob=24), quality=95)
  pixels = simplejpeg.decode_jpeg(data, colorspace="RGB")
  old = image_reference.center_crop(image_reference.resize_shorter_side(
      pixels, image_ops.eval_resize_size(size)), size).astype(float)
  new = jpeg.eval_crop(data, size)
  assert new.dtype == np.uint8 and new.shape == (size, size, 3)
  # One resize instead of two, the box on whole pixels of the decode: the two differ by far
  # less than the old crop moved by one pixel.
  one_pixel_off = np.abs(old[1:, 1:] - old[:-1, :-1]).mean()
  assert np.abs(new - old).mean() < 0.5 * one_pixel_off


def test_train_crops_are_reproducible_from_the_rng_and_flip_half_the_time(jpeg_records):
  data = jpeg_records[1]["image"]
  first = jpeg.train_crop(data, 24, np.random.default_rng(5))
  np.testing.assert_array_equal(first, jpeg.train_crop(data, 24, np.random.default_rng(5)))
  # The same draws as the array pipeline: box, then flip.
  rng = np.random.default_rng(5)
  box = image_ops.sample_inception_crop(100, 75, rng)
  expected = jpeg.decode_box(data, box, 24)
  expected = expected[:, ::-1] if rng.random() < 0.5 else expected
  np.testing.assert_array_equal(first, expected)


def test_cmyk_and_png_bytes_fall_back_to_pil():
  cmyk = io.BytesIO()
  Image.fromarray(_photo(40, 50, 0)).convert("CMYK").save(cmyk, "JPEG")
  png = io.BytesIO()
  Image.fromarray(_photo(40, 50, 1)).save(png, "PNG")
  for data in (cmyk.getvalue(), png.getvalue()):
    assert jpeg.image_size(data) == (40, 50)
    assert jpeg.eval_crop(data, 16).shape == (16, 16, 3)


def _jpeg_dataset(files, num_workers):
  source = jpeg.JpegSource(files, image_size=16)
  return Dataset("jpegs", "classification", 5, (16, 16, 3), np.dtype(np.uint8), source, source,
                 num_workers=num_workers, prefetch_examples=8)


def _take(iterator, count):
  batches = [next(iterator) for _ in range(count)]
  iterator.close()
  return batches


def _assert_same_batches(left, right):
  assert len(left) == len(right)
  for a, b in zip(left, right):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.slow  # starts worker processes (~10 s)
def test_worker_processes_serve_exactly_the_in_process_batches(jpeg_files):
  inline, workers = _jpeg_dataset(jpeg_files, 0), _jpeg_dataset(jpeg_files, 2)
  where = dict(seed=3, process_index=1, process_count=2)
  # Epoch-aligned steps from step 2 (crossing an epoch: 24 // 8 = 3 steps each).
  _assert_same_batches(_take(inline.train_iterator(8, start_step=2, **where), 3),
                       _take(workers.train_iterator(8, start_step=2, **where), 3))
  # A growing run's stream from position 20, across the epoch's end.
  _assert_same_batches(_take(inline.stream_iterator(12, start_position=20, **where), 3),
                       _take(workers.stream_iterator(12, start_position=20, **where), 3))
  # The eval pass, padded at its end, and the clean training crops of Final Polishing.
  _assert_same_batches(list(inline.eval_batches(10, process_index=1, process_count=2)),
                       list(workers.eval_batches(10, process_index=1, process_count=2)))
  _assert_same_batches(_take(inline.train_iterator(8, seed=0, augment=False), 2),
                       _take(workers.train_iterator(8, seed=0, augment=False), 2))


def test_the_in_process_batch_is_the_examples_of_the_epoch_permutation(jpeg_files):
  ds = _jpeg_dataset(jpeg_files, 0)
  batch = ds.train_batch(1, 8, seed=4)
  indices = epoch_permutation(24, 4, 0)[8:16]
  assert batch["inputs"].dtype == np.uint8 and batch["labels"].dtype == np.int32
  np.testing.assert_array_equal(batch["labels"], [jpeg_files[int(i)]["label"] for i in indices])
  key = ds.train_source.example(int(indices[0]), None)
  np.testing.assert_array_equal(ds.train_batch(1, 8, seed=4, augment=False)["inputs"][0],
                                key["inputs"])


def test_imagenet_reads_encoded_jpegs_from_tfds(monkeypatch, jpeg_records):
  tfds = pytest.importorskip("tensorflow_datasets")
  calls = []

  def data_source(name, *, split, data_dir, download, decoders):
    calls.append((name, split, type(decoders["image"]).__name__))
    return jpeg_records if split == "train" else jpeg_records[:10]

  monkeypatch.setattr(tfds, "data_source", data_source)
  ds = get_dataset("imagenet2012", image_size=32, num_workers=0)
  assert calls == [("imagenet2012", "train", "SkipDecoding"),
                   ("imagenet2012", "validation", "SkipDecoding")]
  assert ds.input_dtype == np.uint8 and ds.input_shape == (32, 32, 3)
  mean, std = ds.input_normalization
  np.testing.assert_allclose(mean, np.array([0.485, 0.456, 0.406]) * 255, rtol=1e-6)
  np.testing.assert_allclose(std, np.array([0.229, 0.224, 0.225]) * 255, rtol=1e-6)
  eval_batch = next(ds.eval_batches(4))
  np.testing.assert_array_equal(eval_batch["inputs"][1], jpeg.eval_crop(jpeg_records[1]["image"],
                                                                       32))
  with pytest.raises(ValueError, match="num_workers"):
    get_dataset("imagenet2012", num_workers=-1)


def test_the_model_normalises_uint8_images_as_the_host_used_to():
  mean, std = tuple(image_ops.IMAGENET_MEAN.tolist()), tuple(image_ops.IMAGENET_STD.tolist())
  on_device = models.create_model("resnet_tiny", input_normalization=(mean, std))
  on_host = models.create_model("resnet_tiny")
  pixels = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
  variables = on_host.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))
  expected = on_host.apply(variables, image_reference.normalize(pixels))
  np.testing.assert_allclose(on_device.apply(variables, pixels), expected, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="input_normalization"):
    models.create_model("resnet_tiny", input_normalization=((1.0,), (0.0,)))


def test_the_feed_sends_the_next_batch_ahead_and_drops_it_on_a_new_rung(mesh8, monkeypatch):
  ds = get_dataset("digits")
  sent = []
  real = parallel.global_batch
  monkeypatch.setattr(parallel, "global_batch",
                      lambda batch, mesh: sent.append(len(batch["labels"])) or real(batch, mesh))
  feed = TrainFeed(ds, mesh8, seed=0, batch_size=16, grows=True)
  first = feed.next()
  assert sent == [16, 16] and feed.position == 16  # this step's batch and the next
  assert first["inputs"].sharding.spec == parallel.batch_sharded(mesh8).spec
  np.testing.assert_array_equal(np.asarray(first["labels"]),
                                ds.stream_batch(0, 16, seed=0)["labels"])
  feed.resize(32)  # the batch sent ahead at 16 is never served
  second = feed.next()
  np.testing.assert_array_equal(np.asarray(second["labels"]),
                                ds.stream_batch(16, 32, seed=0)["labels"])
  assert feed.position == 48
  feed.close()


def test_fake_images_can_be_uint8_as_the_imagenet_pipeline_sends_them():
  ds = get_dataset("fake_images", image_shape=(8, 8, 3), num_classes=3, uint8=True)
  batch = ds.train_batch(0, 4, seed=0)
  assert batch["inputs"].dtype == np.uint8 and ds.input_dtype == np.uint8
  assert ds.input_normalization == image_ops.IMAGENET_NORMALIZATION
  assert get_dataset("fake_images", image_shape=(8, 8, 3)).input_normalization is None
  with pytest.raises(TypeError, match="uint8 must be True or False"):
    get_dataset("fake_images", uint8="yes")


def test_records_and_arrays_of_unequal_length_are_refused_naming_both():
  with pytest.raises(ValueError, match=r"^paths \(2\) and labels \(1\) differ in length\.$"):
    jpeg.JpegFiles(("a.jpg", "b.jpg"), (0,))
  with pytest.raises(ValueError, match=r"^inputs \(3\) and labels \(2\) differ in length\.$"):
    ArraySource(np.zeros((3, 2)), np.zeros(2, np.int32))
