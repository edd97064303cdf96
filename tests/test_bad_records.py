"""Undecodable JPEG records: one error naming the record, or a bounded skip that is counted.

The records go through `get_dataset("imagenet2012")` (tfds's data source faked) and come
out of the batches a training run reads, in this process and in worker processes.
"""

import logging
import pickle
import types

import numpy as np
import pytest
from PIL import Image

simplejpeg = pytest.importorskip("simplejpeg")
tfds = pytest.importorskip("tensorflow_datasets")

from dateopt.data import UndecodableRecordError, WorkerDiedError, get_dataset, jpeg  # noqa: E402
from dateopt.data.base import epoch_permutation  # noqa: E402

SIZE = 16
NUM_TRAIN = 24
BATCH = 8
BAD = {5: "truncated", 11: "empty", 12: "random"}  # 11 and 12 in a row: 11 stands in for 13
DECODER_SAYS = {"truncated": "Premature end of JPEG file", "empty": "empty (0 bytes)",
                "random": "cannot identify image file"}


def _encoded(seed):
  """A real JPEG of a smooth random colour field (60 x 80)."""
  coarse = np.random.default_rng(seed).uniform(0, 255, (9, 12, 3)).astype(np.uint8)
  return simplejpeg.encode_jpeg(np.asarray(Image.fromarray(coarse).resize((80, 60))), quality=90)


def _bad(kind):
  data = _encoded(99)
  return {"truncated": data[:len(data) // 2], "empty": b"",
          "random": np.random.default_rng(7).bytes(len(data))}[kind]


def _records(bad):
  """Train records labelled by their index; `bad` maps indices to kinds of broken bytes."""
  return [{"image": _bad(bad[i]) if i in bad else _encoded(i), "label": i}
          for i in range(NUM_TRAIN)]


def _imagenet(monkeypatch, train, *, num_workers=0, evaluation=None, **kwargs):
  evaluation = evaluation or [{"image": _encoded(100 + i), "label": i} for i in range(6)]
  monkeypatch.setattr(tfds, "data_source",
                      lambda name, *, split, **_: train if split == "train" else evaluation)
  return get_dataset("imagenet2012", image_size=SIZE, num_workers=num_workers,
                     prefetch_examples=8, **kwargs)


def _epoch(ds, epochs=1):
  batches = ds.train_iterator(BATCH, seed=0, augment=False,
                              num_steps=epochs * NUM_TRAIN // BATCH)
  try:
    return list(batches)
  finally:
    batches.close()


def _check_names_the_record(error, index, kind, split="train"):
  assert isinstance(error, UndecodableRecordError) and not isinstance(error, OSError)
  message = str(error)
  assert "\n" not in message
  for part in ("imagenet2012", f"split {split!r}", f"record {index}", DECODER_SAYS[kind],
               "max_undecodable_records", "Fix or remove the record"):
    assert part in message, message
  assert "_io.BytesIO" not in message  # PIL's object address says nothing about the record
  assert (error.dataset, error.split, error.index, error.exit_code) == (
      "imagenet2012", split, index, 1)
  copy = pickle.loads(pickle.dumps(error))  # how it crosses from a worker process
  assert str(copy) == message and copy.index == index


@pytest.mark.parametrize("kind", ["truncated", "empty", "random"])
def test_an_undecodable_record_stops_the_run_naming_it(monkeypatch, kind):
  ds = _imagenet(monkeypatch, _records({5: kind}))
  with pytest.raises(UndecodableRecordError) as caught:
    _epoch(ds)
  _check_names_the_record(caught.value, 5, kind)


def test_an_undecodable_eval_record_names_its_split(monkeypatch):
  evaluation = [{"image": _encoded(100 + i), "label": i} for i in range(6)]
  evaluation[3]["image"] = _bad("truncated")
  ds = _imagenet(monkeypatch, _records({}), evaluation=evaluation)
  with pytest.raises(UndecodableRecordError) as caught:
    list(ds.eval_batches(4))
  _check_names_the_record(caught.value, 3, "truncated", split="validation")


@pytest.mark.slow  # starts worker processes
def test_an_undecodable_record_in_a_worker_stops_the_run_naming_it(monkeypatch):
  ds = _imagenet(monkeypatch, _records({5: "truncated"}), num_workers=2)
  with pytest.raises(UndecodableRecordError) as caught:
    _epoch(ds)
  _check_names_the_record(caught.value, 5, "truncated")


def _stand_in(index):
  """The record that serves for `index`: the next decodable one."""
  while index in BAD:
    index = (index + 1) % NUM_TRAIN
  return index


def _check_replaced(batches, records):
  order = epoch_permutation(NUM_TRAIN, 0, 0)
  for step, batch in enumerate(batches):
    for row, index in enumerate(order[step * BATCH:(step + 1) * BATCH]):
      served = _stand_in(int(index))
      assert batch["labels"][row] == served
      np.testing.assert_array_equal(batch["inputs"][row],
                                    jpeg.eval_crop(records[served]["image"], SIZE))


def test_skipped_records_are_replaced_by_the_next_decodable_one_and_counted(monkeypatch,
                                                                           caplog):
  records = _records(BAD)
  ds = _imagenet(monkeypatch, records, max_undecodable_records=3)
  with caplog.at_level(logging.WARNING):
    batches = _epoch(ds, epochs=2)  # the second epoch meets the same three again
  _check_replaced(batches[:NUM_TRAIN // BATCH], records)
  assert ds.undecodable_records == ds.train_source.undecodable_records == 3
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  for index, kind in BAD.items():  # one line per record, naming it and the decoder's error
    named = [w for w in warnings if f"record {index} " in w]
    assert len(named) == 1 and DECODER_SAYS[kind] in named[0] and "imagenet2012" in named[0]
  assert "replaced by record 6" in next(w for w in warnings if "record 5 " in w)


def test_one_record_past_the_bound_stops_the_run(monkeypatch):
  ds = _imagenet(monkeypatch, _records(BAD), max_undecodable_records=2)
  with pytest.raises(UndecodableRecordError, match="max_undecodable_records=2") as caught:
    _epoch(ds)
  assert caught.value.index in BAD and "3 undecodable records" in str(caught.value)
  with pytest.raises(ValueError, match="max_undecodable_records"):
    _imagenet(monkeypatch, _records({}), max_undecodable_records=-1)


@pytest.mark.slow  # starts worker processes
def test_workers_skip_the_same_records_and_the_dataset_counts_them(monkeypatch):
  records = _records(BAD)
  ds = _imagenet(monkeypatch, records, num_workers=2, max_undecodable_records=3)
  _check_replaced(_epoch(ds), records)
  assert ds.undecodable_records == 3  # reported by the workers, counted here
  bounded = _imagenet(monkeypatch, records, num_workers=2, max_undecodable_records=2)
  with pytest.raises(UndecodableRecordError, match="max_undecodable_records=2"):
    _epoch(bounded)


@pytest.mark.parametrize("stop", [
    UndecodableRecordError("imagenet2012", "train", 5, reason="libjpeg-turbo: Premature end"),
    WorkerDiedError(0, 2, -9)], ids=["undecodable", "worker_died"])
def test_dateopt_train_says_a_data_stop_in_one_line_with_status_1(stop, capsys, monkeypatch):
  """Neither is an OSError: the CLI used to answer a bad record as a full disk."""
  from dateopt import cli

  def stopped(config, workdir):
    raise stop

  monkeypatch.setattr(cli, "FLAGS", types.SimpleNamespace(config=None, workdir="/tmp/run"))
  status = cli._train_and_report(types.SimpleNamespace(
      train_and_evaluate=stopped, StartupError=type("E1", (Exception,), {}),
      Preempted=type("E2", (BaseException,), {}), NonFiniteError=type("E3", (Exception,), {}),
      DivergedError=type("E4", (Exception,), {})))
  assert status == 1
  line = capsys.readouterr().err
  assert line == f"dateopt-train: {' '.join(str(stop).split())}\n"
  assert "Free space" not in line and "rerun the same command to resume" in line
